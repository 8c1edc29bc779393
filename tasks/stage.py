"""What a stage declares: one ``Stage`` per module of this package, listed in build order in ``STAGES``
(``quantflow.tasks``).  The doit tasks, the artifact keys, ``quantflow list`` and the build summary are all made
from that one table (``quantflow.pipeline``).

A stage's functions take the build (``quantflow.pipeline.build.Build``): its configuration (``b.cfg``), the
artifact folder of any keyed stage under its current key (``b.dir(name)``), and the calibration images
(``b.calibration_paths()``).

- A **keyed** stage writes its ``outputs`` into ``<output_dir>/artifacts/<name>/<key>/``, where the key hashes
  what ``key_inputs(b)`` returns (its own inputs: configuration sections, file digests), the keys of the keyed
  stages it ``needs``, and quantflow's own source.  It is done when its outputs and its completion marker are
  there under the current key.
- An **unkeyed** stage (preflight, train, sample, summary) is tracked by doit itself: ``key_inputs(b)`` is the
  state doit compares with the last run (``config_changed``), ``file_dep(b)`` the files it reads,
  ``targets(b)`` the files it writes, ``uptodate(b)`` any further condition.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable


def _always(cfg) -> bool:
    return True


@dataclass(frozen=True)
class Stage:
    name: str
    doc: str                                      # one line: what it does
    run: Callable                                 # run(b): the work, its console lines, its files
    needs: Callable | tuple[str, ...] = ()        # the stages done first (a tuple, or needs(cfg) -> tuple)
    keyed: bool = True
    key_inputs: Callable | None = None            # key_inputs(b) -> dict
    outputs: tuple[str, ...] = ()                 # keyed: the files it writes into its folder
    summary: Callable | None = None               # summary(b) -> its entries in <output_dir>/latest.json
    used: Callable = _always                      # used(cfg): does this configuration have the stage
    file_dep: Callable | None = None              # unkeyed: file_dep(b) -> [paths]
    targets: Callable | None = None               # unkeyed: targets(b) -> [paths]
    uptodate: Callable | None = None              # uptodate(b) -> bool: a further condition on "up to date"
    status: Callable | None = None                # unkeyed: status(b) -> (state, path or None) for quantflow list

    def needed(self, cfg) -> tuple[str, ...]:
        return self.needs(cfg) if callable(self.needs) else self.needs


def done_marker(folder: Path, stage: str) -> Path:
    """A keyed stage's completion marker, written last."""
    return Path(folder) / f".{stage}.done"
