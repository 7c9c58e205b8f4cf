"""The adapters: bytes on a connection <-> the request contract (nestgate.base.handler,
nestgate.pipeline.request), and nothing else. http1 on httptools; http2 with its frame
engine (h2engine) and the field checks it shares with http3 (fieldhead); http3 on
aioquic; tls and tlssocket for certificates, SNI, ALPN and TLS on the socket itself;
proxytls for a PROXY header before the TLS handshake. HTTP/1 and HTTP/2 are put
together from one module per job (h1*, h2*), their phases moved by one table
(phasetable); HTTP/2 and HTTP/3 share the stream adapter (streamconn); h3quic is the
QUIC listener.
"""
