"""Artifacts appear whole or not at all.

Every file the pipeline writes is written under a temporary name in its own folder
(``.<name>.partial-<pid>``) and renamed into place (``os.replace``: atomic on one file system), so a
build killed at any moment leaves complete files under their real names and, at worst, partial
files under names no stage reads (``sweep`` removes them).  A stage's completion marker is its last
write, so a stage killed before it is simply run again.

``.npz`` archives are written with fixed zip timestamps (1980-01-01), so equal arrays give equal bytes.

Testing hook: with ``QUANTFLOW_TEST_KILL_AT=<text>`` in the environment the process SIGKILLs itself at
the first atomic write whose destination path contains ``<text>``, after writing the temporary file
and before renaming it (``<text>|after``: right after the rename); ``QUANTFLOW_TEST_WRITE_LOG=<file>``
appends the path of every completed write.  Both are for tests/test_kill.py only.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import zipfile
from pathlib import Path

import numpy as np

PARTIAL = ".partial-"
_writes = 0


def _hook(path: Path, moment: str) -> None:
    spec = os.environ.get("QUANTFLOW_TEST_KILL_AT")
    if not spec:
        return
    text, _, when = spec.partition("|")
    if text in str(path) and (when or "before") == moment:
        os.kill(os.getpid(), signal.SIGKILL)


@contextlib.contextmanager
def atomic_path(path: Path | str, in_folder: bool = False):
    """Yields a temporary path beside ``path``; on success it is renamed to ``path``, on an exception removed.
    ``in_folder``: the temporary path has ``path``'s own name, inside a temporary folder (for writers that
    derive the file name themselves, e.g. MindSpore's export appending ".mindir")."""
    global _writes
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(f".{path.name}{PARTIAL}{os.getpid()}" + (".d" if in_folder else ""))
    tmp = scratch / path.name if in_folder else scratch
    if in_folder:
        scratch.mkdir(exist_ok=True)
    try:
        yield tmp
        _writes += 1
        _hook(path, "before")
        os.replace(tmp, path)
    finally:
        if scratch.is_dir():
            shutil.rmtree(scratch, ignore_errors=True)
        elif scratch.exists():
            with contextlib.suppress(OSError):
                scratch.unlink()
    _hook(path, "after")
    log = os.environ.get("QUANTFLOW_TEST_WRITE_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"{_writes} {path}\n")


def write_bytes(path: Path | str, data: bytes) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text(path: Path | str, text: str) -> Path:
    return write_bytes(path, text.encode("utf-8"))


def write_json(path: Path | str, data, **kwargs) -> Path:
    return write_text(path, json.dumps(data, **({"indent": 2, "sort_keys": True} | kwargs)) + "\n")


def copy_file(src: Path | str, dst: Path | str) -> Path:
    with atomic_path(dst) as tmp:
        shutil.copyfile(src, tmp)
    return Path(dst)


def save_npz(path: Path | str, arrays: dict[str, np.ndarray]) -> Path:
    """``np.savez`` (loadable by ``np.load``), reproducible byte for byte."""
    with atomic_path(path) as tmp:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
            for name, value in arrays.items():
                info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
                with z.open(info, "w", force_zip64=True) as f:
                    np.lib.format.write_array(f, np.asanyarray(value), allow_pickle=False)
    return Path(path)


def save_onnx(model, path: Path | str) -> Path:
    return write_bytes(path, model.SerializeToString())


def sweep(folder: Path | str) -> None:
    """Remove the partial files and folders killed builds left anywhere under ``folder`` (call it only
    while holding the build lock: another build's partial files are in use)."""
    folder = Path(folder)
    if folder.is_dir():
        for p in sorted(folder.rglob(f".*{PARTIAL}*"), reverse=True):
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    p.unlink()
