"""`send_timeout`: a client that takes no response bytes for that long is cut off.

nginx's rule: the timeout runs between two successful writes, not over the whole
response. Here the worker's tick looks at how many bytes wait in the connection's
transport; the client is making progress while that number falls. A connection
whose bytes sit unread for `send_timeout` is aborted (a plain close would wait for
the buffer to drain, which is what the client never lets happen), so a client that
stops reading cannot hold a connection, a file or an upstream connection forever.
"""

from __future__ import annotations

import socket
import struct

_RESET = struct.pack("ii", 1, 0)          # SO_LINGER on, 0 s: close sends RST


class SendWatch:
    __slots__ = ("waiting", "stalled")

    def __init__(self) -> None:
        self.waiting = 0          # bytes in the transport at the last tick
        self.stalled = 0.0        # seconds they have not gone down

    def stuck(self, transport, elapsed: float, limit: float) -> bool:
        """Called by the tick; True when the connection should be aborted."""
        waiting = transport.get_write_buffer_size()
        if not waiting or waiting < self.waiting:
            self.waiting = waiting
            self.stalled = 0.0
            return False
        self.waiting = waiting
        self.stalled += elapsed
        return self.stalled >= limit


def cut(transport) -> None:
    """Abort with a reset (nginx's `reset_timedout_connection`): the kernel drops the
    unsent bytes at once instead of keeping them for a client that reads nothing."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
        except OSError:
            pass
    transport.abort()
