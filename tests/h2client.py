"""A small blocking HTTP/2 client for tests, on the h2 library over a TLS socket (or, with
no `cafile`, in clear with prior knowledge: h2c)."""

from __future__ import annotations

import socket
import ssl

import h2.config
import h2.connection
import h2.events


class H2Client:
    def __init__(self, port: int, cafile: str | None, server_hostname: str = "localhost",
                 preamble: bytes = b"", source: str = "127.0.0.1") -> None:
        raw = socket.create_connection(("127.0.0.1", port), timeout=10,
                                       source_address=(source, 0))
        raw.sendall(preamble)               # a PROXY header, sent in clear before TLS
        self.scheme = b"https" if cafile else b"http"
        if cafile is None:
            self.sock = raw
        else:
            ctx = ssl.create_default_context(cafile=cafile)
            ctx.set_alpn_protocols(["h2"])
            self.sock = ctx.wrap_socket(raw, server_hostname=server_hostname)
            assert self.sock.selected_alpn_protocol() == "h2"
        self.sent = self.received = 0       # HTTP/2 bytes, inside TLS
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=True, header_encoding=None))
        self.h2.initiate_connection()
        self.send(self.h2.data_to_send())
        self.authority = server_hostname.encode()

    def request(self, method: str, path: str, body: bytes = b"", headers=(),
                authority: bytes | None = None):
        """(status, headers dict, body) for one request on a new stream."""
        stream = self.h2.get_next_available_stream_id()
        self.h2.send_headers(stream, [(b":method", method.encode()), (b":path", path.encode()),
                                      (b":scheme", self.scheme),
                                      (b":authority", authority or self.authority),
                                      *headers], end_stream=not body)
        if body:
            self.h2.send_data(stream, body, end_stream=True)
        self.send(self.h2.data_to_send())
        return self.read(stream)

    def read(self, stream: int):
        status, headers, data = 0, {}, b""
        while True:
            chunk = self.recv()
            if not chunk:
                raise ConnectionError("server closed the connection")
            for event in self.h2.receive_data(chunk):
                if isinstance(event, h2.events.ResponseReceived) and event.stream_id == stream:
                    headers = {k.decode(): v.decode() for k, v in event.headers}
                    status = int(headers.pop(":status"))
                elif isinstance(event, h2.events.DataReceived) and event.stream_id == stream:
                    data += event.data
                    self.h2.acknowledge_received_data(event.flow_controlled_length, stream)
                elif isinstance(event, h2.events.StreamEnded) and event.stream_id == stream:
                    self.send(self.h2.data_to_send())
                    return status, headers, data
                elif isinstance(event, h2.events.StreamReset) and event.stream_id == stream:
                    raise ConnectionError(f"stream reset ({event.error_code})")
            self.send(self.h2.data_to_send())

    def send(self, data: bytes) -> None:
        self.sent += len(data)
        self.sock.sendall(data)

    def recv(self) -> bytes:
        data = self.sock.recv(65536)
        self.received += len(data)
        return data

    def close(self) -> None:
        self.sock.close()
