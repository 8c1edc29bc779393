"""One command measured as a whole process, from outside: wall time, CPU time, peak memory, and when each
output line appeared.

``measure(cmd)`` starts ``cmd`` in a fresh process (unbuffered Python output), reads its output line by line
with the time each line arrived, and every ``interval`` seconds reads from /proc the resident memory of the
process and all its descendants: their sum (what the machine must hold at once) and each one's high-water mark
(``VmHWM``, the kernel's own peak of that process, which a short peak between two samples cannot escape).  On exit
it takes the kernel's accounting of the child (``os.wait4``): user and system CPU seconds.  (``wait4``'s
``ru_maxrss`` is not used: Linux starts a child's count at its parent's resident size when it forks, so a large
measuring process would show in it.)  Linux only (/proc); elsewhere memory is left out.

``stages(lines)`` cuts a doit build's output into its tasks: doit prints ``.  <task>`` as a task starts (and
``-- <task>`` when it is up to date), so the time from one such line to the next is that task's, and the
sampled memory between them its peak.
"""
from __future__ import annotations

import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

@dataclass
class Run:
    cmd: list[str]
    returncode: int
    wall_s: float
    user_s: float
    sys_s: float
    max_rss_mb: float | None           # the largest high-water mark of a process of the tree (None: no /proc)
    tree_rss_mb: float | None          # the sampled peak of the whole tree's resident memory (None: no /proc)
    lines: list[tuple[float, str]]     # (seconds since start, line) of stdout and stderr, merged
    samples: list[tuple[float, float]] = field(default_factory=list)  # (seconds since start, tree RSS MB)

    @property
    def output(self) -> str:
        return "\n".join(text for _, text in self.lines)


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        kids.setdefault(ppid, []).append(int(entry.name))
    return kids


def tree_memory(pid: int) -> tuple[float, dict[int, float]]:
    """The resident memory of ``pid`` and all its descendants summed (MB), and each one's high-water mark (MB);
    (0, {}) once it is gone."""
    kids, todo, total, hwm = _children(), [pid], 0.0, {}
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                fields = dict(line.split(":", 1) for line in f if line.startswith(("VmRSS", "VmHWM")))
            total += int(fields["VmRSS"].split()[0]) / 1024
            hwm[p] = int(fields["VmHWM"].split()[0]) / 1024
        except (OSError, KeyError, ValueError):
            pass
        todo.extend(kids.get(p, []))
    return total, hwm


def measure(cmd: list[str], cwd: Path | None = None, env: dict | None = None, interval: float = 0.05,
            timeout: float | None = None) -> Run:
    """Run ``cmd`` to its end and measure it (see the module docstring)."""
    env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
    lines: list[tuple[float, str]] = []
    samples: list[tuple[float, float]] = []
    hwm: dict[int, float] = {}
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1)
    done = threading.Event()
    proc_ok = Path("/proc").is_dir()

    def sample():
        while not done.is_set():
            total, peaks = tree_memory(proc.pid)
            samples.append((time.perf_counter() - start, total))
            for p, m in peaks.items():
                hwm[p] = max(hwm.get(p, 0.0), m)
            done.wait(interval)

    sampler = threading.Thread(target=sample, daemon=True) if proc_ok else None
    if sampler:
        sampler.start()
    timer = threading.Timer(timeout, proc.kill) if timeout else None
    if timer:
        timer.start()
    for line in proc.stdout:
        lines.append((time.perf_counter() - start, line.rstrip("\n")))
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    done.set()
    if sampler:
        sampler.join()
    if timer:
        timer.cancel()
    return Run(cmd=list(cmd), returncode=proc.returncode, wall_s=wall, user_s=usage.ru_utime, sys_s=usage.ru_stime,
               max_rss_mb=max(hwm.values(), default=None) if proc_ok else None,
               tree_rss_mb=max((m for _, m in samples), default=None) if proc_ok else None, lines=lines,
               samples=samples)


def stages(run: Run) -> dict[str, dict]:
    """doit's tasks in the order they ran: {task: {"s": seconds, "rss_mb": peak tree RSS while it ran}}.  The
    time before the first task (Python start-up, imports, loading the task graph) is ``startup``; the last task
    runs to the end of the process (its exit included)."""
    marks = [(0.0, "startup")]
    for t, text in run.lines:
        if text.startswith((".  ", "-- ")) and " " not in text[3:].strip():
            marks.append((t, text[3:].strip()))
    marks.append((run.wall_s, None))
    out: dict[str, dict] = {}
    for (t0, name), (t1, _) in zip(marks, marks[1:]):
        peak = max((m for t, m in run.samples if t0 <= t <= t1), default=0.0)
        seen = out.setdefault(name, {"s": 0.0, "rss_mb": 0.0})
        seen["s"] += t1 - t0
        seen["rss_mb"] = max(seen["rss_mb"], peak)
    return out
