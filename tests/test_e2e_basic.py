import http.client
import json

from conftest import BASIC_SITE


def test_health_and_route(start_server):
    server = start_server(BASIC_SITE)
    conn = http.client.HTTPConnection("127.0.0.1", server.port(), timeout=5)
    conn.request("GET", "/api/v1/health")
    resp = conn.getresponse()
    body = json.loads(resp.read())
    assert resp.status == 200
    assert resp.getheader("content-type") == "application/json"
    assert body["status"] == "ok" and body["pid"] in server.worker_pids()
    conn.request("GET", "/hello")
    resp = conn.getresponse()
    assert (resp.status, resp.read()) == (200, b"hello\n")
