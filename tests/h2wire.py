"""HTTP/2 without sockets: an h2 client pumped against an `HTTP2Connection` on a
`Wire`'s loop and fake transport, for protocol tests that need no server process."""

from __future__ import annotations

import h2.config
import h2.connection
import h2.events
import hyperframe.frame

from nestgate.wire.http2 import HTTP2Connection
from wire import Broken, Echo, FakeTransport, Wire


class Pump:
    """Moves bytes between an h2 client and an HTTP2Connection until a stream ends."""

    def __init__(self, data: dict | None = None, handlers: dict | None = None) -> None:
        self.wire = Wire(data, handlers=handlers or {"/echo": Echo(), "/broken": Broken()})
        self.transport = FakeTransport()
        self.server = HTTP2Connection(self.wire.ctx)
        self.server.connection_made(self.transport)
        self.client = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=True, header_encoding=None))
        self.client.initiate_connection()

    def exchange(self, method: bytes, path: bytes, body: bytes = b"", headers=(),
                 authority: bytes = b"a"):
        stream = self.client.get_next_available_stream_id()
        self.client.send_headers(stream, [(b":method", method), (b":path", path),
                                          (b":scheme", b"https"), (b":authority", authority),
                                          *headers], end_stream=not body)
        pending = memoryview(body)
        status, data = 0, b""
        for _ in range(10_000):
            while pending and self.client.local_flow_control_window(stream) > 0:
                size = min(len(pending), self.client.local_flow_control_window(stream),
                           self.client.max_outbound_frame_size)
                self.client.send_data(stream, bytes(pending[:size]),
                                      end_stream=size == len(pending))
                pending = pending[size:]
            out = self.client.data_to_send()
            if out:
                self.server.data_received(out)
            self.wire.run(5)
            inbound, self.transport.out = bytes(self.transport.out), bytearray()
            for event in self.client.receive_data(inbound) if inbound else ():
                if isinstance(event, h2.events.ResponseReceived):
                    status = int(dict(event.headers)[b":status"])
                elif isinstance(event, h2.events.DataReceived):
                    data += event.data
                    self.client.acknowledge_received_data(event.flow_controlled_length, stream)
                elif isinstance(event, h2.events.StreamEnded) and event.stream_id == stream:
                    return status, data
        raise AssertionError("stream never ended")

    def close(self) -> None:
        """The client goes away; no task of the connection may be left (Wire.close)."""
        self.server.connection_lost(None)
        self.wire.close()


def frames(data: bytes) -> list:
    """The frames in what the server wrote (for what h2's client cannot take: it
    stops accepting frames once it has read a GOAWAY, RFC 9113 6.8 notwithstanding)."""
    out = []
    while data:
        frame, length = hyperframe.frame.Frame.parse_frame_header(memoryview(data[:9]))
        frame.parse_body(memoryview(data[9:9 + length]))
        out.append(frame)
        data = data[9 + length:]
    return out
