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


def test_serve_reads_nestgate_toml_from_the_working_directory_and_listen_overrides(tmp_path):
    import signal
    import subprocess
    import sys
    from conftest import _env
    import re
    # The file listens on 127.0.0.1:0 too; --listen must replace it, not add to it.
    (tmp_path / "nestgate.toml").write_text(BASIC_SITE.replace("/hello", "/from-cwd"))
    proc = subprocess.Popen([sys.executable, "-m", "nestgate", "serve", "--listen",
                             "[::1]:0"], cwd=tmp_path, env=_env(),
                            stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in proc.stderr:
            lines.append(line)
            if "ready" in line:
                break
        listening = re.findall(r"listening on (\S+)", "".join(lines))
        assert len(listening) == 1 and listening[0].startswith("http://[::1]:")
        port = int(listening[0].rsplit(":", 1)[1])
        conn = http.client.HTTPConnection("::1", port, timeout=5)
        conn.request("GET", "/from-cwd")
        assert conn.getresponse().read() == b"hello\n"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
