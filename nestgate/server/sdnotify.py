"""systemd's readiness protocol (sd_notify), for `Type=notify` units: one datagram to
the socket named by NOTIFY_SOCKET. A few lines over the standard library, so nestgate
needs no systemd library; without NOTIFY_SOCKET (not run by systemd) it does nothing.
"""

from __future__ import annotations

import os
import socket
import time


def notify(*states: str) -> bool:
    """Send `READY=1`, `RELOADING=1`, `STOPPING=1`, `STATUS=...`; whether it was sent."""
    address = os.environ.get("NOTIFY_SOCKET", "")
    if not address:
        return False
    if address.startswith("@"):                 # an abstract socket
        address = "\0" + address[1:]
    lines = list(states)
    if "RELOADING=1" in lines:
        # systemd 253+ wants the moment of the reload with it (Type=notify-reload).
        lines.append(f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall("\n".join(lines).encode())
    except OSError:
        return False                            # systemd went away: nothing to tell
    return True
