"""train: only with a ``[train]`` section: trains the model with ``train.entry`` and writes
``model.checkpoint``.  Its completion record (``<output_dir>/train.json``: what was trained from what, and the
checkpoint's SHA-256) is written last, so that a build killed after training does not train again (doit's own
record of a run is saved only when the run ends)."""
from __future__ import annotations

import json
from pathlib import Path

from quantflow.entry import load_entry
from quantflow.errors import QuantflowError
from quantflow.io import atomic
from quantflow.io.digest import file_sha256

from .preflight import module_file
from .stage import Stage

RECORD = "train.json"


def _record(cfg) -> Path:
    return cfg.out / RECORD


def _inputs(cfg) -> dict:
    return {"train": cfg.train.model_dump(mode="json"),
            "model": cfg.model.model_dump(mode="json", exclude={"input_name", "verify_images", "verify_tolerance"}),
            "sources": {e: [file_sha256(Path(f)) for f in module_file(e)] for e in (cfg.train.entry, cfg.model.entry)}}


def _run(b) -> None:
    c = b.cfg
    ckpt = c.path(c.model.checkpoint)
    print(f"training {c.model.entry} with {c.train.entry} -> {ckpt}")
    load_entry(c.train.entry, "train.entry")(c, ckpt)
    if not ckpt.is_file():
        raise QuantflowError(f"train.entry {c.train.entry} returned without writing model.checkpoint {ckpt}")
    atomic.write_json(_record(c), {"inputs": _inputs(c), "checkpoint_sha256": file_sha256(ckpt)})


def _uptodate(b) -> bool:
    """Trained already: the record matches the current inputs and the checkpoint it names is there, unchanged."""
    ckpt = b.cfg.path(b.cfg.model.checkpoint)
    try:
        record = json.loads(_record(b.cfg).read_text())
    except (OSError, ValueError):
        return False
    return (record.get("inputs") == json.loads(json.dumps(_inputs(b.cfg))) and ckpt.is_file()
            and record.get("checkpoint_sha256") == file_sha256(ckpt))


STAGE = Stage(
    name="train", doc="trains the model with [train].entry and writes model.checkpoint (only with [train])",
    run=_run, needs=("preflight",), keyed=False, used=lambda cfg: cfg.train is not None,
    targets=lambda b: [str(b.cfg.path(b.cfg.model.checkpoint))], uptodate=_uptodate,
    status=lambda b: ("-", None))
