"""quantflow: `doit` builds the INT8 model described by quantflow.toml (or `doit config=FILE`).

The task definitions live in tasks/, the logic in the quantflow package.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tasks.pipeline import (  # noqa: E402,F401  (doit collects the task_* names)
    task_aipp, task_atc, task_calibrate, task_export, task_fallback, task_gate, task_graph, task_preflight, task_sample,
    task_summary, task_train,
)

from quantflow.pipeline.lock import acquire  # noqa: E402

# doit's own state (what ran, with which inputs) lives beside the build outputs; one build at a time
acquire("build")

DOIT_CONFIG = {
    "default_tasks": ["preflight", "train", "sample", "graph", "calibrate", "aipp", "fallback", "export", "atc", "gate",
                      "summary"],
    "verbosity": 2,
    "dep_file": "build/.doit.sqlite",
    # sqlite commits atomically: a build killed while doit records its state cannot corrupt it
    # (the default dbm file can be left half-written)
    "backend": "sqlite3",
}
