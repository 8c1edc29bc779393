"""preflight: the cheap checks, run first, so that a wrong setting fails in seconds, before any calibration.

- the network: ``model.entry`` imports and builds, ``model.checkpoint`` loads into it (a shape mismatch names
  each parameter with both shapes; skipped when ``[train]`` will write the checkpoint), one forward pass at
  ``model.input_shape`` works, and for the top-1 gate the first output is (batch, ``model.num_classes``), a
  detector's heads refused with their shapes (``evaluation.metric = "outputs"`` gates them); or
  ``model.mindir`` / ``model.onnx`` reads into the IR with that input shape;
- the data: the calibration and evaluation folders hold class folders (or, for the outputs gate, any
  folders) of readable images of the model's size;
- the preprocessing: the declared normalization is plausible and the AIPP config reproduces it on a few
  calibration images (the full check runs again in the aipp stage);
- the gate's power: for each gated figure, the images the gate will judge (after the automatic fallback's
  tuning images are set apart) against the least number at which a PASS is reachable
  (``quantflow.evaluation.power``), with a WARNING, not a failure, where they are too few.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from quantflow.data.images import IMAGE_EXTS, check_image, scan_images
from quantflow.entry import first_line, module_file, raised_at
from quantflow.errors import ConfigError, DataError
from quantflow.io.digest import file_sha256, folder_digest

from .stage import Stage


def _network_outputs(cfg, load_weights: bool) -> list[tuple[int, ...]]:
    import mindspore as ms

    from quantflow.frontends.network import build_network

    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = build_network(cfg, load_weights=load_weights)
    try:
        y = net(ms.Tensor(np.zeros(cfg.model.input_shape, np.float32)))
    except (RuntimeError, ValueError, TypeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"model.input_shape {list(cfg.model.input_shape)}: {cfg.model.entry} cannot run on an input "
                          f"of this shape (MindSpore: {first})") from None
    except Exception as err:  # the network's own code failed
        raise ConfigError(f"model.entry = {cfg.model.entry!r}: the network raised {first_line(err)} on an input of "
                          f"model.input_shape {list(cfg.model.input_shape)}{raised_at(err)}") from None
    return [tuple(o.shape) for o in (y if isinstance(y, (tuple, list)) else [y])]


def _model_file_outputs(cfg) -> list[tuple[int, ...]]:
    """The output shapes of model.mindir / model.onnx, read as the graph stage reads it."""
    from quantflow.frontends.source import model_file, read_model, source_field

    graph = read_model(cfg, Path("."))
    shape = graph.tensors[graph.inputs[0]].shape
    if tuple(shape) != tuple(cfg.model.input_shape):
        raise ConfigError(f"model.input_shape {list(cfg.model.input_shape)}: {source_field(cfg)} "
                          f"{model_file(cfg, Path('.'))} takes input {list(shape)}")
    return [tuple(graph.shape(o)) for o in graph.outputs]


def _check_classifier_output(cfg, outputs: list[tuple[int, ...]]) -> None:
    """The network's first output, which the top-1 gate ranks, must be (batch, num_classes)."""
    out = outputs[0]
    if len(out) != 2:
        raise ConfigError(f"the network's output{'s have shapes' if len(outputs) > 1 else ' has shape'} "
                          f"{', '.join(str(list(o)) for o in outputs)}: the accuracy gate ranks top-1 classes on "
                          f"the first output and needs it (batch, model.num_classes); for a detection or "
                          f"dense-prediction network set evaluation.metric = \"outputs\" (INT8 against FP32 on "
                          f"every output)")
    if out[-1] != cfg.model.num_classes:
        raise ConfigError(f"model.num_classes = {cfg.model.num_classes}, but the network's output has shape "
                          f"{list(out)} ({out[-1]} classes)")


def _first_images(data_dir: Path, classes: int | None, per_class: int) -> list:
    items = scan_images(data_dir, classes)
    seen: dict[int, int] = {}
    picked = []
    for it in items:
        if seen.get(it.label, 0) < per_class:
            seen[it.label] = seen.get(it.label, 0) + 1
            picked.append(it)
    return picked


def gate_power(cfg) -> dict:
    """The gate's images and, per gated figure, ``power.Reach``'s estimate on them (``reaches``: records) and its
    line (``lines``): what the gate can decide, said before the long work."""
    import numpy as np

    from quantflow.evaluation import power

    from .fallback import tuning_and_gate_sets
    from .inputs import evaluation_set

    tune, judge, source = tuning_and_gate_sets(cfg)
    folder = len(evaluation_set(cfg))   # evaluation.data_dir, of which the gate may judge a part
    counts = np.unique(judge.labels, return_counts=True)[1] if len(judge) else np.zeros(0, int)
    reaches = power.gated(cfg, len(judge), int(counts.min()) if len(counts) else None)
    return {"gate_images": len(judge), "folder_images": folder, "tuning_images": 0 if tune is None else len(tune),
            "tuning_source": source, "reaches": [r.record() for r in reaches],
            "lines": [power.line(r, folder) for r in reaches]}


def preflight(cfg) -> dict:
    """Run every cheap check; raises the first problem as a QuantflowError naming the field or file."""
    from .aipp import build_and_verify

    _, c, h, w = cfg.model.input_shape
    if cfg.model.mindir or cfg.model.onnx:
        outputs = _model_file_outputs(cfg)
    else:
        outputs = _network_outputs(cfg, load_weights=cfg.train is None)
    if cfg.evaluation.metric == "top1":
        _check_classifier_output(cfg, outputs)
    checked = {}
    for field, folder in (("calibration.data_dir", cfg.calibration.data_dir),
                          ("evaluation.data_dir", cfg.evaluation.data_dir)):
        try:
            images = _first_images(cfg.path(folder), cfg.labelled_classes, 1)
        except DataError as err:
            raise DataError(f"{field} = {str(folder)!r}: {err}") from None
        for it in images:
            _, reason = check_image(it.path, c, h, w)
            if reason is not None and not (field.startswith("calibration") and cfg.calibration.on_bad_image == "skip"):
                raise DataError(f"{field}: {reason}")
        checked[field] = len(images)
    sample = [it.path for it in _first_images(cfg.path(cfg.calibration.data_dir), cfg.labelled_classes, 1)
              if check_image(it.path, c, h, w)[1] is None][:4]
    with tempfile.TemporaryDirectory() as tmp:
        aipp = build_and_verify(cfg, sample, Path(tmp) / "aipp.cfg")
    return {"network_output": list(outputs[0]), "network_outputs": [list(o) for o in outputs], "images_checked": checked, "aipp_images": aipp["images"],
            "aipp_max_abs_diff": aipp["max_abs_diff"], "power": gate_power(cfg)}


def _run(b) -> None:
    r = preflight(b.cfg)
    outs = r["network_outputs"]
    print(f"preflight: network output{'s' if len(outs) > 1 else ''} {', '.join(map(str, outs))}, images readable "
          f"({', '.join(f'{k}: {v} checked' for k, v in r['images_checked'].items())}), AIPP reproduces the "
          f"training preprocessing on {r['aipp_images']} images (largest |diff| {r['aipp_max_abs_diff']:.2e})")
    p = r["power"]
    if p["tuning_source"]:
        print(f"preflight: the gate judges {p['gate_images']} of the {p['folder_images']} images of "
              f"evaluation.data_dir; the automatic fallback tunes on {_tuning_said(b.cfg, p)}")
    for line in p["lines"]:
        print(f"preflight: the gate's power: {line}")


def _tuning_said(cfg, p: dict) -> str:
    """The tuning images, as preflight can tell them: before the sample has run, which of the calibration folder's
    images it will leave to tune on is not known yet (``fallback.tuning_and_gate_sets`` drew from the whole folder)."""
    from .fallback import MIN_TUNING_IMAGES
    from .sample import manifest_path

    e, k = cfg.evaluation, cfg.calibration
    if e.tune_dir is not None or e.tune_from != "calibration" or manifest_path(cfg).is_file():
        return f"{p['tuning_images']} others ({p['tuning_source']})"
    return (f"the images of calibration.data_dir {k.data_dir} the calibration sample (calibration.count {k.count}) "
            f"leaves out, topped up from the sample to {MIN_TUNING_IMAGES} where fewer")


def _key_inputs(b) -> dict:
    from .aipp import source_digest

    c = b.cfg
    model_file = c.path(c.model.checkpoint) if c.model.checkpoint and c.train is None else (
        c.path(c.model.mindir or c.model.onnx) if (c.model.mindir or c.model.onnx) else None)
    return {"config": c.canonical_json(), "model_file": file_sha256(model_file) if model_file and model_file.is_file()
            else None, "aipp_source": source_digest(c),
            "images": [folder_digest(c.path(c.calibration.data_dir), IMAGE_EXTS),
                       folder_digest(c.path(c.evaluation.data_dir), IMAGE_EXTS)]}


STAGE = Stage(
    name="preflight", doc="cheap checks of the network, data and preprocessing, before any expensive stage",
    run=_run, keyed=False, key_inputs=_key_inputs,
    file_dep=lambda b: module_file(b.cfg.model.entry) if b.cfg.model.entry else [],
    status=lambda b: ("-", None))
