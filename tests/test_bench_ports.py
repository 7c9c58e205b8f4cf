"""Free-port allocation: kernel-chosen, distinct, bindable."""

import socket

from nestgate.bench import ports


def test_ports_are_distinct_and_bindable():
    chosen = ports.free_ports(20)
    assert len(set(chosen)) == 20
    for port in chosen[:5]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_never_hands_out_the_same_port_twice():
    a, b = ports.free_port(), ports.free_port()
    assert a != b
    assert a in ports._handed_out and b in ports._handed_out


def test_is_listening():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert ports.is_listening(port)
    assert not ports.is_listening(port)
