"""Content-addressed artifacts: each keyed stage writes ``<output_dir>/artifacts/<stage>/<key>/``, where the key
hashes that stage's own inputs (its ``key_inputs``: configuration sections, content hashes of the files it
reads), the keys of the keyed stages it needs, and the tool versions (quantflow's own installed source
included).  A stage whose completion marker exists under its key has nothing to do; a change reruns exactly the
stages that depend on it, and changing it back finds the old artifacts again.  Nothing a key hashes depends on
where the project sits (``portable``): clones in different folders, on different machines, give the same keys,
which is what lets them share artifacts (``quantflow.pipeline.cache``)."""
from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
from importlib import metadata
from pathlib import Path

from ..io.digest import source_digest

KEY_LENGTH = 16
DISTRIBUTIONS = ("quantflow-ascend", "mindspore", "numpy", "opencv-python-headless", "pydantic", "onnx", "onnxruntime")


@functools.cache
def tool_versions() -> dict:
    """The Python and package versions, and quantflow's own source digest (once per process: the source does not
    change under a running build)."""
    out = {"python": platform.python_version()}
    for dist in DISTRIBUTIONS:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    out["quantflow_source"] = source_digest()
    return out


def stage_key_inputs(stage: str, own: dict, upstream: dict[str, str]) -> dict:
    """Everything a stage's key hashes (also written to ``key_inputs.json`` in its folder)."""
    return {"stage": stage, "inputs": own, "upstream": upstream, "tools": tool_versions()}


def artifact_key(inputs: dict) -> str:
    text = json.dumps(inputs, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:KEY_LENGTH]


def artifact_dir(out: Path, stage: str, key: str) -> Path:
    return Path(out) / "artifacts" / stage / key


def portable(data, root: Path):
    """``data`` (JSON-like) with every absolute path in it made relative to ``root`` (``..`` allowed), so that what
    a key hashes does not depend on where the project sits: two clones in different folders give the same keys."""
    if isinstance(data, dict):
        return {k: portable(v, root) for k, v in data.items()}
    if isinstance(data, list):
        return [portable(v, root) for v in data]
    if isinstance(data, str) and os.path.isabs(data):
        return Path(os.path.relpath(data, Path(root).resolve())).as_posix()
    return data


def json_digest(data) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
