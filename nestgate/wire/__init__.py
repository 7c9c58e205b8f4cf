"""The adapters: bytes on a connection <-> the request contract (nestgate.base.handler,
nestgate.pipeline.request), and nothing else. http1 on httptools; http2 with its frame
engine (h2engine) and the field checks it shares with http3 (fieldhead); http3 on
aioquic; tls and tlssocket for certificates, SNI, ALPN and TLS on the socket itself;
proxytls for a PROXY header before the TLS handshake.
"""
