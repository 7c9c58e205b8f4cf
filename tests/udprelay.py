"""A lossy UDP path for the tests: `LossyRelay` sits on 127.0.0.1 between QUIC clients
and a server and drops datagrams, as a real network does, so that what recovers them
(QUIC's retransmissions, driven by each end's timers) is what is tested.

Each client address gets its own socket towards the server, so the server sees one
address per client (and SO_REUSEPORT spreads them over its workers as it would real
clients). What is dropped, per direction ("up": client to server, "down": server to
client):
  * `loss`: each datagram with this probability, by a seeded `random.Random`;
  * `drop_first`: the first n datagrams of each client's flow (a lost handshake);
  * `drop_next_tail()`: while `hold_tails` is set, the last datagram that carries
    more than an acknowledgement (over `ACK_ONLY_BYTES`) before the server falls
    quiet for `TAIL_GAP_S` (the end of an answer) is dropped, once.
  * `swap_up()`: the client's next datagram is held and sent after the one after it
    (datagrams out of order, as a loss and its retransmission leave them).
Holding each such server datagram until the next one comes (or the gap passes) is how
the last one is known; with `hold_tails` set, it delays each burst's end by `TAIL_GAP_S`.
The datagrams of bare acknowledgements pass meanwhile: the server sends them when the
client's packets ask for one, after the answer too, and they carry no answer.

The relay runs on the caller's event loop and ends with it (`close`).
"""

from __future__ import annotations

import asyncio
import random

TAIL_GAP_S = 0.01        # a server quiet this long has ended its burst (under its
                         # probe timeout, at least max_ack_delay: 25 ms)
ACK_ONLY_BYTES = 64      # a 1-RTT packet with an ACK frame alone (8-byte connection ids)


class _ToServer(asyncio.DatagramProtocol):
    """One client's socket towards the server; what the server answers goes back."""

    def __init__(self, relay: "LossyRelay", client_addr) -> None:
        self.relay = relay
        self.client_addr = client_addr
        self.transport = None
        self.sent = {"up": 0, "down": 0}       # datagrams seen so far, by direction
        self.held: bytes | None = None          # a server datagram waiting for the next
        self.hold_timer: asyncio.TimerHandle | None = None
        self.held_up: bytes | None = None       # a client datagram sent after the next

    def connection_made(self, transport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr) -> None:
        if self.relay.hold_tails and len(data) > ACK_ONLY_BYTES:
            self._hold(data)
        elif not self.relay.lost(self, "down"):
            self.relay.to_client(data, self.client_addr)

    def _hold(self, data: bytes) -> None:
        if self.hold_timer is not None:
            self.hold_timer.cancel()
            held, self.held = self.held, None
            if not self.relay.lost(self, "down"):
                self.relay.to_client(held, self.client_addr)
        self.held = data
        self.hold_timer = asyncio.get_running_loop().call_later(TAIL_GAP_S, self._burst_ended)

    def _burst_ended(self) -> None:
        self.hold_timer = None
        held, self.held = self.held, None
        if self.relay.tail_armed:
            self.relay.tail_armed = False
            self.relay.dropped_tails += 1
            return
        if not self.relay.lost(self, "down"):
            self.relay.to_client(held, self.client_addr)

    def close(self) -> None:
        if self.hold_timer is not None:
            self.hold_timer.cancel()
        if self.transport is not None:
            self.transport.close()


class LossyRelay(asyncio.DatagramProtocol):
    """Listens on 127.0.0.1 (`port`), relays to `server` (host, port), drops as the
    module says. `dropped` and `passed` count datagrams by direction."""

    def __init__(self, server, loss: float = 0.0, seed: int = 0, drop_first: int = 0) -> None:
        self.server = server
        self.loss = loss
        self.random = random.Random(seed)
        self.drop_first = drop_first
        self.hold_tails = False
        self.tail_armed = False
        self.dropped = {"up": 0, "down": 0}
        self.passed = {"up": 0, "down": 0}
        self.dropped_tails = 0
        self.swapping = False
        self.flows: dict = {}
        self.transport = None
        self.pending: dict = {}                 # client address -> datagrams before its socket

    @classmethod
    async def start(cls, server, **options) -> "LossyRelay":
        loop = asyncio.get_running_loop()
        _transport, relay = await loop.create_datagram_endpoint(
            lambda: cls(server, **options), local_addr=("127.0.0.1", 0))
        return relay

    @property
    def port(self) -> int:
        return self.transport.get_extra_info("sockname")[1]

    def connection_made(self, transport) -> None:
        self.transport = transport

    def lost(self, flow: _ToServer, direction: str) -> bool:
        """Whether this datagram of `flow` is dropped (and counted either way)."""
        flow.sent[direction] += 1
        drop = flow.sent[direction] <= self.drop_first or self.random.random() < self.loss
        (self.dropped if drop else self.passed)[direction] += 1
        return drop

    def to_client(self, data: bytes, addr) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.sendto(data, addr)

    def datagram_received(self, data: bytes, addr) -> None:
        flow = self.flows.get(addr)
        if flow is None:
            if addr in self.pending:
                self.pending[addr].append(data)
                return
            self.pending[addr] = [data]
            asyncio.ensure_future(self._open_flow(addr))
            return
        self._up(flow, data)

    def drop_next_tail(self) -> None:
        """Drop the last datagram of the server's next burst (with `hold_tails` set)."""
        self.tail_armed = True

    def swap_up(self) -> None:
        """Send the next client datagram after the one that follows it."""
        self.swapping = True

    def _up(self, flow: _ToServer, data: bytes) -> None:
        if self.lost(flow, "up") or flow.transport is None:
            return
        if self.swapping:
            self.swapping = False
            flow.held_up = data
            return
        flow.transport.sendto(data)
        if flow.held_up is not None:
            held, flow.held_up = flow.held_up, None
            flow.transport.sendto(held)

    async def _open_flow(self, addr) -> None:
        loop = asyncio.get_running_loop()
        _transport, flow = await loop.create_datagram_endpoint(
            lambda: _ToServer(self, addr), remote_addr=self.server)
        self.flows[addr] = flow
        for data in self.pending.pop(addr):
            self._up(flow, data)

    def close(self) -> None:
        for flow in self.flows.values():
            flow.close()
        if self.transport is not None:
            self.transport.close()
