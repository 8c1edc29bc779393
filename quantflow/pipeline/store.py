"""The bytes under an artifact cache's URL (``quantflow.pipeline.cache``): a folder, or any fsspec file system.

``open_store(url)`` gives a ``Store`` whose paths are "/"-joined and relative to the URL's root.  A plain path or a
``file://`` URL is a ``FolderStore`` (a local disk or a shared mount); any other URL goes through fsspec
(``FsspecStore``): ``s3://bucket/prefix`` through s3fs, which hands its credentials and endpoint to botocore, so
they come from the standard AWS environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``, ``AWS_PROFILE`` with ``AWS_CONFIG_FILE`` / ``AWS_SHARED_CREDENTIALS_FILE``,
``AWS_DEFAULT_REGION`` / ``AWS_REGION``, and the endpoint of an S3-compatible service such as MinIO, Huawei OBS or
Ceph from ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``), as with the aws command.

Every write of one object is whole or absent for a reader: a folder store writes under a temporary name
(``atomic.PARTIAL`` in it) and renames, which is atomic on one file system (NFS included); an object store's PUT
is atomic.  A missing object raises FileNotFoundError; anything else a store cannot do raises OSError (or the
store's own exception: callers treat every other exception as "cannot reach the cache").
"""
from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from ..io.atomic import PARTIAL

FILE_SCHEME = "file://"


@dataclass(frozen=True)
class Item:
    """One object of a store: its path (relative to the root), size in bytes and last write (epoch seconds)."""
    path: str
    size: int
    mtime: float


class Store:
    """What the cache needs of a place to keep bytes (paths relative to the root, "/"-joined)."""
    url: str

    def read(self, path: str) -> bytes: ...
    def write(self, path: str, data: bytes) -> None: ...
    def put(self, local: Path, path: str) -> None: ...
    def get(self, path: str, local: Path) -> None: ...
    def walk(self, prefix: str = "") -> list[Item]: ...
    def remove(self, paths: list[str]) -> None: ...


def is_folder_url(url: str) -> bool:
    """Is ``url`` a folder (a path, or ``file://``) rather than another fsspec URL."""
    return url.startswith(FILE_SCHEME) or "://" not in url


def open_store(url: str) -> Store:
    """The store of ``url``.  Raises ValueError (an unknown scheme, no bucket) or ImportError (the scheme's
    package, e.g. s3fs for s3://, is not installed); nothing is contacted yet."""
    if is_folder_url(url):
        folder = url[len(FILE_SCHEME):] if url.startswith(FILE_SCHEME) else url
        if not folder:
            raise ValueError("no folder given")
        return FolderStore(Path(folder).expanduser())
    return FsspecStore(url)


class FolderStore(Store):
    def __init__(self, root: Path):
        self.root = Path(os.path.abspath(root))   # absolute, ".." folded: one name for one folder
        self.url = str(self.root)

    def _path(self, path: str) -> Path:
        return self.root / path

    @contextlib.contextmanager
    def _atomic(self, path: str):
        """A temporary path beside ``path``, renamed to it on success (unique per writer: several threads or
        processes may write the same object at once; the last rename wins, each one whole)."""
        dest = self._path(path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}{PARTIAL}{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            yield tmp
            os.replace(tmp, dest)
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()

    def read(self, path: str) -> bytes:
        return self._path(path).read_bytes()

    def write(self, path: str, data: bytes) -> None:
        with self._atomic(path) as tmp:
            tmp.write_bytes(data)

    def put(self, local: Path, path: str) -> None:
        with self._atomic(path) as tmp:
            shutil.copyfile(local, tmp)

    def get(self, path: str, local: Path) -> None:
        shutil.copyfile(self._path(path), local)

    def walk(self, prefix: str = "") -> list[Item]:
        out = []
        top = self._path(prefix)
        for folder, _, names in os.walk(top):
            for name in names:
                p = Path(folder) / name
                with contextlib.suppress(FileNotFoundError):   # removed while listed
                    st = p.stat()
                    out.append(Item(p.relative_to(self.root).as_posix(), st.st_size, st.st_mtime))
        return sorted(out, key=lambda i: i.path)

    def remove(self, paths: list[str]) -> None:
        folders = set()
        for path in paths:
            p = self._path(path)
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
            folders.update(q for q in p.parents if q != self.root and q.is_relative_to(self.root))
        for folder in sorted(folders, key=lambda q: len(q.parts), reverse=True):   # the empty folders left
            with contextlib.suppress(OSError):
                folder.rmdir()


class FsspecStore(Store):
    def __init__(self, url: str):
        import fsspec

        protocol = url.split("://", 1)[0]
        fsspec.get_filesystem_class(protocol)   # ValueError: unknown; ImportError: its package is missing
        # no instance or listing cache: other processes write the same objects, and a stale listing would hide them
        self.fs, root = fsspec.core.url_to_fs(url, skip_instance_cache=True, use_listings_cache=False)
        self.root = root.rstrip("/")
        if not self.root.strip("/"):
            raise ValueError("no bucket or folder given")
        self.url = url

    def _path(self, path: str) -> str:
        return f"{self.root}/{path}" if path else self.root

    def read(self, path: str) -> bytes:
        return self.fs.cat_file(self._path(path))

    def write(self, path: str, data: bytes) -> None:
        self.fs.pipe_file(self._path(path), data)

    def put(self, local: Path, path: str) -> None:
        self.fs.put_file(str(local), self._path(path))

    def get(self, path: str, local: Path) -> None:
        self.fs.get_file(self._path(path), str(local))

    def walk(self, prefix: str = "") -> list[Item]:
        try:
            found = self.fs.find(self._path(prefix), detail=True)
        except FileNotFoundError:
            return []
        out = []
        for name, info in found.items():
            if info.get("type", "file") != "file":
                continue
            rel = name[len(self.root):].lstrip("/") if name.startswith(self.root) else name
            out.append(Item(rel, int(info.get("size") or 0), _mtime(info)))
        return sorted(out, key=lambda i: i.path)

    def remove(self, paths: list[str]) -> None:
        if paths:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm([self._path(p) for p in paths])


def _mtime(info: dict) -> float:
    """An fsspec listing entry's last write as epoch seconds (S3: LastModified; local and memory: mtime, created)."""
    for k in ("LastModified", "mtime", "last_modified", "created"):
        v = info.get(k)
        if v is None:
            continue
        if hasattr(v, "timestamp"):
            return float(v.timestamp())
        with contextlib.suppress(TypeError, ValueError):
            return float(v)
    return 0.0
