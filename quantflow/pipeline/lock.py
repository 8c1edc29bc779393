"""One build at a time per output folder: an exclusive lock held for the whole build.

Two builds of one ``build.output_dir`` would share doit's dependency database and the artifact folders; the
second one therefore WAITS for the first (printing which process holds the lock) instead of running every stage
over the same files.  Builds of different output folders take different locks and run side by side.  (Within one
``quantflow build a.toml b.toml`` two configs naming the same output folder are refused before anything runs:
quantflow.cli.)

The lock is an ``fcntl.flock`` on ``<output_dir>/.quantflow.lock``: the kernel releases it when the holding
process ends, however it ends; processes forked by the holder (doit's ``-n``) share it.  A process that asks
again for a lock it holds gets it at once.
"""
from __future__ import annotations

import fcntl
import os
import sys
import time
from pathlib import Path

LOCK_NAME = ".quantflow.lock"

_held: dict[Path, object] = {}  # lock file -> its open file, kept open (and locked) for the life of the process


def acquire(folder: Path | str = "build", poll_s: float = 0.5, timeout_s: float | None = None) -> Path:
    """Take ``folder``'s lock, waiting (with a message naming the lock file and its holder) while another process
    holds it; TimeoutError after ``timeout_s`` if given.  Returns the lock file."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    if path.resolve() in _held:
        return path
    f = open(path, "a+")
    start, told = time.monotonic(), False
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if not told:
                f.seek(0)
                holder = f.read().strip() or "another process"
                print(f"quantflow: another build holds {path} ({holder}); waiting for it to finish", file=sys.stderr,
                      flush=True)
                told = True
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                f.close()
                raise TimeoutError(f"{path} is still held after {timeout_s:.0f} s")
            time.sleep(poll_s)
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()}\n")
    f.flush()
    _held[path.resolve()] = f
    return path
