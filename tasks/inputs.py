"""What several stages read, made one way from the configuration: the calibration images as preprocessed
batches, the held-out set, the network as graph IR, and the model file's names of its outputs."""
from __future__ import annotations

from pathlib import Path

from quantflow.data.images import ImageBatches
from quantflow.evaluation.runs import HeldOut, held_out


def image_batches(cfg, paths, batch_size: int) -> ImageBatches:
    """``paths`` in the training preprocessing, ``batch_size`` images at a time."""
    _, c, h, w = cfg.model.input_shape
    n = cfg.normalization
    return ImageBatches(paths, c, h, w, n.mean, n.std, n.scale, n.channel_order, batch_size)


def evaluation_set(cfg) -> HeldOut:
    """The held-out images of ``evaluation.data_dir`` and how each reaches FP32 and INT8."""
    e, n = cfg.evaluation, cfg.normalization
    return held_out(cfg.path(e.data_dir), cfg.labelled_classes, e.allow_missing_classes, cfg.root,
                    shape=tuple(cfg.model.input_shape[1:]), normalization=(n.mean, n.std, n.scale, n.channel_order),
                    frame_order=cfg.aipp.input_channel_order, batch_size=e.batch_size, engine=cfg.engine)


def read_graph(cfg, graph_dir: Path):
    """The network as graph IR (from the file the graph stage checked)."""
    from quantflow.frontends.source import read_model
    return read_model(cfg, graph_dir)


def output_names(cfg, graph) -> dict | None:
    """The model file's names of the graph's outputs (an ONNX file's declared outputs, e.g. ``output0``), which
    the report, ``evaluation.parts`` and task metrics use; None where the file names none (the IR's own names)."""
    if cfg.model.onnx is None:
        return None
    import onnx
    names = cfg.model.outputs or [o.name for o in onnx.load(str(cfg.path(cfg.model.onnx)),
                                                            load_external_data=False).graph.output]
    declared = [n for n in names if n not in graph.constant_outputs]   # not among the IR's outputs
    return dict(zip(graph.outputs, declared)) if len(declared) == len(graph.outputs) else None


def compared_regions(cfg, graph) -> list:
    """Each network output once, at the finest the gate compares it (``evaluation.parts.finest``: its parts, else
    the whole output), named as the graph IR names its outputs: what the retraining's loss and the recovery's
    guard are taken over, so that no part hides another."""
    from dataclasses import replace

    from quantflow.evaluation.outputs import network_regions
    from quantflow.evaluation.parts import finest

    names = output_names(cfg, graph) or {}
    by_name = {names.get(o, o): o for o in graph.outputs}   # the regions name outputs as the model file does
    return [replace(r, output=by_name[r.output]) for r in finest(network_regions(graph, cfg.evaluation, names=names))]


def recalibrator(cfg, folded, calibration_paths):
    """The calibration stage's own work again, as a function of new parameters: their float weights applied to the
    BatchNorm-folded graph ``folded``, ranges from every calibration image by ``calibration.method``, the Ascend
    parameters (bias-corrected where the configuration asks).  What a method that changes the float weights
    (cross-layer equalization: the recovery's, the retraining's start) calibrates its result with."""
    from quantflow.quantization.calibrater import calibrate
    from quantflow.quantization.sensitivity import analyse, correct_bias

    k, q = cfg.calibration, cfg.quantization

    def recalibrate(recovered):
        g = recovered.apply(folded)
        new = calibrate(g, image_batches(cfg, calibration_paths, k.batch_size), k.method, k.percentile,
                        k.histogram_bins, k.kl_max_clipped, q.skip, q.methods)
        if q.bias_correction:
            sample = image_batches(cfg, calibration_paths[:q.sensitivity_images], k.batch_size)
            new = correct_bias(new, analyse(g, new, sample, bias_shift=True, engine=cfg.engine).bias_shift)
        return new

    return recalibrate


# the stages that write the INT8 parameters (qparams), in build order: each reads the last one before it that the
# configuration has, and the stages after them (the per-layer analysis, the fallback) read the last of all
PARAMETER_STAGES = ("calibrate", "recover", "retrain")


def parameters_stage(cfg, before: str | None = None) -> str:
    """The last parameter stage (``PARAMETER_STAGES``) this configuration has, or the last before ``before``."""
    from . import STAGES

    names = PARAMETER_STAGES[:PARAMETER_STAGES.index(before)] if before else PARAMETER_STAGES
    return [n for n in names if STAGES[n].used(cfg)][-1]


def parameters_dir(b, before: str | None = None) -> Path:
    """The folder of the INT8 parameters (qparams.json / .npz) of ``parameters_stage``."""
    return b.dir(parameters_stage(b.cfg, before))


def recovered_check(b) -> dict | None:
    """The recover stage's check on the tuning images of the parameters it saved (``TUNING_CHECK``), where the
    stages after it start from those parameters (no retraining since) and it made one: the fallback's step 0."""
    import json

    import numpy as np

    from quantflow.evaluation.verdicts import DRAWS
    from quantflow.io.files import TUNING_CHECK, TUNING_CHECK_DRAWS

    if parameters_stage(b.cfg) != "recover":
        return None
    folder = b.dir("recover", create=False)
    if not (folder / TUNING_CHECK).is_file():
        return None
    check = json.loads((folder / TUNING_CHECK).read_text())
    with np.load(folder / TUNING_CHECK_DRAWS) as z:
        check[DRAWS] = {k: z[k] for k in z.files}
    return check
