"""examples/home-server.toml is the acceptance example: it must load and behave as
its comments say (the upstream address is pointed at a test upstream)."""

from __future__ import annotations

import json
import shutil

from conftest import REPO, Browser, Server, _env


def test_home_server_example(upstream, tmp_path):
    up = upstream()
    text = (REPO / "examples" / "home-server.toml").read_text()
    assert text.count("http://127.0.0.1:9001") == 3
    config = tmp_path / "home-server.toml"
    config.write_text(text.replace("http://127.0.0.1:9001", up.url))
    # The example keeps its store in the user's home, out of the repository.
    server = Server(config, ["--listen", "127.0.0.1:0"], env={**_env(), "HOME": str(tmp_path)})
    try:
        port = server.port()
        resp, body = Browser(port, "app.localhost").request("GET", "/echo")
        assert resp.status == 200 and json.loads(body)["target"] == "/echo"
        private = Browser(port, "private.localhost")
        assert private.request("GET", "/echo")[0].status == 401
        resp, _ = private.sign_in("demo", "demo-password", next_url="/echo")
        assert resp.status == 303 and resp.getheader("location") == "/echo"
        resp, body = private.request("GET", "/echo")
        assert resp.status == 200 and json.loads(body)["upstream"] == "up"
        assert Browser(port, "lan.localhost").request("GET", "/echo")[0].status == 403
        assert (tmp_path / ".nestgate-home-server.db").exists()
    finally:
        server.stop()
    shutil.rmtree(tmp_path, ignore_errors=True)
