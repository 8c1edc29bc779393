"""Stage 7: content-addressed artifacts.

Every keyed stage writes ``<output_dir>/artifacts/<stage>/<key>/``, where the key hashes that
stage's own inputs (content hashes of the files it reads, its configuration sections), the keys
of the stages it reads from, and the tool versions (quantflow's own source included).  A stage
whose completion marker exists under its key has nothing to do; a change reruns exactly the
stages that depend on it, and changing it back finds the old artifacts again.
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


# each keyed stage: the upstream stages whose keys enter its own key
UPSTREAM = {
    "graph": (),
    "calibrate": ("graph",),
    "fallback": ("calibrate",),
    "export": ("fallback",),
    "aipp": (),
    "atc": ("export", "aipp"),
    "gate": ("fallback", "aipp"),
}


def upstream(cfg, stage: str) -> tuple[str, ...]:
    """``UPSTREAM[stage]``; an automatic fallback also reads the held-out images through AIPP."""
    if stage == "fallback" and cfg.quantization.fallback == "auto":
        return UPSTREAM[stage] + ("aipp",)
    return UPSTREAM[stage]


def _fallback_inputs(cfg, c: dict) -> dict:
    q = c["quantization"]
    if cfg.quantization.fallback == "off":
        return {"fallback": "off"}
    return {"fallback": q["fallback"], "max_fallback": q["max_fallback"], "evaluation": c["evaluation"],
            "eval_data": folder_digest(cfg.path(cfg.evaluation.data_dir)), "normalization": c["normalization"],
            "num_classes": cfg.model.num_classes}


def _file(path) -> str | None:
    return file_sha256(path) if path is not None and Path(path).is_file() else None


def aipp_source_digest(cfg) -> str | None:
    """Hash of the AIPP source: the hand-written config file, or the template."""
    return _file(cfg.path(cfg.aipp.config_file) if cfg.aipp.config_file else cfg.aipp_template)


def stage_inputs(cfg, stage: str, manifest_path: Path, upstream: dict[str, str]) -> dict:
    """What ``stage``'s artifacts depend on: its own inputs (content hashes, configuration sections) and the
    keys of the stages it reads from; nothing else, so that a change reruns only what depends on it."""
    c = cfg.model_dump(mode="json")
    manifest = _file(manifest_path)
    own = {
        "graph": lambda: {"model": c["model"], "checkpoint": _file(cfg.model.checkpoint and cfg.path(cfg.model.checkpoint)),
                          "mindir": _file(cfg.model.mindir and cfg.path(cfg.model.mindir)),
                          "onnx": _file(cfg.model.onnx and cfg.path(cfg.model.onnx)), "manifest": manifest,
                          "normalization": c["normalization"]},
        "calibrate": lambda: {"calibration": c["calibration"], "manifest": manifest, "normalization": c["normalization"],
                              "quantization": {k: v for k, v in c["quantization"].items()
                                               if k not in ("fallback", "max_fallback")}},
        "fallback": lambda: _fallback_inputs(cfg, c),
        "export": lambda: {"input_name": cfg.model.input_name},
        "aipp": lambda: {"aipp": c["aipp"], "normalization": c["normalization"], "manifest": manifest,
                         "input_shape": c["model"]["input_shape"],
                         "aipp_source": aipp_source_digest(cfg)},
        "atc": lambda: {"build": c["build"], "input_name": cfg.model.input_name, "input_shape": c["model"]["input_shape"]},
        "gate": lambda: {"evaluation": c["evaluation"], "eval_data": folder_digest(cfg.path(cfg.evaluation.data_dir)),
                         "normalization": c["normalization"], "num_classes": cfg.model.num_classes},
    }[stage]()
    return {"stage": stage, "inputs": own, "upstream": upstream, "tools": tool_versions()}


def artifact_key(inputs: dict) -> str:
    text = json.dumps(inputs, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:KEY_LENGTH]


def artifact_dir(cfg, stage: str, key: str) -> Path:
    return cfg.out / "artifacts" / stage / key


def done_marker(key_dir: Path, stage: str) -> Path:
    return Path(key_dir) / f".{stage}.done"


def mark_done(key_dir: Path, stage: str) -> None:
    from .atomic import write_text
    write_text(done_marker(key_dir, stage), "ok\n")
