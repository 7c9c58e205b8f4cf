"""What README.md and docs/*.md tell a user is what nestgate does.

- Every ```toml block is read by the config reader `nestgate check` runs. A whole config
  (it has [[listen]] or [[site]]) must load as it stands (a listener added if it shows
  none), with only the files and environment variables it names made to exist
  (certificates from trustme, MaxMind files from mmdb-writer, folders, secrets) in a
  temporary folder. A fragment is merged into a minimal valid config and may fail only
  on such files or on a placeholder it shows ("...", "<...>"), never on an unknown key.
  A block under `<!-- toml: users_file -->` is read as a users_file.
- Every key of a `| key | default ...` table is one the reader knows in the table the
  heading, the cell or a `<!-- keys: [table] -->` line above it names: it is not refused
  the way a made-up key there is.
- Every `nestgate <command> ... --flag` in a shell block, a `$ ` line of a plain block
  or an inline code span names a command and flags that command's --help lists.
- Every `make TARGET` shown is a Makefile target; README's set-up commands are what the
  Makefile runs, its Debian packages are debian-deps', its dependency list is
  pyproject.toml's, both ways.
- Every relative link reaches a file (and its #anchor a heading there); every repository
  file named in code exists; "N lines" of a linked file is its length.

Each case is named by file and line. The reader is called in-process, as `check` calls
it, without check's trial bind of the documented ports (80, 443...): that says something
about the machine, not the doc.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import io
import re
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme

from nestgate.cli import main as cli_main
from nestgate.config import (EMBEDDED_DEFAULT, ConfigError, config_warnings, parse_config,
                             read_config, with_overrides)

from conftest import HASH, REPO
from test_geoip import write_asns, write_countries

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^\s*```(\S*)\s*$")
MARK = re.compile(r"^<!--\s*toml:\s*(\S+)\s*-->$")


@dataclass(frozen=True)
class Block:
    file: str            # relative to the repository
    line: int            # of the opening fence
    lang: str
    text: str
    mark: str            # from a `<!-- toml: ... -->` line just above the fence

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


def blocks() -> list[Block]:
    found = []
    for path in DOCS:
        lines = path.read_text(encoding="utf-8").split("\n")
        opened = None
        for number, line in enumerate(lines, 1):
            fence = FENCE.match(line)
            if fence and opened is None:
                mark = MARK.match(lines[number - 2].strip()) if number > 1 else None
                opened, body = (number, fence.group(1), mark.group(1) if mark else ""), []
            elif fence and not fence.group(1):
                start, lang, mark = opened
                found.append(Block(str(path.relative_to(REPO)), start, lang,
                                   "\n".join(body), mark))
                opened = None
            elif opened is not None:
                body.append(line)
        assert opened is None, f"{path}: the ``` block at line {opened[0]} never closes"
    return found


BLOCKS = blocks()


def prose_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, line) of `path` outside ``` blocks."""
    out, in_code = [], False
    for number, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
        if FENCE.match(line):
            in_code = not in_code
        elif not in_code:
            out.append((number, line))
    return out
TOML = [b for b in BLOCKS if b.lang == "toml"]


# ---------------------------------------------------------------- config blocks

# "FILE: KEY: expected <a file or folder>, got 'VALUE'": what the reader asks to exist.
MISSING = re.compile(r"^.*?: (?P<key>\S+): expected (?:a path to a readable "
                     r"(?P<kind>file|directory)|a readable TOML file of \[\[user\]\] "
                     r"tables \([^)]*\)), got '(?P<value>[^']*)'$")
UNSET = re.compile(r"expected the environment variable (\w+) set \(it is not\)")
PLACEHOLDER = re.compile(r"\.\.\.|<[^>]*>")
USERS = f'[[user]]\nname = "docs"\npassword = "{HASH}"\n'


class Files:
    """Makes the files a config names, in `folder` (absolute paths move under it), and
    the environment variables it names."""

    def __init__(self, folder: Path, monkeypatch):
        self.folder, self.monkeypatch = folder, monkeypatch
        self.ca = trustme.CA()
        self.leaf = self.ca.issue_cert("example.com", "*.example.com")

    def place(self, value: str) -> Path:
        return self.folder / value.lstrip("/") if value.startswith("/") else self.folder / value

    def make(self, key: str, kind: str, value: str) -> None:
        path = self.place(value)
        name = key.rsplit(".", 1)[-1]
        if kind == "directory":
            path.mkdir(parents=True, exist_ok=True)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        if name == "cert":
            # every cert and key of a config from the one leaf: each pair matches
            path.write_bytes(b"".join(b.bytes() for b in self.leaf.cert_chain_pems))
        elif name == "key":
            path.write_bytes(self.leaf.private_key_pem.bytes())
        elif name == "database":
            write_countries(path, {"203.0.113.0/24": "DE"})
        elif name == "asn_database":
            write_asns(path, {"203.0.113.0/24": 64500})
        elif name == "users_file":
            path.write_text(USERS)
        elif name == "credentials_file":
            path.write_text("AUTH_TOKEN=docs\n")
        elif name.isdigit() or name.endswith("page"):
            path.write_text("<!doctype html><title>page</title>\n")
        else:
            path.write_text("docs-secret\n")
        path.chmod(0o600)           # secrets readable by others are warned about


def moved(data, old: str, new: str):
    """`data` with every string value equal to `old` replaced by `new`."""
    if isinstance(data, dict):
        return {k: moved(v, old, new) for k, v in data.items()}
    if isinstance(data, list):
        return [moved(v, old, new) for v in data]
    return new if data == old else data


def read(data: dict, where: str, files: Files):
    """The config `data` as `nestgate check` reads it, making each file the reader asks
    for; returns (config or None, the problems left)."""
    made: set[str] = set()
    while True:
        try:
            config = with_overrides(parse_config(data, where, files.folder))
            config_warnings(config)          # `check` prints them; they must not fail
            return config, []
        except ConfigError as exc:
            problems = exc.problems
        wanted = [m for m in map(MISSING.match, problems)
                  if m and m["value"] and m["value"] not in made]
        unset = [m[1] for m in map(UNSET.search, problems) if m and m[1] not in made]
        if not wanted and not unset:
            return None, problems
        for name in unset:
            files.monkeypatch.setenv(name, "docs-secret")
            made.add(name)
        for m in wanted:
            files.make(m["key"], m["kind"] or "file", m["value"])
            made.add(m["value"])
            if m["value"].startswith("/"):
                data = moved(data, m["value"], str(files.place(m["value"])))


def merged(base: dict, fragment: dict) -> dict:
    out = dict(base)
    for key, value in fragment.items():
        both = isinstance(out.get(key), dict) and isinstance(value, dict)
        out[key] = merged(out[key], value) if both else value
    return out


# A fragment's surroundings: a listener, and a user for what needs one to sign in.
MINIMAL = {"listen": [{"address": "127.0.0.1:0"}],
           "auth": {"store": ":memory:", "user": [{"name": "docs", "password": HASH}]}}
WHOLE = re.compile(r"^\[\[(listen|site)\]\]", re.M)


def placeholders(data) -> set[str]:
    """The names of the keys of `data` (at any depth) whose value is a placeholder."""
    found = set()
    items = data.items() if isinstance(data, dict) else enumerate(data) \
        if isinstance(data, list) else ()
    for key, value in items:
        if isinstance(value, str) and PLACEHOLDER.search(value):
            found.add(str(key))
        found |= placeholders(value)
    return found


def about_placeholder(problem: str, shown: set[str]) -> bool:
    """Whether "FILE: KEY: expected ..., got VALUE" is about a key whose value the block
    shows as a placeholder (some problems keep a secret's value to themselves)."""
    key = problem.split(": ")[1] if problem.count(": ") >= 2 else ""
    name = re.sub(r"\[[^\]]*\]", "", key).rsplit(".", 1)[-1]
    got = problem.partition(", got ")[2]
    return name in shown or bool(got and PLACEHOLDER.search(got))


@pytest.mark.parametrize("block", TOML, ids=[b.where for b in TOML])
def test_toml_block_is_read_by_the_config_reader(block, tmp_path, monkeypatch):
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)   # state goes beside the config
    try:
        data = tomllib.loads(block.text)
    except tomllib.TOMLDecodeError as exc:
        pytest.fail(f"{block.where}: not valid TOML: {exc}")
    files = Files(tmp_path, monkeypatch)
    if block.mark == "users_file":
        (tmp_path / "users.toml").write_text(block.text)
        data = merged(MINIMAL, {"auth": {"users_file": "users.toml"}})
        _, problems = read(data, block.where, files)
        left = [p for p in problems if not about_placeholder(p, placeholders(
            tomllib.loads(block.text)))]
        assert not left, f"{block.where} (a users_file):\n" + "\n".join(left)
        return
    if block.mark == "whole" or WHOLE.search(block.text):
        # A site shown without its listeners gets the one the embedded default has.
        _, problems = read(merged({"listen": MINIMAL["listen"]}, data), block.where, files)
        assert not problems, f"{block.where} (a whole config) fails `nestgate check`:\n" + \
            "\n".join(problems)
        return
    assert not block.mark, f"{block.where}: unknown mark {block.mark!r}"
    _, problems = read(merged(MINIMAL, data), block.where, files)
    unknown = [p for p in problems if ": unknown key" in p]
    assert not unknown, f"{block.where} names keys the reader does not know:\n" + \
        "\n".join(unknown)
    shown = placeholders(data)
    left = [p for p in problems if not about_placeholder(p, shown)]
    assert not left, f"{block.where} (a fragment) fails in a minimal config:\n" + \
        "\n".join(left)


def test_the_reader_is_asked_for_every_toml_block():
    """The cases above are made from the docs: a fence they could not see is a gap."""
    shown = sum(len(re.findall(r"^\s*```toml\s*$", p.read_text(), re.M)) for p in DOCS)
    assert len(TOML) == shown > 0


# ---------------------------------------------------------------- tables of keys

TABLE_NAME = re.compile(r"^(\[\[?[\w.]+\]\]?)\s*(.*)$")
ROUTE_TYPE = re.compile(r'type = "\w+"')
KEYS_MARK = re.compile(r"^<!--\s*keys:\s*(.*?)\s*-->$")


@dataclass(frozen=True)
class Place:
    """Where a table of keys puts them: a table header, TOML lines that table needs
    (a route's type, a DNS provider), and a dotted prefix (`rate_limit`)."""
    table: str
    setting: str = ""
    prefix: str = ""


def heading_place(line: str) -> list[Place]:
    """`## `[server]``, `### `type = "static"` routes`: the first table a heading names."""
    for span in re.findall(r"`([^`]+)`", line):
        table = TABLE_NAME.match(span)
        if table:
            return [Place(table.group(1))]
        if ROUTE_TYPE.fullmatch(span):
            return [Place("[[site.route]]", span)]
    return []


def marked_places(text: str) -> list[Place]:
    """`<!-- keys: [[site]] [[site.route]] -->`, `<!-- keys: [[site]] rate_limit -->`,
    `<!-- keys: [acme.dns] provider = "cloudflare" -->`."""
    tables = re.findall(r"\[\[?[\w.]+\]\]?", text)
    rest = re.sub(r"\[\[?[\w.]+\]\]?", "", text).strip()
    setting = rest if "=" in rest else ""
    return [Place(t, setting, "" if setting else rest) for t in tables]


def key_rows() -> list[tuple[str, Place, str, str]]:
    """(file:line, place, key, documented default) of every `| key | default ...` table."""
    rows = []
    for path in DOCS:
        lines = path.read_text().split("\n")
        heading, marked = [], None
        for number, line in prose_lines(path):
            if line.startswith("#"):
                heading = heading_place(line)
            mark = KEYS_MARK.match(line.strip())
            if mark:
                marked = marked_places(mark.group(1))
            if not line.startswith("| key |"):
                continue
            places, marked = marked or heading, None
            for at in range(number + 1, len(lines)):
                cells = lines[at].split(" | ")
                if not lines[at].startswith("| `"):
                    if lines[at].startswith("|"):
                        continue                    # the |---| line
                    break
                named, keys = [], []
                for span in re.findall(r"`([^`]+)`", cells[0]):
                    table = TABLE_NAME.match(span)
                    if table:
                        named.append(table.group(1))
                        span = table.group(2)
                    if span:
                        keys.append(span)
                for place in [Place(t) for t in named] or places or [Place("(none)")]:
                    rows += [(f"{path.relative_to(REPO)}:{at + 1}", place,
                              ".".join(filter(None, (place.prefix, key))), cells[1].strip())
                             for key in keys]
    return rows


KEY_ROWS = key_rows()


def value_of(default: str) -> str:
    """The documented default as a TOML value when it is one, else a string."""
    literal = re.fullmatch(r"`([^`]*)`(?: \(.*\))?", default)
    if literal:
        try:
            tomllib.loads(f"v = {literal.group(1)}")
            return literal.group(1)
        except tomllib.TOMLDecodeError:
            pass
    return '"x"'


@pytest.mark.parametrize("where,place,key,default", KEY_ROWS,
                         ids=[f"{w} {p.table} {k}" for w, p, k, _ in KEY_ROWS])
def test_key_in_a_table_of_keys_is_one_the_reader_knows(where, place, key, default, tmp_path,
                                                       monkeypatch):
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    assert re.fullmatch(r"[\w.]+", key), f"{where}: {key!r} is not a key"
    assert place.table != "(none)", f"{where}: `{key}`: nothing says which table it is in " \
        "(name it in the heading, the cell, or <!-- keys: [table] --> above the table)"
    mine, known = refused_as_unknown(place, key, value_of(default), where, tmp_path)
    assert known, f"{where}: the reader refuses no unknown key at {place.table} " \
        f"{key.rpartition('.')[0]}: this check cannot tell"
    assert not mine, f"{where}: {place.table} `{key}` is not a key there:\n" + "\n".join(mine)


NO_SUCH_KEY = "zz_no_such_key"


def refused_as_unknown(place: Place, key: str, value: str, where: str, folder: Path):
    """Whether the reader refuses `key` where a table of keys puts it as it refuses a key
    that cannot exist there ("unknown key" for a table, "(unknown: x)" for an inline
    one such as rate_limit): (the refusals of `key`, whether a made-up key is refused)."""
    def problems(name: str) -> list[str]:
        table, setting = place.table, place.setting
        if table == "[[user]]":             # a users_file's, read by [[auth.user]]'s reader
            table = "[[auth.user]]"
        if table == "[[site.route]]":       # a route is read by its type's reader
            setting = (setting or 'type = "return"') + '\nprefix = "/nowhere/"'
        setting = "\n".join(line for line in setting.split("\n")
                            if line.split(" = ")[0] != name)     # the row's own key wins
        data = tomllib.loads(f"{table}\n{setting}\n{name} = {value}\n")
        try:
            parse_config(merged(MINIMAL, data), where, folder)
            return []
        except ConfigError as exc:
            return [re.sub(r" \(did you mean [^)]*\)", "", p) for p in exc.problems]
    parent, _, last = key.rpartition(".")
    made_up = [p for p in problems(".".join(filter(None, (parent, NO_SUCH_KEY))))
               if NO_SUCH_KEY in p]
    mine = set(problems(key))
    return [p for p in made_up if p.replace(NO_SUCH_KEY, last) in mine], bool(made_up)


def test_tables_of_keys_were_found():
    assert len(KEY_ROWS) > 200


# ---------------------------------------------------------------- commands and flags


@functools.cache
def help_of(argv: tuple[str, ...]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        with pytest.raises(SystemExit):
            cli_main([*argv, "--help"])
    return out.getvalue()


CHOICES = re.compile(r"^\s*\{([\w,-]+)\}\s*$", re.M)
SHELL_BREAK = {"|", "||", "&&", ";", "&"}


def shell_lines(text: str):
    """(line number from 1, line) with continued lines joined onto their first."""
    number, held = 0, ""
    for at, line in enumerate(text.split("\n"), 1):
        number = number if held else at
        if line.endswith("\\"):
            held += line[:-1] + " "
            continue
        yield number, held + line
        held = ""


def invocations(line: str) -> list[list[str]]:
    """The arguments of each `nestgate ...` (or `python -m nestgate ...`) on a shell line."""
    found = []
    line = re.sub(r"^\s*\$ ", "", line)
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        words = line.split()
    start = True                     # the word may be a program
    for i, word in enumerate(words):
        after_user = i > 0 and words[i - 1] == "-u"
        skip = 0
        if start and not after_user and word.rsplit("/", 1)[-1] == "nestgate":
            skip = 1
        elif start and re.match(r"^python3?$", word) and \
                words[i + 1:i + 3] == ["-m", "nestgate"]:
            skip = 3
        if skip:
            args, depth = [], 0
            for arg in words[i + skip:]:
                depth += arg.count("[") - arg.count("]")
                if depth <= 0 and arg in SHELL_BREAK:
                    break
                args.append(arg)
            found.append(args)
        # before a program may come sudo (and its -u USER) and VAR=value
        start = word in SHELL_BREAK or start and (
            word in ("sudo", "-u") or after_user or bool(re.match(r"^[A-Z_]+=", word)))
    return found


def shown_commands() -> list[tuple[str, list[str]]]:
    """(file:line, arguments) of every nestgate command the docs show."""
    shown = []
    for block in BLOCKS:
        if block.lang not in ("sh", ""):
            continue
        for number, line in shell_lines(block.text):
            if block.lang == "sh" or line.lstrip().startswith("$ "):
                shown += [(f"{block.file}:{block.line + number}", args)
                          for args in invocations(line)]
    for path in DOCS:
        for number, line in enumerate(path.read_text().split("\n"), 1):
            for span in re.findall(r"`((?:python3? -m )?nestgate [^`]+)`", line):
                for args in invocations(span):
                    shown.append((f"{path.relative_to(REPO)}:{number}", args))
    return shown


COMMANDS = shown_commands()
FLAG = re.compile(r"^\[?(--?[A-Za-z][\w-]*)")


@pytest.mark.parametrize("where,args", COMMANDS,
                         ids=[f"{w} nestgate {' '.join(a)}" for w, a in COMMANDS])
def test_command_and_flags_shown_exist(where, args):
    words = [a for a in args if a not in ("...", "|")]
    if args == ["..."]:
        return                                  # "python -m nestgate ...": any command
    path: list[str] = []
    text = help_of(())
    for word in words:
        if word.startswith(("-", "[")):
            break
        choices = CHOICES.findall(text)
        if choices and word in choices[0].split(","):
            path.append(word)
            text = help_of(tuple(path))
            continue
        # A command's first word must be one it offers; an argument needs a place.
        assert not (choices and len(path) <= 1), \
            f"{where}: `nestgate {' '.join(path + [word])}`: no such command " \
            f"(one of {choices[0]})"
        assert "positional arguments:" in text, \
            f"{where}: `nestgate {' '.join(path)}` takes no argument {word!r}"
        break
    assert path, f"{where}: `nestgate {' '.join(args)}` names no command"
    for arg in words:
        flag = FLAG.match(arg)
        if flag and flag.group(1) not in ("-", "--"):
            name = flag.group(1).split("=")[0]
            assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text), \
                f"{where}: `nestgate {' '.join(path)}` has no {name} (its --help:\n{text})"


def test_commands_were_found():
    assert len({tuple(a[:1]) for _, a in COMMANDS}) >= 8


# ---------------------------------------------------------------- make and set-up

MAKEFILE = (REPO / "Makefile").read_text()


def make_targets() -> set[str]:
    return set(re.findall(r"^([\w.-]+):(?!=)", MAKEFILE, re.M))


def recipe(target: str) -> str:
    return re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", MAKEFILE, re.M).group(1)


MAKES = [(f"{b.file}:{b.line + i}", m) for b in BLOCKS if b.lang in ("sh", "")
         for i, line in enumerate(b.text.split("\n"), 1)
         for m in re.findall(r"(?:^|[;&|]\s*)make ([\w.-]+)", line)] + \
        [(f"{p.relative_to(REPO)}:{n}", m) for p in DOCS
         for n, line in enumerate(p.read_text().split("\n"), 1)
         for m in re.findall(r"`make ([\w.-]+)[^`]*`", line)]


@pytest.mark.parametrize("where,target", MAKES, ids=[f"{w} make {t}" for w, t in MAKES])
def test_make_target_shown_exists(where, target):
    assert target in make_targets(), f"{where}: the Makefile has no target {target!r}"


def test_readme_set_up_is_make_serve_and_make_test_as_the_makefile_runs_them():
    [setup] = [b for b in BLOCKS if b.file == "README.md" and "make serve" in b.text]
    assert [line.split("#")[0].split() for line in setup.text.split("\n")] == \
        [["make", "serve"], ["make", "test"]]
    assert "-m nestgate serve" in recipe("serve")
    assert re.search(r"^test: debian-deps \$\(STAMP\)$", MAKEFILE, re.M)
    assert "-m pytest" in recipe("test")
    assert re.search(r"^serve: \$\(STAMP\)$", MAKEFILE, re.M)
    # the venv both create, with what pyproject.toml lists
    assert "-m venv $(VENV)" in recipe("$(STAMP)") and "'.[test,bench]'" in recipe("$(STAMP)")


def test_make_serve_serves_where_readme_says(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))     # the default's state goes there
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    [setup] = [b for b in BLOCKS if b.file == "README.md" and "make serve" in b.text]
    shown = re.search(r"http://([\d.]+):(\d+)", setup.text)
    [listener] = read_config(EMBEDDED_DEFAULT).listeners
    assert (shown.group(1), int(shown.group(2))) == (listener.host, listener.port)


def test_files_are_as_long_as_the_docs_say():
    """"[examples/home.toml](examples/home.toml), 24 lines"."""
    said = [(path, target, int(count)) for path in DOCS
            for target, count in re.findall(r"\]\(([^)#]+)\),? (\d+) lines", path.read_text())]
    assert said
    for path, target, count in said:
        lines = len((path.parent / target).read_text().splitlines())
        assert lines == count, f"{path.name}: {target} has {lines} lines, not {count}"


def debian_packages() -> set[str]:
    """The packages `make debian-deps` installs when missing."""
    return set(re.findall(r'missing="\$\$missing ([\w.+-]+)"', recipe("debian-deps")))


def test_readme_lists_the_debian_packages_make_test_installs():
    readme = (REPO / "README.md").read_text()
    listed = re.search(r"^Debian packages `make test` installs[^:]*:\n((?:.+\n)+?)\n", readme,
                       re.M)
    assert listed, "README names no list of the Debian packages `make test` installs"
    named = {re.sub(r"\s*\(.*?\)", "", item).strip(" .`\n")
             for item in re.sub(r"\s+", " ", listed.group(1)).split(",")}
    make = debian_packages()
    assert (sorted(named - make), sorted(make - named)) == ([], []), \
        "README names (first) and debian-deps installs (second) other packages"


# ---------------------------------------------------------------- Python dependencies


def requirement_name(spec: str) -> str:
    return re.match(r"^[A-Za-z0-9_.-]+(\[[\w,]+\])?", spec).group(0)


def normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pyproject_packages() -> dict[str, set[str]]:
    """normalised name (with [extra] when one is asked for) -> where: run, test, bench, ..."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    where: dict[str, set[str]] = {}
    for group, specs in [("run", project["dependencies"]),
                         *project["optional-dependencies"].items()]:
        for spec in specs:
            where.setdefault(normal(requirement_name(spec)), set()).add(group)
    return where


def readme_dependencies() -> list[tuple[str, list[str], str]]:
    """(package, the packages named "(with **...**)" beside it, line) of README's list."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Dependencies, and why\n", 1)[1].split("\n## ", 1)[0]
    return [(normal(m.group(1)), [normal(c) for c in re.findall(r"with \*\*([^*]+)\*\*",
                                                                line)], line)
            for line in section.split("\n") if (m := re.match(r"^- \*\*([^*]+)\*\*", line))]


def test_readme_has_one_dependency_line_per_python_package_and_no_other():
    """Each pyproject.toml requirement is explained once: on its own line, or beside the
    package that requires it ("**Authlib** (with **joserfc**)", "**redis** (with
    **hiredis**)" for redis[hiredis]); each line is a pyproject requirement, tagged
    (tests) or (bench) as the extra it is in, and what it says comes with a package does."""
    wanted, explained = pyproject_packages(), []
    for name, companions, line in readme_dependencies():
        base = name.split("[")[0]
        assert base in {n.split("[")[0] for n in wanted}, \
            f"README explains {name}, which pyproject.toml does not require"
        requires = {normal(requirement_name(r)) for r in importlib.metadata.requires(base) or []}
        for companion in companions:
            extra = f"{name}[{companion}]"
            assert companion in requires, f"README: {name} does not bring {companion}"
            explained += [extra] if extra in wanted else [companion] if companion in wanted \
                else []
        if not any(f"{name}[{c}]" in wanted for c in companions):
            explained.append(name)
        groups = wanted.get(explained[-1], set())
        assert groups, f"README explains {name}, which pyproject.toml does not require"
        tags = set(re.findall(r"\((tests|bench)\)", line))
        if tags:
            assert {"tests": "test", "bench": "bench"}[tags.pop()] in groups and \
                "run" not in groups, f"README's tag does not say where {name} is: {line}"
        else:
            assert "run" in groups or any(f"`{g}` extra" in line for g in groups), \
                f"README does not say {name} is in an extra: {line}"
    assert sorted(n for n in set(explained) if explained.count(n) > 1) == [], \
        "explained twice"
    assert sorted(set(wanted) - set(explained)) == [], "pyproject requires, README never says why"


# ---------------------------------------------------------------- links


def anchors(path: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces to -, repeats -1..."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose_lines(path):
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            out.add(slug if not count else f"{slug}-{count}")
    return out


def links() -> list[tuple[str, Path, str, str]]:
    found = []
    for path in DOCS:
        for number, line in prose_lines(path):
            for target in re.findall(r"\]\(([^)\s]+)\)", re.sub(r"`[^`]*`", "", line)):
                if re.match(r"^[a-z][\w+.-]*:", target):
                    continue                           # https:, mailto:
                file, _, anchor = target.partition("#")
                found.append((f"{path.relative_to(REPO)}:{number}",
                              (path.parent / file).resolve() if file else path, anchor,
                              target))
    return found


LINKS = links()


@pytest.mark.parametrize("where,target,anchor,shown", LINKS,
                         ids=[f"{w} {s}" for w, _, _, s in LINKS])
def test_relative_link_reaches_a_file_and_heading(where, target, anchor, shown):
    assert target.exists(), f"{where}: ({shown}) names no file"
    if anchor and target.suffix == ".md":
        assert anchor in anchors(target), \
            f"{where}: ({shown}): {target.name} has no heading #{anchor}"


# Repository files named in code spans: `tests/harness.py`, `base/later.py` (in the package).
NAMED_FILE = re.compile(r"`((?![./])[\w.-]+(?:/[\w.-]+)+"
                        r"\.(?:py|toml|md|service|yaml|js|json|sh))`")


def named_files() -> list[tuple[str, Path, str]]:
    return [(f"{path.relative_to(REPO)}:{number}", path, name) for path in DOCS
            for number, line in enumerate(path.read_text().split("\n"), 1)
            for name in NAMED_FILE.findall(line)]


NAMED = named_files()


@pytest.mark.parametrize("where,doc,name", NAMED, ids=[f"{w} {n}" for w, _, n in NAMED])
def test_file_named_in_the_docs_exists(where, doc, name):
    places = (REPO, REPO / "nestgate", doc.parent)
    assert any((place / name).exists() for place in places), \
        f"{where}: `{name}` is in none of " + ", ".join(str(p) for p in places)
