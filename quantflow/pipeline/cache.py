"""The shared artifact cache: keyed stages' artifact folders kept under one URL, so that a build on any machine
pulls what another already built (keys are content hashes and the same everywhere: ``quantflow.pipeline.keys``).

Which cache a build uses (``resolve``): an explicit override (``quantflow build --cache URL``; False for
``--no-cache``), else ``$QUANTFLOW_CACHE`` (``off`` turns it off), else the configuration's ``[cache] url`` (a
relative folder is read against the configuration file's folder); none of them: no cache.  The URL is a folder (a
shared mount) or any fsspec URL such as ``s3://bucket/prefix`` (``quantflow.pipeline.store`` says where the
credentials and the endpoint come from).

An entry is ``<root>/<stage>/<key>/``: ``blobs/<sha256>``, each file's content named by its own SHA-256, and
``manifest.json``, written last, naming every file of the artifact folder with its SHA-256 and size.  The manifest
is the commit point: an entry without one is not there (a push killed half-way leaves only blobs), and since a
pusher writes every blob its manifest names before the manifest itself, any manifest a reader finds names a whole
set; two runners pushing one key at once each write whole blobs and a whole manifest, and the last manifest wins.
``used`` holds the time of the last pull (an entry's age, for ``prune``, counts from its last push or pull).

A pull (``ArtifactCache.pull``) downloads into a temporary folder beside the stage's folder (a name
``quantflow.io.atomic.sweep`` removes), checks every file's SHA-256 and size against the manifest, then moves the
files into place; the caller writes the stage's completion marker last, so a build killed mid-pull leaves nothing
taken as done.  A file that does not match, or is missing, is a warning naming the file and the entry: the entry
is not used (nor tried again by this process), the stage runs, and its push replaces the entry.  A push
(``ArtifactCache.push``) uploads a completed folder unless a sound entry is already there (the first whole entry
of a key stays: its artifacts are as good as any other's).  A cache that cannot be read or written is a warning,
never a failed build: the build goes on without it.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..errors import ConfigError
from ..io.atomic import PARTIAL
from ..io.digest import file_sha256
from .store import Item, Store, is_folder_url, open_store

CACHE_ENV = "QUANTFLOW_CACHE"
OFF = "off"                 # $QUANTFLOW_CACHE=off (or --cache off): no cache
MANIFEST = "manifest.json"
BLOBS = "blobs"
USED = "used"
FORMAT = 1                  # the manifest's layout
GRACE_S = 3600.0            # prune leaves a manifest-less entry (a push under way) alone for this long

# entries found damaged in this process ((url, stage, key)): not pulled again; their stage's push replaces them
_refused: set[tuple[str, str, str]] = set()


def warn(text: str) -> None:
    print(f"quantflow: warning: cache: {text}", file=sys.stderr, flush=True)


def human_size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


# ----------------------------------------------------------------------------------------------- which cache

def choose(override, cfg=None) -> tuple[str, str] | None:
    """The cache URL a build uses and where it was given (for messages), or None: ``override`` (a URL or path;
    False: none; None: not given), else $QUANTFLOW_CACHE, else ``cfg.cache.url`` (relative to the
    configuration's folder).  The value ``off`` means none wherever it is given."""
    if override is False:
        return None
    if override is not None and override is not True:
        url, where = os.fspath(override), "--cache"
    elif os.environ.get(CACHE_ENV):
        url, where = os.environ[CACHE_ENV], f"${CACHE_ENV}"
    elif cfg is not None and cfg.cache.url:
        url, where = cfg.cache.url, "cache.url"
        if is_folder_url(url) and not url.startswith("file://"):
            url = str(cfg.path(Path(url).expanduser()))
    else:
        return None
    url = url.strip()
    return None if url.lower() == OFF else (url, where)


def resolve(override, cfg=None) -> str | None:
    """The cache URL a build uses (``choose``), None for none."""
    chosen = choose(override, cfg)
    return chosen[0] if chosen else None


def open_cache(override, cfg=None, config_file: Path | None = None) -> "ArtifactCache | None":
    """The cache a build uses (``choose``), None for none.  A URL that cannot name a cache (an unknown scheme, no
    bucket, the scheme's package not installed) raises ConfigError naming where it was given (``cache.url`` with
    the configuration file, ``--cache`` or $QUANTFLOW_CACHE); nothing is contacted yet."""
    chosen = choose(override, cfg)
    if chosen is None:
        return None
    url, where = chosen
    try:
        return ArtifactCache(url)
    except ImportError as err:
        hint = " (pip install 'quantflow-ascend[s3]')" if url.startswith(("s3://", "s3a://")) else ""
        problem = f"needs a package that is not installed: {err.name or err}{hint}"
    except ValueError as err:
        problem = f"is not a folder or fsspec URL: {err}"
    prefix = f"{config_file or (cfg.root if cfg is not None else '')}: " if where == "cache.url" else ""
    raise ConfigError(f"{prefix}{where} {url!r} {problem}") from None


# ----------------------------------------------------------------------------------------------- the cache

@dataclass
class Entry:
    """One entry as a listing shows it (``ArtifactCache.entries``)."""
    stage: str
    key: str
    size: int                   # bytes stored (blobs, manifest, used)
    mtime: float                # last push or pull (epoch seconds)
    items: list[Item]
    complete: bool              # has a manifest
    files: int | None = None    # the files its manifest names (when read)

    @property
    def prefix(self) -> str:
        return f"{self.stage}/{self.key}"


class DamagedEntry(Exception):
    """An entry whose manifest is unreadable or whose file does not match it (the message names the file)."""


class ArtifactCache:
    """The cache at one URL: pull and push for a build, and the listing, check and pruning ``quantflow cache``
    does.  Raises ValueError / ImportError for a URL that names no cache (``open_cache`` turns them into a
    ConfigError)."""

    def __init__(self, url: str, store: Store | None = None):
        self.store = store or open_store(url)
        self.url = self.store.url   # a folder made absolute: the same cache named alike in every message
        self.readable = self.writable = True   # cleared, with a warning, once the cache cannot be reached

    # ------------------------------------------------------------------------------------------- a build's side
    def pull(self, stage: str, key: str, folder: Path) -> bool:
        """Put the cached entry ``stage``/``key`` into ``folder`` (the stage's artifact folder), every file checked;
        True when the files are in place (the caller then writes the completion marker).  False, with nothing
        taken, on a miss, a damaged entry (a warning naming the file) or a cache that cannot be read (a warning)."""
        if not self.readable or (self.url, stage, key) in _refused:
            return False
        folder = Path(folder)
        try:
            manifest = self._manifest(stage, key)
            if manifest is None:
                return False
            scratch = folder.parent / f".{key}{PARTIAL}{os.getpid()}.d"
            shutil.rmtree(scratch, ignore_errors=True)
            try:
                self._fetch(stage, key, manifest, scratch)
                _move_into(scratch, folder, manifest["files"])
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
        except DamagedEntry as err:
            _refused.add((self.url, stage, key))
            warn(f"{err}; not using it: {stage} runs here and its push replaces the entry")
            return False
        except Exception as err:  # noqa: BLE001  (any failure of the store: the build goes on without the cache)
            self._unreachable("read", err)
            return False
        try:
            self.store.write(f"{stage}/{key}/{USED}", f"{time.time():.0f}\n".encode())
        except Exception:  # noqa: BLE001  (a read-only cache still serves pulls)
            pass
        return True

    def push(self, stage: str, key: str, folder: Path) -> bool:
        """Upload the completed artifact folder ``folder`` as entry ``stage``/``key``, its manifest last; True when
        pushed.  A sound entry already there is kept (False); a damaged one (its manifest unreadable, or found
        damaged by a pull of this process) is replaced.  A cache that cannot be written is a warning (False)."""
        if not self.writable:
            return False
        try:
            if (self.url, stage, key) not in _refused:
                try:
                    if self._manifest(stage, key) is not None:
                        return False
                except DamagedEntry:
                    pass   # an unreadable manifest: replaced below
            files, blobs = {}, {}
            for p in sorted(Path(folder).rglob("*")):
                rel = p.relative_to(folder).as_posix()
                if p.is_file() and not any(part.startswith(".") for part in PurePosixPath(rel).parts):
                    digest = file_sha256(p)
                    files[rel] = {"sha256": digest, "size": p.stat().st_size}
                    blobs.setdefault(digest, p)
            for digest, p in blobs.items():
                self.store.put(p, f"{stage}/{key}/{BLOBS}/{digest}")
            manifest = {"format": FORMAT, "stage": stage, "key": key, "pushed": time.time(),
                        "host": socket.gethostname(), "files": files}
            text = json.dumps(manifest, indent=1, sort_keys=True) + "\n"
            self.store.write(f"{stage}/{key}/{MANIFEST}", text.encode())   # the commit point: last
        except Exception as err:  # noqa: BLE001
            self._unreachable("write", err)
            return False
        _refused.discard((self.url, stage, key))
        return True

    def _unreachable(self, what: str, err: Exception) -> None:
        text = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
        if what == "read":
            self.readable = self.writable = False
            warn(f"cannot read {self.url} ({text}); this build goes on without the cache")
        else:
            self.writable = False
            warn(f"cannot write to {self.url} ({text}); this build goes on without pushing to it")

    # ------------------------------------------------------------------------------------------- entries
    def holds(self, stage: str, key: str) -> bool:
        """Does the cache hold an entry (a manifest) for ``stage`` under ``key`` (its files are checked on a pull)."""
        return self._manifest(stage, key) is not None

    def _manifest(self, stage: str, key: str) -> dict | None:
        """The entry's manifest, None when there is none (no entry); DamagedEntry when it is not one."""
        where = f"{self.url}: {stage}/{key}/{MANIFEST}"
        try:
            data = self.store.read(f"{stage}/{key}/{MANIFEST}")
        except FileNotFoundError:
            return None
        try:
            m = json.loads(data)
            files = m["files"]
            if m.get("format") != FORMAT or not isinstance(files, dict):
                raise ValueError(f"format {m.get('format')!r}, this quantflow reads {FORMAT}")
            for rel, info in files.items():
                _check_name(rel)
                if not (isinstance(info.get("sha256"), str) and len(info["sha256"]) == 64
                        and isinstance(info.get("size"), int)):
                    raise ValueError(f"{rel}: no sha256 and size")
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise DamagedEntry(f"the entry {stage}/{key} in {self.url} has a damaged manifest ({where}: {err})") \
                from None
        return m

    def _fetch(self, stage: str, key: str, manifest: dict, into: Path) -> None:
        """Download every file the manifest names into ``into``, each checked; DamagedEntry names the first file
        that is missing or does not match."""
        into.mkdir(parents=True, exist_ok=True)
        entry = f"the entry {stage}/{key} in {self.url}"
        for rel, info in sorted(manifest["files"].items()):
            dest = into / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                self.store.get(f"{stage}/{key}/{BLOBS}/{info['sha256']}", dest)
            except FileNotFoundError:
                raise DamagedEntry(f"{entry} is damaged: its file {rel} is missing") from None
            size, digest = dest.stat().st_size, file_sha256(dest)
            if digest != info["sha256"] or size != info["size"]:
                raise DamagedEntry(f"{entry} is damaged: its file {rel} does not match its manifest (sha256 "
                                   f"{digest[:16]}..., {size} bytes; the manifest says {info['sha256'][:16]}..., "
                                   f"{info['size']} bytes)")

    def entries(self, read_manifests: bool = False) -> list[Entry]:
        """Every entry (complete or not), oldest first; with ``read_manifests``, each complete one's file count
        (None where its manifest is unreadable)."""
        groups: dict[tuple[str, str], list[Item]] = {}
        for item in self.store.walk():
            parts = item.path.split("/")
            if len(parts) >= 3:
                groups.setdefault((parts[0], parts[1]), []).append(item)
        out = []
        for (stage, key), items in groups.items():
            names = {i.path.split("/", 2)[2]: i for i in items}
            complete = MANIFEST in names
            stamps = [names[n].mtime for n in (MANIFEST, USED) if n in names] if complete else [i.mtime for i in items]
            e = Entry(stage, key, sum(i.size for i in items), max(stamps), items, complete)
            if read_manifests and complete:
                try:
                    m = self._manifest(stage, key)
                    e.files = len(m["files"]) if m else None
                except DamagedEntry:
                    e.files = None
            out.append(e)
        return sorted(out, key=lambda e: (e.mtime, e.stage, e.key))

    def verify(self, entry: Entry) -> str | None:
        """Check every file of a complete entry; None when sound, else what is wrong (naming the file)."""
        try:
            manifest = self._manifest(entry.stage, entry.key)
            if manifest is None:
                return f"the entry {entry.prefix} in {self.url} has no manifest (a push under way, or one killed)"
            with tempfile.TemporaryDirectory(prefix="quantflow-verify-") as tmp:
                self._fetch(entry.stage, entry.key, manifest, Path(tmp))
        except DamagedEntry as err:
            return str(err)
        return None

    def remove(self, entry: Entry) -> None:
        """Remove a whole entry, its manifest first (a reader never takes what is left of it)."""
        manifest = f"{entry.prefix}/{MANIFEST}"
        paths = [i.path for i in entry.items]
        if manifest in paths:
            self.store.remove([manifest])
        self.store.remove([p for p in paths if p != manifest])

    def prune(self, older_than_days: float | None, max_size: int | None, now: float | None = None) -> list[Entry]:
        """Remove the entries not pushed or pulled for ``older_than_days``, then the oldest until the total is at
        most ``max_size`` bytes; also what killed pushes left (entries without a manifest, blobs no manifest names)
        once older than ``GRACE_S``.  The entries removed, oldest first."""
        now = time.time() if now is None else now
        removed, kept = [], []
        for e in self.entries():
            if not e.complete:
                if now - e.mtime > GRACE_S:
                    self.remove(e)
                continue
            if older_than_days is not None and now - e.mtime > older_than_days * 86400:
                self.remove(e)
                removed.append(e)
            else:
                kept.append(e)
        for e in kept:
            self._drop_unnamed_blobs(e, now)
        total = sum(e.size for e in kept)
        while max_size is not None and kept and total > max_size:
            e = kept.pop(0)
            self.remove(e)
            removed.append(e)
            total -= e.size
        return removed

    def _drop_unnamed_blobs(self, e: Entry, now: float) -> None:
        """Blobs of an entry that its manifest no longer names (a replaced push's), or partial objects of a killed
        writer, once older than the grace period."""
        try:
            m = self._manifest(e.stage, e.key)
        except DamagedEntry:
            return
        if m is None:
            return
        named = {f"{e.prefix}/{BLOBS}/{f['sha256']}" for f in m["files"].values()}
        stale = [i for i in e.items if now - i.mtime > GRACE_S
                 and ((i.path.startswith(f"{e.prefix}/{BLOBS}/") and i.path not in named) or PARTIAL in i.path)]
        if stale:
            self.store.remove([i.path for i in stale])
            e.items = [i for i in e.items if i not in stale]
            e.size -= sum(i.size for i in stale)


def _check_name(rel: str) -> None:
    """A manifest's file name must stay inside the artifact folder."""
    p = PurePosixPath(rel)
    if not rel or p.is_absolute() or ".." in p.parts or any(part.startswith(".") for part in p.parts) or "\\" in rel:
        raise ValueError(f"file name {rel!r} is not a plain relative path")


def _move_into(scratch: Path, folder: Path, files: dict) -> None:
    """The checked files into the stage folder (each rename atomic), after removing what an unfinished run left
    there that the entry does not have."""
    folder.mkdir(parents=True, exist_ok=True)
    for p in sorted(folder.rglob("*"), reverse=True):
        rel = p.relative_to(folder).as_posix()
        if p.is_file() and rel not in files and not any(part.startswith(".") for part in PurePosixPath(rel).parts):
            p.unlink()
    for rel in sorted(files):
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        os.replace(scratch / rel, folder / rel)
