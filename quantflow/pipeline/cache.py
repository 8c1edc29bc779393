"""Stage 7: content-addressed artifacts.

Everything a build produces lives in ``<output_dir>/artifacts/<key>/``, where the key hashes
the checkpoint bytes, the configuration, the calibration manifest (image hashes included),
the evaluation images, the AIPP template / config file, and the tool versions (quantflow's
own source included).  A stage whose completion marker exists under the key has nothing to
do; changing any input gives a new key, and changing it back finds the old artifacts again.
"""
from __future__ import annotations

import hashlib
import json
import platform
from importlib import metadata
from pathlib import Path

from ..images import IMAGE_EXTS, file_sha256

KEY_LENGTH = 16


def quantflow_source_digest() -> str:
    h = hashlib.sha256()
    root = Path(__file__).resolve().parents[1]
    for p in sorted(root.rglob("*.py")):
        h.update(p.relative_to(root).as_posix().encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def tool_versions() -> dict:
    out = {"python": platform.python_version()}
    for dist in ("quantflow", "mindspore", "numpy", "opencv-python-headless", "pydantic", "onnx", "onnxruntime"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    out["quantflow_source"] = quantflow_source_digest()
    return out


def folder_digest(folder: Path) -> str:
    """Hash of every image file (relative path + content) under ``folder``."""
    h = hashlib.sha256()
    folder = Path(folder)
    if folder.is_dir():
        for p in sorted(folder.rglob("*")):
            if p.is_file() and p.suffix.lower() in IMAGE_EXTS:
                h.update(p.relative_to(folder).as_posix().encode())
                h.update(file_sha256(p).encode())
    return h.hexdigest()


def key_inputs(cfg, manifest_path: Path) -> dict:
    ckpt = cfg.path(cfg.model.checkpoint) if cfg.model.checkpoint else None
    mindir = cfg.path(cfg.model.mindir) if cfg.model.mindir else None
    aipp_src = cfg.path(cfg.aipp.config_file) if cfg.aipp.config_file else cfg.path(cfg.aipp.template)
    return {
        "checkpoint": file_sha256(ckpt) if ckpt and ckpt.is_file() else None,
        "mindir": file_sha256(mindir) if mindir and mindir.is_file() else None,
        "config": hashlib.sha256(cfg.canonical_json().encode()).hexdigest(),
        "manifest": file_sha256(manifest_path) if Path(manifest_path).is_file() else None,
        "eval_data": folder_digest(cfg.path(cfg.evaluation.data_dir)),
        "aipp_source": file_sha256(aipp_src) if aipp_src.is_file() else None,
        "tools": tool_versions(),
    }


def artifact_key(inputs: dict) -> str:
    text = json.dumps(inputs, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:KEY_LENGTH]


def artifact_dir(cfg, key: str) -> Path:
    return cfg.out / "artifacts" / key


def done_marker(key_dir: Path, stage: str) -> Path:
    return Path(key_dir) / f".{stage}.done"


def mark_done(key_dir: Path, stage: str) -> None:
    done_marker(key_dir, stage).write_text("ok\n")
