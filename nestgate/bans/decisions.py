"""The CrowdSec decisions last enforced, kept in a file so they outlive a restart.

The bouncer process (nestgate.bans.crowdsec) writes the networks it has put in the ban
table, each with when its decision ends and its scenario, whenever that set changes
(temp file, fsync, rename: a reader sees the old set or the new one, never half of
one), and puts them back in the table when it starts, before its first call to the
Local API. `nestgate ban list` reads it to show CrowdSec's entries, which live only in
the running server's shared memory.

The file: a magic line, then one line per network: `<until> <network> <scenario>`,
until as seconds since the epoch.
"""

from __future__ import annotations

from nestgate.base.files import replace_file

MAGIC = "nestgate crowdsec decisions 2\n"


def write_snapshot(path: str, refused: dict[str, tuple[float, str]]) -> None:
    """Replace the file at `path` whole with `refused` (network -> (until, scenario))."""
    lines = [MAGIC] + [f"{until:.3f} {network} {_word(scenario)}\n"
                       for network, (until, scenario) in refused.items()]
    replace_file(path, "".join(lines).encode("utf-8"), sync_folder=True)


def read_snapshot(path: str, say=None) -> dict[str, tuple[float, str]] | None:
    """What `write_snapshot` wrote to `path`; None when there is no file (or it cannot
    be read: `say` is told why). Lines that are not entries are left out."""
    from nestgate.bans.table import network_key
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        if say is not None:
            say(f"cannot read {path} ({exc.strerror or exc}); starting without it")
        return None
    if not text.startswith(MAGIC):
        if say is not None:
            say(f"{path} is not a decisions file; starting without it")
        return None
    found: dict[str, tuple[float, str]] = {}
    for line in text[len(MAGIC):].splitlines():
        parts = line.split(" ", 2)
        try:
            until, network = float(parts[0]), network_key(parts[1])[3]
        except (ValueError, IndexError):
            continue
        scenario = parts[2] if len(parts) > 2 else "-"
        found[network] = (until, "" if scenario == "-" else scenario)
    return found


def _word(text: str) -> str:
    return "".join(c if c.isprintable() and not c.isspace() else "_" for c in text) or "-"
