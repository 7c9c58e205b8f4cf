"""The upstream server the proxy tests talk to (conftest.Upstream) behaves."""

from __future__ import annotations

import json


def test_upstream_answers_echo(upstream):
    import http.client
    up = upstream()
    conn = http.client.HTTPConnection("127.0.0.1", up.port, timeout=5)
    conn.request("POST", "/echo?x=1", body=b"abc")
    data = json.loads(conn.getresponse().read())
    assert data["target"] == "/echo?x=1" and data["size"] == 3
