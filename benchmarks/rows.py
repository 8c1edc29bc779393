"""What the benchmarks that build real models one case at a time share: the names asked for, checked against the
known ones; a work folder (the one given, or a temporary one); and the JSON file of result rows, which a re-run
updates build by build (its own builds' rows replaced, the others' kept), so that cases can be run one at a time."""
from __future__ import annotations

import json
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def chosen(given: str, known, flag: str) -> list[str]:
    """The comma-separated names of ``given``, each one of ``known``; else a SystemExit naming ``flag``."""
    names = [n for n in given.split(",") if n]
    bad = [n for n in names if n not in known]
    if bad:
        raise SystemExit(f"{flag}: unknown {', '.join(bad)}; known: {', '.join(known)}")
    return names


@contextmanager
def workdir(given: Path | None) -> Iterator[Path]:
    """``given`` (kept after the run), or a temporary folder removed at the end."""
    with tempfile.TemporaryDirectory() as tmp:
        yield (given or Path(tmp)).resolve()


class Rows:
    """The rows of ``path`` (none where it does not exist yet); a build's row is identified by the values of
    ``key`` (a missing ``seed`` reads as 0, as before seeds were recorded)."""

    def __init__(self, path: Path, key: tuple[str, ...]):
        self.path, self.key = path, key
        self.rows: list[dict] = json.loads(path.read_text()) if path.is_file() else []

    def _id(self, row: dict) -> tuple:
        return tuple(row.get(k, 0 if k == "seed" else None) for k in self.key)

    def put(self, row: dict) -> None:
        """``row`` in place of the row of the same build, written at once."""
        self.rows = [r for r in self.rows if self._id(r) != self._id(row)] + [row]
        self.path.write_text(json.dumps(self.rows, indent=1, default=str))
