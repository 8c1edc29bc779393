"""sample: the seeded, stratified calibration sample of ``calibration.data_dir`` (``quantflow.data.sampling``),
written as the calibration manifest (paths, labels, SHA-256).  The keyed stages are created once it has run
(their keys hash the manifest, and the trained checkpoint: hence it comes after train)."""
from __future__ import annotations

import sys
from pathlib import Path

from quantflow.data.images import IMAGE_EXTS
from quantflow.data.sampling import manifest_paths, read_manifest, sample, write_manifest

from .stage import Stage


def manifest_path(cfg) -> Path:
    """The calibration manifest of configuration ``cfg``."""
    return cfg.out / "calibration" / "manifest.json"


def calibration_paths(cfg) -> list[Path]:
    """The sampled calibration images, checked against the manifest's hashes."""
    return manifest_paths(read_manifest(manifest_path(cfg)), cfg.root)


def _run(b) -> None:
    c = b.cfg
    _, ch, h, w = c.model.input_shape
    k = c.calibration
    m = sample(c.path(k.data_dir), c.root, k.count, k.per_class_min, k.seed, c.labelled_classes, ch, h, w,
               k.on_bad_image)
    write_manifest(m, manifest_path(c))
    per_class = ", ".join(f"{cl}:{v['selected']}/{v['available']}" for cl, v in m["classes"].items())
    kind = "class" if c.labelled_classes else "folder"
    print(f"sampled {len(m['images'])} calibration images ({kind}:selected/available {per_class}) -> "
          f"{manifest_path(c)}")
    for s in m["skipped"]:
        print(f"WARNING skipped unusable calibration image: {s['reason']}", file=sys.stderr)


def _images(b) -> list[str]:
    data_dir = b.cfg.path(b.cfg.calibration.data_dir)
    return sorted(str(p) for p in data_dir.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTS) \
        if data_dir.is_dir() else []


def _status(b):
    path = manifest_path(b.cfg)
    return ("sampled", path) if path.is_file() else ("to run", None)


STAGE = Stage(
    name="sample", doc="seeded, stratified calibration sampling -> manifest", run=_run, needs=("preflight", "train"),
    keyed=False, file_dep=_images, targets=lambda b: [str(manifest_path(b.cfg))],
    key_inputs=lambda b: {"calibration": b.cfg.calibration.model_dump(mode="json"),
                          "shape": list(b.cfg.model.input_shape), "classes": b.cfg.labelled_classes},
    status=_status)
