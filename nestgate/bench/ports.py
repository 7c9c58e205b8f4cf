"""Free TCP ports on 127.0.0.1 for the servers a benchmark starts.

The kernel picks the port (bind to port 0), so nothing is guessed; ports already handed out
in this process are never handed out again, because the servers bind them only later and
the kernel could otherwise return the same number twice.
"""

import socket

_handed_out: set[int] = set()


def free_port(host: str = "127.0.0.1", attempts: int = 50) -> int:
    for _ in range(attempts):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port
    raise OSError(f"no free port on {host} after {attempts} attempts")


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    return [free_port(host) for _ in range(count)]


def is_listening(port: int, host: str = "127.0.0.1", timeout_s: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False
