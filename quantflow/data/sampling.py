"""Deterministic, stratified calibration sampling with a manifest.

Every candidate image is decoded and size-checked; unusable ones are reported by path (and
fail the stage unless ``calibration.on_bad_image = "skip"``, in which case they are listed
in the manifest's ``skipped``).  Each class gets at least ``per_class_min`` images; the rest
of ``count`` is shared out in proportion to the classes' sizes (largest remainder), so the
sample keeps the folder's class balance.  The choice within a class is a seeded shuffle of
the sorted file list, so the same folder and seed always give the same manifest.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from ..errors import DataError
from ..io.atomic import write_json
from ..io.digest import file_sha256
from .images import LabeledImage, check_image, scan_images


def allocate(available: dict[int, int], count: int, per_class_min: int) -> dict[int, int]:
    """How many images to take from each class."""
    total = sum(available.values())
    short = {c: n for c, n in available.items() if n < per_class_min}
    if short:
        desc = ", ".join(f"class {c}: {n}" for c, n in sorted(short.items()))
        raise DataError(f"calibration.per_class_min={per_class_min} but some classes have fewer usable images ({desc})")
    if total < count:
        raise DataError(f"calibration.count={count} but only {total} usable calibration images were found")
    take = {c: per_class_min for c in available}
    rest = count - per_class_min * len(available)
    room = {c: available[c] - take[c] for c in available}
    while rest > 0:
        free = sum(room.values())
        shares = {c: rest * room[c] / free for c in room}
        base = {c: min(room[c], int(np.floor(s))) for c, s in shares.items()}
        given = sum(base.values())
        # largest remainders first (ties: smaller label first) for what the floors left over
        order = sorted(room, key=lambda c: (-(shares[c] - base[c]), c))
        for c in order:
            if given >= rest:
                break
            if base[c] < room[c]:
                base[c] += 1
                given += 1
        for c in available:
            take[c] += base[c]
            room[c] -= base[c]
        rest -= given
    return take


def sample(data_dir: Path, root: Path, count: int, per_class_min: int, seed: int, num_classes: int | None,
           channels: int, height: int, width: int, on_bad_image: str = "error") -> dict:
    """Build the calibration manifest (a JSON-able dict).  ``num_classes`` None: an unlabelled folder, whose
    sub-folders are sampled as the classes are (``images.scan_image_groups``)."""
    items = scan_images(data_dir, num_classes)
    good: dict[int, list[LabeledImage]] = defaultdict(list)
    bad = []
    for it in items:
        _, reason = check_image(it.path, channels, height, width)
        if reason is None:
            good[it.label].append(it)
        else:
            bad.append({"path": _rel(it.path, root), "reason": reason})
    if bad and on_bad_image == "error":
        listing = "\n".join(f"  {b['reason']}" for b in bad)
        raise DataError(f"{len(bad)} unusable calibration image(s) in {data_dir} "
                        f"(fix or remove them, or set calibration.on_bad_image = \"skip\"):\n{listing}")
    missing = sorted(set(range(num_classes)) - set(good)) if num_classes else []
    if per_class_min > 0 and missing:
        raise DataError(f"calibration.per_class_min={per_class_min} but {data_dir} has no usable images of "
                        f"class(es) {', '.join(map(str, missing))} of the model's {num_classes}")
    take = allocate({c: len(v) for c, v in good.items()}, count, per_class_min)
    rng = np.random.default_rng(seed)
    chosen = []
    for c in sorted(good):
        files = sorted(good[c], key=lambda i: i.path.name)
        order = rng.permutation(len(files))[: take[c]]
        chosen.extend(files[i] for i in sorted(order))
    return {
        "data_dir": _rel(Path(data_dir), root),
        "seed": seed,
        "count": count,
        "per_class_min": per_class_min,
        "input_size": [height, width, channels],
        "classes": {_group_name(good[c], num_classes): {"available": len(good[c]), "selected": take[c]}
                    for c in sorted(good)},
        "images": [{"path": _rel(i.path, root), "label": i.label, "sha256": file_sha256(i.path)} for i in chosen],
        "skipped": bad,
    }


def _group_name(items: list[LabeledImage], num_classes: int | None) -> str:
    """A class's label, or an unlabelled folder's group (its sub-folder name, "." for the folder itself)."""
    return str(items[0].label) if num_classes else items[0].class_name


def _rel(path: Path, root: Path) -> str:
    path = Path(path).resolve()
    try:
        return path.relative_to(Path(root).resolve()).as_posix()
    except ValueError:
        return path.as_posix()


def write_manifest(manifest: dict, path: Path) -> None:
    write_json(path, manifest, indent=1)


def read_manifest(path: Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"calibration manifest not found: {path} (run the 'sample' task)")
    return json.loads(path.read_text())


def manifest_paths(manifest: dict, root: Path) -> list[Path]:
    """The manifest's images, checked against the hashes recorded when they were sampled."""
    out = []
    for entry in manifest["images"]:
        p = Path(entry["path"])
        p = p if p.is_absolute() else Path(root) / p
        if not p.is_file():
            raise DataError(f"calibration image listed in the manifest is missing: {p}")
        if file_sha256(p) != entry["sha256"]:
            raise DataError(f"calibration image changed since it was sampled: {p} (re-run the 'sample' task)")
        out.append(p)
    return out
