"""The phases of an HTTP/1 connection and the reading states within one: the table of
allowed moves (`Phases`, with `nestgate.wire.phasetable`'s move), mixed into
`nestgate.wire.http1.HTTP1Connection`.

A connection's life is a few phases; each says what becomes of the client's next
bytes, and a phase only moves to one listed in `NEXT` (checked on each move):

  phase         the client's bytes                           moves to
  OPEN          parsed as requests                           LAST CLOSING UPGRADING CLOSED
  LAST          the rest of the request that ends the        CLOSING UPGRADING CLOSED
                connection; a request after it ends reading
  PROXY_HEADER  a PROXY protocol header, then OPEN           OPEN CLOSING CLOSED
  CLOSING       dropped; answers ahead still go out          CLOSED
  UPGRADING     kept for the handler of an upgrade request   TUNNEL CLOSING CLOSED
                (reading is stopped), which may wait its
                turn behind answers to pipelined requests
  TUNNEL        handed to the handler's sink                 CLOSING CLOSED
  CLOSED        none: the transport is gone

While requests are read, `state` says where in one the reading is: IDLE (between
requests), HEAD or BODY; the tick's timeouts follow it.
"""

from __future__ import annotations

from nestgate.wire.phasetable import PhaseTable

# Reading-side states.
IDLE, HEAD, BODY = 0, 1, 2

# The connection's phases. Those before CLOSING read the client's bytes; a phase
# changes a few times in a connection's life, never per request.
OPEN, LAST, PROXY_HEADER, CLOSING, UPGRADING, TUNNEL, CLOSED = range(7)
PHASE_NAMES = ("open", "last", "proxy-header", "closing", "upgrading", "tunnel", "closed")
NEXT = {
    OPEN: (LAST, CLOSING, UPGRADING, CLOSED),
    LAST: (CLOSING, UPGRADING, CLOSED),
    PROXY_HEADER: (OPEN, CLOSING, CLOSED),
    CLOSING: (CLOSED,),
    UPGRADING: (TUNNEL, CLOSING, CLOSED),
    TUNNEL: (CLOSING, CLOSED),
    CLOSED: (),
}


class Phases(PhaseTable):
    """The phases of an HTTP/1 connection."""

    NEXT = NEXT
    PHASE_NAMES = PHASE_NAMES
