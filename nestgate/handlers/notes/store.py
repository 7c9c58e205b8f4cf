"""Notes on disk: `<dir>/<slug>.md`, YAML front matter (title, date, tags, draft) + Markdown.

Owns reading, parsing and atomically writing note files, and the generation counter
shared by all workers. Every function here blocks on the disk: callers on the event
loop run them in the executor. Nothing here knows about HTTP.

Atomic write: a temp file in the same directory, fsync, rename over the note (or link
for create-only), fsync the directory. On any failure up to the rename the temp file is
removed and the old note is untouched; a directory fsync that fails after it reports
the note as changed but unconfirmed. The generation counter is bumped under an exclusive lock:
a worker that reads a different value than the one its pages were rendered at knows
they are stale.
"""

from __future__ import annotations

import datetime as dt
import errno
import fcntl
import logging
import mmap
import os
import re
import threading
from dataclasses import dataclass, field

import yaml

from nestgate.base.errors import HandlerError

SLUG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,99}\Z")     # \Z: "$" lets a newline end it
# Each tag is a link on the note's page, in lists and the feed, and a page of its own:
# 100,000 tags made 5 MB pages. A note sent through the API with more is refused (422);
# one edited on disk keeps the first MAX_TAGS that fit (see `fit_tags`).
MAX_TAGS = 32
TAG_MAX_CHARS = 64
RESERVED_SLUGS = frozenset({"page", "tag", "feed"})
GENERATION_FILE = ".nestgate-generation"
_SUFFIX = ".md"
log = logging.getLogger("nestgate.notes")
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)    # libyaml when present


class StoreError(HandlerError):
    """A note could not be saved or removed; `status` is the HTTP status it maps to."""


class BadNote(ValueError):
    """A note's content is invalid; `field` names the culprit."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass
class Note:
    slug: str
    title: str
    date: dt.datetime
    tags: tuple[str, ...] = ()
    draft: bool = False
    body: str = ""
    summary: str = ""
    signature: tuple = ()
    html: str | None = field(default=None, repr=False)   # rendered body, filled lazily

    @property
    def iso_date(self) -> str:
        return self.date.isoformat()

    def as_json(self, with_body: bool = True) -> dict:
        out = {"slug": self.slug, "title": self.title, "date": self.iso_date,
               "tags": list(self.tags), "draft": self.draft}
        if self.summary:
            out["summary"] = self.summary
        if with_body:
            out["body"] = self.body
        return out


# ------------------------------------------------------------ parsing


def split_front_matter(text: str) -> tuple[dict, str]:
    """(metadata, body) from "---\\n<yaml>\\n---\\n<markdown>"; no front matter -> {}."""
    if not (text.startswith("---\n") or text.startswith("---\r\n")):
        return {}, text
    match = re.search(r"^---[ \t]*\r?$", text[4:], re.MULTILINE)
    if match is None:
        raise BadNote("front_matter", "front matter is not closed by a --- line")
    raw = text[4:4 + match.start()]
    body = text[4 + match.end():].lstrip("\r\n")
    try:
        meta = yaml.load(raw, Loader=_YAML_LOADER) or {}
    except yaml.YAMLError as exc:
        raise BadNote("front_matter", f"front matter is not valid YAML: {exc}") from None
    if not isinstance(meta, dict):
        raise BadNote("front_matter", "front matter must be a YAML mapping")
    return meta, body


def parse_date(value, field_name: str = "date") -> dt.datetime:
    """date, datetime or ISO 8601 text -> aware datetime (naive means UTC, as Hugo)."""
    if isinstance(value, dt.datetime):
        when = value
    elif isinstance(value, dt.date):
        when = dt.datetime(value.year, value.month, value.day)
    elif isinstance(value, str):
        try:
            when = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise BadNote(field_name, "an ISO 8601 date such as 2026-06-20T16:05:14+08:00") \
                from None
    else:
        raise BadNote(field_name, "an ISO 8601 date such as 2026-06-20T16:05:14+08:00")
    return when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)


def make_note(slug: str, meta: dict, body: str, fallback_date: dt.datetime | None = None,
              signature: tuple = ()) -> Note:
    """A validated Note; BadNote names the first bad field."""
    if not SLUG.match(slug) or slug in RESERVED_SLUGS:
        raise BadNote("slug", "1-100 letters, digits, - or _, starting with a letter or "
                      "digit, and not page, tag or feed")
    title = meta.get("title", slug)
    if not isinstance(title, str) or not title.strip() or len(title) > 300:
        raise BadNote("title", "a non-empty string of at most 300 characters")
    if "date" in meta and meta["date"] is not None:
        date = parse_date(meta["date"])
    else:
        date = fallback_date or dt.datetime.now().astimezone().replace(microsecond=0)
    tags = meta.get("tags", [])
    if isinstance(tags, str):
        tags = [tags]
    if not isinstance(tags, list) or len(tags) > MAX_TAGS or not all(
            _valid_tag(t) and len(t) <= TAG_MAX_CHARS for t in tags):
        raise BadNote("tags", f"a list of at most {MAX_TAGS} tags (strings without /, at "
                      f"most {TAG_MAX_CHARS} characters each)")
    draft = meta.get("draft", False)
    if not isinstance(draft, bool):
        raise BadNote("draft", "true or false")
    summary = meta.get("summary", meta.get("description", ""))
    if not isinstance(summary, str):
        raise BadNote("summary", "a string")
    if not isinstance(body, str):
        raise BadNote("body", "Markdown text")
    return Note(slug, title.strip(), date, tuple(dict.fromkeys(t.strip() for t in tags)),
                draft, body, summary.strip(), signature)


def _valid_tag(tag) -> bool:
    return isinstance(tag, str) and bool(tag.strip()) and "/" not in tag


def fit_tags(meta: dict, where: str) -> None:
    """A note file edited outside the API may hold more tags, or longer ones, than the
    API accepts: the over-long ones are left out and the first MAX_TAGS others kept,
    and the log says so, rather than the note disappearing from the site."""
    tags = meta.get("tags")
    if not isinstance(tags, list):
        return
    fitting = [t for t in tags if not _valid_tag(t) or len(t) <= TAG_MAX_CHARS]
    if len(fitting) > MAX_TAGS or len(fitting) < len(tags):
        log.warning("%s: %d tags, %d of them over %d characters: the first %d that fit "
                    "are kept", where, len(tags), len(tags) - len(fitting), TAG_MAX_CHARS,
                    min(len(fitting), MAX_TAGS))
        meta["tags"] = fitting[:MAX_TAGS]


def serialize(note: Note) -> bytes:
    meta = {"title": note.title, "date": note.iso_date}
    if note.tags:
        meta["tags"] = list(note.tags)
    meta["draft"] = note.draft
    if note.summary:
        meta["summary"] = note.summary
    front = yaml.safe_dump(meta, sort_keys=False, allow_unicode=True, default_flow_style=None)
    body = note.body if note.body.endswith("\n") or not note.body else note.body + "\n"
    return f"---\n{front}---\n\n{body}".encode("utf-8")


# ------------------------------------------------------------ the store


class NoteStore:
    """One notes directory. Safe to share between threads of one process."""

    def __init__(self, directory: str) -> None:
        self.dir = os.path.realpath(directory)
        self._notes: dict[str, Note] = {}
        self.scanned_signature: tuple | None = None     # the directory as `scan` saw it
        self._checked: tuple | None = None              # ... and as the last check did
        self._lock = threading.Lock()
        # slug -> (inode, mtime, size) of the file last logged as skipped: one warning
        # per version of a bad file, however often it is read again.
        self._skipped: dict[str, tuple] = {}
        self._generation = _Generation(os.path.join(self.dir, GENERATION_FILE))

    # ---- the shared generation
    def generation(self) -> int:
        return self._generation.read()

    def _bump(self) -> None:
        self._generation.bump()

    def changed_outside(self) -> None:
        """Someone edited the directory without nestgate (an editor, git pull): this
        process's pages are stale; each worker notices this by itself."""
        self._generation.bump_local()

    def notice_outside_edits(self) -> None:
        """Compare the directory with what `scan` last read, and call `changed_outside`
        once per edit found. Each worker runs this on a timer (off its loop), so an
        edit is seen within the timer's interval, whether requests come or not."""
        try:
            signature = self.signature()
        except OSError:
            return
        # Compared with what the index was built from, so an edit made while a check
        # was queued is not taken as the baseline; and with the last check, so one
        # edit is counted once until the next scan.
        scanned = self.scanned_signature
        if scanned is not None and signature != scanned and signature != self._checked:
            self.changed_outside()
        self._checked = signature

    def forget(self, slug: str) -> None:
        """Read `slug` again on the next scan, whatever its file's (inode, mtime, size)
        say (another machine wrote it), and make this process's pages stale."""
        with self._lock:
            self._notes.pop(slug, None)
        self.changed_outside()

    def reread(self) -> list[str]:
        """Forget every note read so far, so the next scan parses each file again, even
        one edited in a way its (inode, mtime, size) does not show (a tool that keeps
        the mtime); this process's pages are then stale. The slugs forgotten."""
        with self._lock:
            slugs = list(self._notes)
            self._notes = {}
            self.scanned_signature = None
        self.changed_outside()
        return slugs

    # ---- reading
    def path(self, slug: str) -> str:
        return os.path.join(self.dir, slug + _SUFFIX)

    def scan(self) -> list[Note]:
        """Every readable note, re-reading only files whose (inode, mtime, size) changed.
        A file with broken front matter is skipped (it cannot break the site), with a
        warning once per version of it (`_skip`)."""
        with self._lock:
            found: dict[str, Note] = {}
            seen = []
            with os.scandir(self.dir) as entries:
                for entry in entries:
                    name = entry.name
                    if not name.endswith(_SUFFIX) or name.startswith("."):
                        continue
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    seen.append((name, st.st_ino, st.st_mtime_ns, st.st_size))
                    slug = name[:-len(_SUFFIX)]
                    if not SLUG.match(slug) or slug in RESERVED_SLUGS:
                        continue
                    if not entry.is_file(follow_symlinks=False):
                        continue
                    sig = (st.st_ino, st.st_mtime_ns, st.st_size)
                    known = self._notes.get(slug)
                    if known is not None and known.signature == sig:
                        found[slug] = known
                        continue
                    note = self._read_file(slug, st)
                    if note is not None:
                        found[slug] = note
            self._notes = found
            present = {row[0] for row in seen}        # a bad file gone: forgotten
            self._skipped = {slug: sig for slug, sig in self._skipped.items()
                             if slug + _SUFFIX in present}
            seen.sort()
            self.scanned_signature = tuple(seen)
            return list(found.values())

    def signature(self) -> tuple:
        """Cheap fingerprint of the directory, to notice edits made outside nestgate."""
        sigs = []
        with os.scandir(self.dir) as entries:
            for entry in entries:
                if entry.name.endswith(_SUFFIX) and not entry.name.startswith("."):
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    sigs.append((entry.name, st.st_ino, st.st_mtime_ns, st.st_size))
        sigs.sort()
        return tuple(sigs)

    def read(self, slug: str) -> Note | None:
        try:
            st = os.stat(self.path(slug), follow_symlinks=False)
        except OSError:
            return None
        return self._read_file(slug, st)

    def _read_file(self, slug: str, st) -> Note | None:
        signature = (st.st_ino, st.st_mtime_ns, st.st_size)
        try:
            fd = os.open(self.path(slug), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            with os.fdopen(fd, "rb") as f:
                text = f.read().decode("utf-8")
        except OSError:
            return None
        except UnicodeDecodeError as exc:
            self._skip(slug, signature, f"not UTF-8 text (byte {exc.start}: {exc.reason})")
            return None
        try:
            meta, body = split_front_matter(text)
            fit_tags(meta, self.path(slug))
            fallback = dt.datetime.fromtimestamp(st.st_mtime, dt.timezone.utc)
            note = make_note(slug, meta, body, fallback, signature)
        except BadNote as exc:
            self._skip(slug, signature, f"{exc.field}: {exc}")
            return None
        self._skipped.pop(slug, None)
        return note

    def _skip(self, slug: str, signature: tuple, why: str) -> None:
        """Say once per version of a note file why it is left off the site: it cannot
        break the site, and nobody would know why it is missing. A bad file is read
        again at each scan (an API list), and its warning is not repeated."""
        if self._skipped.get(slug) != signature:
            self._skipped[slug] = signature
            log.warning("%s: skipped, not shown on the site: %s", self.path(slug),
                        " ".join(why.split()))          # YAML's message spans lines

    # ---- writing
    def write(self, note: Note, create_only: bool = False) -> bool:
        """Save atomically; True when the note did not exist before. With `create_only`
        an existing note is never replaced: FileExistsError instead."""
        data = serialize(note)
        final = self.path(note.slug)
        try:
            fd = _mkstemp(self.dir, note.slug)
        except OSError as exc:
            raise _storage_error("save", exc) from None
        tmp = fd[1]
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd[0], view):]
                os.fsync(fd[0])
                st = os.fstat(fd[0])          # the note's inode once renamed into place
            finally:
                os.close(fd[0])
            if create_only:
                os.link(tmp, final)            # fails with EEXIST: never replaces
                os.unlink(tmp)
                created = True
            else:
                created = not os.path.lexists(final)
                os.replace(tmp, final)
        except FileExistsError:
            _unlink_quietly(tmp)
            raise
        except OSError as exc:
            _unlink_quietly(tmp)
            raise _storage_error("save", exc) from None
        self._remember(note, st)
        self._bump()
        _confirm_on_disk(self.dir, "saved")
        return created

    def _remember(self, note: Note, st) -> None:
        """The note as it now is on disk, so the next `scan` need not read it back."""
        body = note.body if note.body.endswith("\n") or not note.body else note.body + "\n"
        saved = Note(note.slug, note.title, note.date, note.tags, note.draft, body,
                     note.summary, (st.st_ino, st.st_mtime_ns, st.st_size))
        with self._lock:
            self._notes[note.slug] = saved

    def delete(self, slug: str) -> bool:
        try:
            os.unlink(self.path(slug))
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise _storage_error("delete", exc) from None
        with self._lock:
            self._notes.pop(slug, None)
        self._bump()
        _confirm_on_disk(self.dir, "deleted")
        return True


class _Generation:
    """An 8-byte counter in a memory-mapped file: reading it is a memory read, so every
    request can afford it; bumping it takes an exclusive flock."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._mm = None
        self._fd = -1
        self._fd_pid = os.getpid()      # the process that opened `_fd`
        self._local = 0
        try:
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            if os.fstat(self._fd).st_size < 8:
                fcntl.flock(self._fd, fcntl.LOCK_EX)
                try:
                    if os.fstat(self._fd).st_size < 8:
                        os.ftruncate(self._fd, 8)
                finally:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)
            self._mm = mmap.mmap(self._fd, 8)
        except OSError:
            # A read-only notes directory: nothing here can write notes either, so a
            # private counter (bumped by the directory check) is all that is needed.
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def read(self) -> int:
        mm = self._mm
        return self._local if mm is None else int.from_bytes(mm[:8], "little") + self._local

    def bump(self) -> None:
        if self._mm is None:
            self._local += 1
            return
        fd = self._own_fd()
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            value = int.from_bytes(self._mm[:8], "little") + 1
            self._mm[:8] = value.to_bytes(8, "little")
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def _own_fd(self) -> int:
        """A descriptor of the file this process opened. One inherited through fork (a
        store built in the supervisor, nestgate.sites.shared) shares its open file,
        and so its flock, with every other worker: their bumps would not exclude each
        other. The mapping needs no reopening: a shared mapping stays shared."""
        if self._fd_pid != os.getpid():
            self._fd = os.open(self._path, os.O_RDWR | os.O_CLOEXEC)
            self._fd_pid = os.getpid()
        return self._fd

    def bump_local(self) -> None:
        """This process saw a change made outside nestgate (an editor, git pull)."""
        self._local += 1


def _mkstemp(directory: str, slug: str) -> tuple[int, str]:
    for attempt in range(100):
        name = os.path.join(directory, f".{slug}.{os.getpid()}.{attempt}.tmp")
        try:
            return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644), name
        except FileExistsError:
            continue
    raise OSError(errno.EEXIST, "no free temporary file name")


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _confirm_on_disk(directory: str, done: str) -> None:
    """fsync the directory after a rename or unlink. The change is visible by then,
    and the generation was bumped so that every worker serves it; a failure here
    means only that it may not survive a crash, and the client is told so."""
    try:
        _fsync_dir(directory)
    except OSError as exc:
        raise StoreError(500, f"the note was {done}, but the disk did not confirm it: "
                              f"{exc.strerror or exc}") from None


def _storage_error(action: str, exc: OSError) -> StoreError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StoreError(507, f"could not {action} the note: the disk is full")
    return StoreError(500, f"could not {action} the note: {exc.strerror or exc}")
