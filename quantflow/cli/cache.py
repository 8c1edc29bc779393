"""``quantflow cache``: look after the shared artifact cache (quantflow.pipeline.cache).

    quantflow cache ls     [CONFIG] [--cache URL]
    quantflow cache verify [CONFIG] [--cache URL]
    quantflow cache prune  [CONFIG] [--cache URL] [--older-than DAYS] [--max-size SIZE]

The cache is the one a build of CONFIG (default quantflow.toml) would use: ``--cache URL``, else
$QUANTFLOW_CACHE, else CONFIG's ``[cache] url``.  ``ls`` prints each entry (stage, key, size, age since its last
push or pull, files); ``verify`` downloads every file of every entry and checks it against its manifest, naming
each one that does not match; ``prune`` removes whole entries (each manifest first) not used for DAYS, then the
least recently used until the cache holds at most SIZE (e.g. 500M, 2G), and what killed pushes left.

Exit codes: 0 done; 1 ``verify`` found damaged entries; 2 a bad command line, configuration or cache URL, or a
cache that cannot be read, with one message.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

from ..config import DEFAULT_CONFIG_NAME, load_config
from ..errors import QuantflowError
from ..pipeline.cache import CACHE_ENV, ArtifactCache, human_size, open_cache

USAGE_ERROR = 2
_UNITS = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3, "T": 1024 ** 4}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``ls``, ``verify`` and ``prune`` sub-commands, on ``quantflow cache``'s parser."""
    sub = parser.add_subparsers(dest="cache_command", required=True, metavar="{ls,verify,prune}")
    for name, text in (("ls", "each entry: stage, key, size, age, files"),
                       ("verify", "check every file of every entry against its manifest (exit 1 when one fails)"),
                       ("prune", "remove entries not used for DAYS, then the least recently used down to SIZE")):
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("config", nargs="?", type=Path, default=Path(DEFAULT_CONFIG_NAME), metavar="CONFIG",
                       help=f"the configuration whose [cache] url to use (default {DEFAULT_CONFIG_NAME})")
        p.add_argument("--cache", metavar="URL", help=f"the cache: a folder or an fsspec URL such as "
                                                      f"s3://bucket/prefix (default ${CACHE_ENV}, else [cache] url)")
        if name == "prune":
            p.add_argument("--older-than", type=float, metavar="DAYS",
                           help="remove the entries not pushed or pulled for this many days")
            p.add_argument("--max-size", metavar="SIZE", help="then remove the least recently used entries until "
                                                              "the cache holds at most SIZE (e.g. 500M, 2G)")


def parse_size(text: str) -> int:
    """A size such as ``500M``, ``2G``, ``1.5GB``, ``800KiB`` or ``1000`` (bytes) in bytes (powers of 1024)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([KMGT]?)(?:I?B)?\s*", text.upper())
    if not m:
        raise QuantflowError(f"--max-size {text!r}: give a size such as 500M or 2G")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def human_age(seconds: float) -> str:
    seconds = max(seconds, 0.0)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def open_named_cache(args) -> ArtifactCache:
    """The cache the command names: ``--cache``, else $QUANTFLOW_CACHE, else CONFIG's ``[cache] url``."""
    if args.cache:
        cache = open_cache(args.cache)
    elif os.environ.get(CACHE_ENV):
        cache = open_cache(None)
    else:
        cache = open_cache(None, load_config(args.config), args.config)
    if cache is None:
        raise QuantflowError(f"no artifact cache to look at: give --cache URL, set ${CACHE_ENV} or [cache] url in "
                             f"{args.config}")
    return cache


def run(args) -> int:
    """Run ``quantflow cache ls | verify | prune``; the exit code."""
    try:
        cache = open_named_cache(args)
        if args.cache_command == "prune":
            if args.older_than is None and args.max_size is None:
                raise QuantflowError("quantflow cache prune: give --older-than DAYS, --max-size SIZE or both")
            if args.older_than is not None and args.older_than < 0:
                raise QuantflowError(f"--older-than {args.older_than:g}: give a number of days, 0 or more")
            max_size = parse_size(args.max_size) if args.max_size is not None else None
        try:
            if args.cache_command == "ls":
                return _ls(cache)
            if args.cache_command == "verify":
                return _verify(cache)
            return _prune(cache, args.older_than, max_size)
        except QuantflowError:
            raise
        except Exception as err:  # noqa: BLE001  (whatever the store raises: one line, no traceback)
            raise QuantflowError(f"cannot use the cache {cache.url}: {type(err).__name__}: {err}") from None
    except QuantflowError as err:
        print(f"quantflow: {err}", file=sys.stderr)
        return USAGE_ERROR


def _ls(cache: ArtifactCache) -> int:
    now = time.time()
    entries = cache.entries(read_manifests=True)
    rows = [("STAGE", "KEY", "SIZE", "AGE", "FILES")]
    for e in entries:
        files = (str(e.files) if e.files is not None else "damaged manifest") if e.complete else \
            "incomplete (no manifest)"
        rows.append((e.stage, e.key, human_size(e.size), human_age(now - e.mtime), files))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(c.ljust(widths[i]) for i, c in enumerate(r[:4])) + "  " + r[4])
    print(f"{len(entries)} entries, {human_size(sum(e.size for e in entries))} in {cache.url}")
    return 0


def _verify(cache: ArtifactCache) -> int:
    bad = checked = 0
    for e in cache.entries():
        if not e.complete:
            print(f"incomplete  {e.stage} {e.key}: no manifest (a push under way or killed; never pulled; prune "
                  f"removes it)")
            continue
        checked += 1
        problem = cache.verify(e)
        if problem:
            bad += 1
            print(f"BAD  {e.stage} {e.key}: {problem}")
        else:
            print(f"ok   {e.stage} {e.key}")
    print(f"{checked} entries checked in {cache.url}: " + (f"{bad} damaged (a build does not use them; the next "
                                                             f"build of each replaces it)" if bad else "all sound"))
    return 1 if bad else 0


def _prune(cache: ArtifactCache, older_than: float | None, max_size: int | None) -> int:
    now = time.time()
    removed = cache.prune(older_than, max_size, now)
    for e in removed:
        print(f"removed {e.stage} {e.key} ({human_size(e.size)}, last used {human_age(now - e.mtime)} ago)")
    left = [e for e in cache.entries() if e.complete]
    print(f"removed {len(removed)} entries ({human_size(sum(e.size for e in removed))}); {len(left)} left "
          f"({human_size(sum(e.size for e in left))}) in {cache.url}")
    return 0
