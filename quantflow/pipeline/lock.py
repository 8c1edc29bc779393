"""One build at a time per folder: an exclusive lock held for the whole `doit` run.

Two `doit` runs in one folder share doit's dependency database and the artifact folders; the second
one waits for the first (printing who holds the lock) instead of running every stage over the same
files.  The lock is an ``fcntl.flock`` on ``build/.quantflow.lock``: the kernel releases it when the
holding process ends, however it ends.
"""
from __future__ import annotations

import fcntl
import os
import sys
import time
from pathlib import Path

_held = []


def acquire(folder: Path | str = "build", poll_s: float = 0.5, timeout_s: float | None = None) -> Path:
    """Take the folder's lock, waiting (with a message) while another build holds it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / ".quantflow.lock"
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
    _held.append(f)  # keep the file (and the lock) open for the life of the process
    return path
