"""Content digests: of a file, of a folder's files, and of quantflow's own installed source."""
from __future__ import annotations

import hashlib
import importlib
from pathlib import Path

# the packages whose files make quantflow's behaviour: the stage table and the AIPP templates are installed from
# their own source folders (tasks/, aipp_templates/) into the package
SOURCE_PACKAGES = ("quantflow", "quantflow.tasks", "quantflow.aipp_templates")
SOURCE_SUFFIXES = (".py", ".cfg")


def file_sha256(path: Path | str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def folder_digest(folder: Path | str, suffixes) -> str:
    """Hash of every file whose suffix is one of ``suffixes`` (lower case) under ``folder``: relative path and
    content."""
    h = hashlib.sha256()
    folder = Path(folder)
    if folder.is_dir():
        for p in sorted(folder.rglob("*")):
            if p.is_file() and p.suffix.lower() in suffixes:
                h.update(p.relative_to(folder).as_posix().encode())
                h.update(file_sha256(p).encode())
    return h.hexdigest()


def source_digest() -> str:
    """Hash of quantflow's source files as installed (``SOURCE_PACKAGES``), each named by its package and its path
    in it, so that a wheel and an editable install of the same source give the same digest."""
    roots = {name: Path(importlib.import_module(name).__path__[0]).resolve() for name in SOURCE_PACKAGES}
    files: dict[str, Path] = {}
    for name, root in roots.items():
        for p in root.rglob("*"):
            if p.suffix not in SOURCE_SUFFIXES or "__pycache__" in p.parts or not p.is_file():
                continue
            # a file belongs to the innermost package holding it (a wheel nests quantflow/tasks/ in quantflow/)
            owner = max((n for n, r in roots.items() if p.resolve().is_relative_to(r)), key=lambda n: len(str(roots[n])))
            if owner == name:
                files[f"{name}/{p.resolve().relative_to(root).as_posix()}"] = p
    h = hashlib.sha256()
    for key in sorted(files):
        h.update(key.encode())
        h.update(files[key].read_bytes())
    return h.hexdigest()
