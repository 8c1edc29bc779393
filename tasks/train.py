"""train: only with a ``[train]`` section: trains the model with ``train.entry`` and writes ``model.checkpoint``.

Its record (``record_path``: beside the checkpoint, ``<name>.train.json``) says which checkpoint this is: what
trained it (the ``[train]`` settings, the network's entry, input shape and classes, the SHA-256 of the training
and network source files), the checkpoint's SHA-256, the metrics the training returned and where it ran.  It is
written last, so that a build killed after training does not train again (doit's own record of a run is saved
only when the run ends).  The stage is up to date while the record matches the current inputs and the checkpoint
it names: a checkpoint shipped with its record (the demos: quantflow/demo/checkpoints/) is used as it is on any
machine, and retrained only when those inputs change, when it is missing, or on request (``doit -a train``,
``quantflow build --always train``)."""
from __future__ import annotations

import json
import platform
import shutil
from pathlib import Path

from quantflow.entry import load_entry, module_file
from quantflow.errors import QuantflowError
from quantflow.io import atomic
from quantflow.io.digest import file_sha256

from .stage import Stage

RECORD_SUFFIX = ".train.json"


def record_path(cfg) -> Path:
    """The training record of ``model.checkpoint``: ``digits.ckpt`` -> ``digits.train.json`` beside it."""
    return cfg.path(cfg.model.checkpoint).with_suffix(RECORD_SUFFIX)


def training_inputs(cfg) -> dict:
    """What the checkpoint is made from: settings left at their defaults are left out, so that a setting added to
    quantflow later does not make a recorded checkpoint look stale."""
    m = cfg.model
    return {"train": cfg.train.model_dump(mode="json", exclude_defaults=True),
            "model": {"entry": m.entry, "input_shape": list(m.input_shape), "num_classes": m.num_classes},
            "sources": {e: [file_sha256(Path(f)) for f in module_file(e)] for e in (cfg.train.entry, m.entry)}}


def _environment() -> dict:
    """Where the training ran: MindSpore's CPU kernels differ by processor, so the same inputs give another
    checkpoint on another machine."""
    import mindspore
    cpu = platform.processor()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name")) or cpu
    except (OSError, StopIteration):
        pass
    return {"mindspore": mindspore.__version__, "python": platform.python_version(), "machine": platform.machine(),
            "cpu": cpu}


def _sweep(*paths: Path) -> None:
    """What a killed training left of ``paths`` (their partial files; the checkpoint's folder is outside the
    build folder the build's own sweep covers)."""
    for path in paths:
        for p in path.parent.glob(f".{path.name}{atomic.PARTIAL}*"):
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


def _identity(path: Path):
    """A file as written: a new write (in place or renamed into place) changes it."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _run(b) -> None:
    c = b.cfg
    ckpt = c.path(c.model.checkpoint)
    print(f"training {c.model.entry} with {c.train.entry} -> {ckpt.resolve()}")
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    _sweep(ckpt, record_path(c))
    before = _identity(ckpt)
    metrics = load_entry(c.train.entry, "train.entry")(c, ckpt)
    if not ckpt.is_file() or _identity(ckpt) == before:
        raise QuantflowError(f"train.entry {c.train.entry} returned without writing model.checkpoint {ckpt}")
    try:
        metrics = json.loads(json.dumps(metrics if isinstance(metrics, dict) else {}))
    except (TypeError, ValueError):
        metrics = {}
    atomic.write_json(record_path(c), {"inputs": training_inputs(c), "checkpoint_sha256": file_sha256(ckpt),
                                       "metrics": metrics, "trained_on": _environment()})
    print(f"training record (what trained the checkpoint, its SHA-256) -> {record_path(c).resolve()}")


def recorded(cfg) -> dict | None:
    """The checkpoint's training record, when it describes the current inputs and the checkpoint as it is."""
    ckpt = cfg.path(cfg.model.checkpoint)
    try:
        record = json.loads(record_path(cfg).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not ckpt.is_file():
        return None
    same = (record.get("inputs") == json.loads(json.dumps(training_inputs(cfg)))
            and record.get("checkpoint_sha256") == file_sha256(ckpt))
    return record if same else None


def _status(b):
    if recorded(b.cfg) is not None:
        return "up to date", b.cfg.path(b.cfg.model.checkpoint)
    return "to run", None


STAGE = Stage(
    name="train", doc="trains the model with [train].entry and writes model.checkpoint (only with [train])",
    run=_run, needs=("preflight",), keyed=False, used=lambda cfg: cfg.train is not None,
    targets=lambda b: [str(b.cfg.path(b.cfg.model.checkpoint))], uptodate=lambda b: recorded(b.cfg) is not None,
    status=_status)
