"""Headless Chromium driven through the DevTools protocol over a pipe, for tests that
click through a page: no WebDriver, no websocket, only the browser Debian ships.

`--remote-debugging-pipe` makes Chromium read commands from its fd 3 and write answers
and events to its fd 4, each a JSON message ended by a NUL byte.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import tempfile
import time


class BrowserError(AssertionError):
    """Chromium answered a DevTools command with an error."""


class Browser:
    def __init__(self, url: str, args=(), env=None) -> None:
        """Open `url`; `args` are more Chromium flags, `env` its environment (HOME
        decides which NSS database, so which extra roots, it trusts)."""
        chromium = shutil.which("chromium")
        assert chromium, "chromium is installed by `make test` (debian-deps)"
        self._profile = tempfile.TemporaryDirectory(prefix="nestgate-chromium-",
                                                    ignore_cleanup_errors=True)
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # The child's fds 3 and 4 must be those two ends (kept open as `pass_fds`):
        # moved out of the way first, in case either end is itself 3 or 4.
        def plumb() -> None:
            reader, writer = os.dup(to_browser_r), os.dup(from_browser_w)
            os.dup2(reader, 3)
            os.dup2(writer, 4)
        self.proc = subprocess.Popen(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--remote-debugging-pipe", f"--user-data-dir={self._profile.name}", *args, url],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            preexec_fn=plumb, pass_fds=(3, 4))
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        targets = self._call("Target.getTargets")["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        self._session = self._call("Target.attachToTarget", targetId=page["targetId"],
                                   flatten=True)["sessionId"]

    def _call(self, method: str, session: str | None = None, timeout: float = 30, **params):
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            while b"\0" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\0", 1)
                answer = json.loads(raw)
                if answer.get("id") == self._next_id:
                    if "error" in answer:
                        raise BrowserError(f"{method}: {answer['error']}")
                    return answer["result"]
            if not select.select([self._from_browser], [], [], 0.5)[0]:
                continue
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium exited: " + self.proc.stderr.read().decode()[-2000:])
            self._buffer += chunk
        raise TimeoutError(method)

    def command(self, method: str, **params):
        """A DevTools command to the page (WebAuthn.*, Page.*); its result."""
        return self._call(method, session=self._session, **params)

    def evaluate(self, expression: str):
        """The value of a JavaScript expression in the page (a promise is awaited)."""
        result = self._call("Runtime.evaluate", session=self._session, expression=expression,
                            awaitPromise=True, returnByValue=True)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def type_into(self, selector: str, text: str) -> None:
        """Set an input's value the way typing does, so that React sees the change."""
        self.evaluate(
            f"(() => {{ const input = document.querySelector({json.dumps(selector)});"
            " Object.getOwnPropertyDescriptor(HTMLInputElement.prototype, 'value')"
            f".set.call(input, {json.dumps(text)});"
            " input.dispatchEvent(new Event('input', {bubbles: true})); })()")

    def wait_for(self, expression: str, timeout: float = 20):
        """Poll until `expression` is truthy in the page; its value. A page still
        loading (or an error page replacing it) may have no context to evaluate in
        for a moment: that is asked again, until the timeout."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = self.evaluate(expression)
            except BrowserError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
                continue
            if value or time.monotonic() > deadline:
                return value
            time.sleep(0.1)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.proc.stderr.close()
        os.close(self._to_browser)
        os.close(self._from_browser)
        self._profile.cleanup()
