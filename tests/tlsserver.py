"""An in-process TLS server on `nestgate.wire.tlssocket`, for transport tests: a uvloop
loop in a thread accepts in clear and adopts each descriptor, as
`proxytls.TLSHandshake` does, with a line-echo protocol that records what happened."""

from __future__ import annotations

import asyncio
import ssl
import threading

import uvloop

from nestgate.wire import tlssocket


class _Stage:
    """What `TLSSocketTransport` reports the handshake to."""

    def __init__(self, protocol) -> None:
        self.protocol = protocol
        self.outcome = None

    def handshake_done(self, tls) -> None:
        self.outcome = "done"
        tls.set_protocol(self.protocol)
        self.protocol.connection_made(tls)

    def handshake_failed(self) -> None:
        self.outcome = "failed"

    def check_hello(self, hello: bytes) -> None:
        return None                    # every ClientHello goes on to the handshake


class Recorder(asyncio.Protocol):
    """Echoes each line back upper-cased; 'big N' answers N bytes; 'bye' closes."""

    def __init__(self) -> None:
        self.received = b""
        self.lost = None
        self.paused = 0
        self.resumed = 0
        self.eof = False

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.alpn = transport.get_extra_info("ssl_object").selected_alpn_protocol()

    def data_received(self, data: bytes) -> None:
        self.received += data
        while b"\n" in self.received:
            line, _, self.received = self.received.partition(b"\n")
            if line.startswith(b"big "):
                self.transport.write(b"x" * int(line[4:]))
            elif line == b"bye":
                self.transport.write(b"BYE\n")
                self.transport.close()
            elif line == b"pause":
                self.transport.pause_reading()
                asyncio.get_running_loop().call_later(0.3, self.transport.resume_reading)
            else:
                self.transport.write(line.upper() + b"\n")

    def eof_received(self):
        self.eof = True
        return None

    def pause_writing(self) -> None:
        self.paused += 1

    def resume_writing(self) -> None:
        self.resumed += 1

    def connection_lost(self, exc) -> None:
        self.lost = exc if exc is not None else "clean"


class Server:
    def __init__(self, certs) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(*certs["local"])
        self.context.set_alpn_protocols(["h2", "http/1.1"])
        self.protocols: list[Recorder] = []
        self.stages: list[_Stage] = []
        self.loop = uvloop.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.ready.wait(5)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(
            self.loop.create_server(self._accept_factory, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self.ready.set()
        self.loop.run_forever()
        server.close()

    def _accept_factory(self):
        outer = self

        class Accept(asyncio.Protocol):
            def connection_made(self, transport) -> None:
                protocol = Recorder()
                stage = _Stage(protocol)
                outer.protocols.append(protocol)
                outer.stages.append(stage)
                sock = tlssocket.adopt(outer.loop, transport, outer.context)
                stage.transport = tlssocket.TLSSocketTransport(outer.loop, sock, stage)

            def connection_lost(self, exc) -> None:
                pass
        return Accept()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
