"""External tools the harness drives: where they are, their Debian package, their version."""

import shutil
import subprocess

from . import BenchError

# Named so an error can say what to install instead of only what is missing.
DEBIAN_PACKAGES = {
    "wrk": "wrk",
    "h2load": "nghttp2-client",
    "nginx": "nginx-light (or nginx)",
    "caddy": "caddy",
    "openssl": "openssl",
}

_VERSION_ARGS = {"wrk": ["-v"], "h2load": ["--version"], "nginx": ["-v"], "caddy": ["version"],
                 "openssl": ["version"]}


def which(tool: str) -> str | None:
    # nginx lives in /usr/sbin, which is not on every user's PATH.
    return shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/usr/local/sbin:/sbin")


def require(tool: str) -> str:
    path = which(tool)
    if path is None:
        package = DEBIAN_PACKAGES.get(tool, tool)
        raise BenchError(f"{tool} is not installed; on Debian: apt-get install {package}"
                         " (or run `make bench` as root)")
    return path


def version(tool: str) -> str:
    path = which(tool)
    if path is None:
        return "not installed"
    try:
        out = subprocess.run([path, *_VERSION_ARGS.get(tool, ["--version"])],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    # wrk prints its version then usage and exits 1; nginx prints to stderr.
    text = (out.stdout + out.stderr).strip().splitlines()
    return text[0].strip() if text else "unknown"
