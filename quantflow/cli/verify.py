"""``quantflow verify``: on an Ascend host, run the built .om on the held-out images -- each fed as the frame the
device receives, in the AIPP input format -- with the Ascend inference tool's Python API (ais_bench's
``InferSession``), and compare every output with the emulation the gate measured: cosine similarity, largest
difference, share of identical values, worst image.  The result is written beside the gate's report
(``device_verify.json`` in the gate's artifact folder) and printed as a table; the command exits 1 when an
output's cosine falls below ``--min-cosine``.

ais_bench API (ait ``ais_bench/infer/interface.py``, ``docs/benchmark/API_GUIDE.md``):
``InferSession(device_id, model_path)``, ``get_inputs()`` (``.size``: the input's bytes), ``get_outputs()``,
``infer(feeds)`` -> numpy arrays.  A static-AIPP model's runtime checks only the byte size of the input buffer
(ait ``ModelInferenceProcessor.cpp``: "in size ... needsize ... not match"), so each batch of frames is passed
as one C-contiguous uint8 array of that size.  A network with other inputs (``model.inputs``) is fed them after the
frames, in the .om's input order, each with the value the gate fed it for every image (``device.other_inputs``).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import QuantflowError
from ..io.atomic import write_json
from .device import LastBuild, frames, held_out, last_build, other_inputs

VERIFY_JSON = "device_verify.json"
DEFAULT_MIN_COSINE = 0.999

# ais_bench is not on PyPI: two packages, from the Ascend ait repository (gitee.com/ascend/ait, benchmark
# component README "工具安装"), which need CANN's runtime (source its set_env.sh)
INSTALL = ("the Ascend inference tool's Python API (ais_bench) is not installed. It is two pip packages from "
           "Ascend's ait tools, not on PyPI: aclruntime (the runtime binding, built against CANN) and ais_bench. "
           "On the Ascend host, with CANN's set_env.sh sourced:\n"
           "  pip3 install -v 'git+https://gitee.com/ascend/tools.git#egg=aclruntime&subdirectory=ais-bench_workload/tool/ais_bench/backend'\n"
           "  pip3 install -v 'git+https://gitee.com/ascend/tools.git#egg=ais_bench&subdirectory=ais-bench_workload/tool/ais_bench'\n"
           "or the aclruntime-*.whl / ais_bench-*.whl wheels linked from the README of "
           "https://gitee.com/ascend/ait/tree/master/ait/components/benchmark")


def infer_session_class():
    """ais_bench's ``InferSession``, or a ``QuantflowError`` saying what to install."""
    try:
        from ais_bench.infer.interface import InferSession
    except ImportError as err:
        raise QuantflowError(f"{INSTALL}\n(import failed: {err})") from None
    return InferSession


class _Stats:
    """Per output, per image: the sums the comparison needs (bounded memory: no output is kept)."""

    def __init__(self):
        self.rows: list[np.ndarray] = []     # per image: dot, |d|^2, |e|^2, max |d - e|, identical, values

    def add(self, device: np.ndarray, emulated: np.ndarray) -> None:
        d, e = device.astype(np.float64), emulated.astype(np.float64)
        self.rows.append(np.stack([np.sum(d * e, 1), np.sum(d * d, 1), np.sum(e * e, 1), np.abs(d - e).max(1),
                                   np.sum(d == e, 1), np.full(len(d), d.shape[1], np.float64)], 1))

    def result(self, names: list[str]) -> dict:
        r = np.concatenate(self.rows)
        cos = _cosine(r[:, 0], r[:, 1], r[:, 2])
        worst = int(np.lexsort((-r[:, 3], cos))[0])
        return {"cosine": float(_cosine(r[:, 0].sum(), r[:, 1].sum(), r[:, 2].sum())),
                "max_abs_diff": float(r[:, 3].max()), "identical_share": float(r[:, 4].sum() / r[:, 5].sum()),
                "worst": {"image": names[worst], "cosine": float(cos[worst]), "max_abs_diff": float(r[worst, 3])}}


def _cosine(dot, dd, ee):
    dot, dd, ee = (np.asarray(v, np.float64) for v in (dot, dd, ee))
    denom = np.sqrt(dd * ee)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denom > 0, dot / np.where(denom > 0, denom, 1.0), np.where((dd == 0) & (ee == 0), 1.0, 0.0))


def compare(build: LastBuild, session, names: list[str], paths: list, shape) -> list[dict]:
    """Each output of the .om (``session``) against the emulation, over the images of ``paths`` (``shape``: C, H, W),
    read and run one model batch at a time."""
    from ..data.images import load_images
    from ..engine.int8_emulator import Emulator

    emulator = Emulator(build.emulated_graph())
    batch = build.cfg.model.input_shape[0]
    others = other_inputs(build.source_onnx, emulator.graph.fixed_inputs, batch)
    om_inputs = session.get_inputs()
    if len(om_inputs) != 1 + len(others):
        raise QuantflowError(f"the .om takes {len(om_inputs)} input(s), this build's {build.source_onnx.name} "
                             f"{1 + len(others)}: was the .om built from it?")
    for desc, (name, value) in zip(om_inputs[1:], others):
        if int(desc.size) != value.nbytes:
            raise QuantflowError(f"the .om's input {getattr(desc, 'name', name)} takes {int(desc.size)} bytes per "
                                 f"batch of {batch}, input {name} of this build (model.inputs) {value.nbytes}")
    need = int(om_inputs[0].size)
    out_names = [getattr(o, "name", str(i)) for i, o in enumerate(session.get_outputs())]
    graph_outputs = list(emulator.graph.outputs)
    # the source model's constant outputs follow the others in the deploy graph (Graph.constant_outputs)
    constants = {k: np.asarray(v, np.float64).reshape(1, -1) for k, v in emulator.graph.constant_outputs.items()}
    if len(out_names) != len(graph_outputs) + len(constants):
        raise QuantflowError(f"the .om has {len(out_names)} output(s), the emulated network "
                             f"{len(graph_outputs) + len(constants)}: was the .om built from this build's "
                             f"{build.source_onnx.name}?")
    stats = [_Stats() for _ in out_names]
    for s in range(0, len(paths), batch):
        chunk = load_images(paths[s:s + batch], *shape)
        real = len(chunk)
        x = frames(build.params, chunk, build.cfg.aipp.input_channel_order)
        if real < batch:  # the .om's batch is static: fill with the last frame, compare only the real ones
            x = np.ascontiguousarray(np.concatenate([x, np.repeat(x[-1:], batch - real, axis=0)]))
        if x.nbytes != need:
            raise QuantflowError(f"the .om's input takes {need} bytes per batch of {batch}, the frames of this build's "
                                 f"AIPP config ({build.params.get('input_format')}) are {x.nbytes}: was the .om "
                                 f"built with {build.dirs['aipp'] / 'aipp.cfg'}?")
        try:
            device = session.infer([x] + [value for _, value in others])
        except (RuntimeError, ValueError, OSError) as err:
            raise QuantflowError(f"ais_bench inference failed on images {s + 1}-{s + real}: {err}") from None
        emulated = emulator.outputs(emulator_input(build, chunk))
        for k, name in enumerate(graph_outputs):
            e = emulated[name].reshape(real, -1)
            d = np.asarray(device[k])
            if d.size != batch * e.shape[1]:
                raise QuantflowError(f".om output {out_names[k]} holds {d.size} values per batch, the emulation's "
                                     f"{name} {batch * e.shape[1]}")
            stats[k].add(d.reshape(batch, -1)[:real], e)
        for k, (name, e) in enumerate(constants.items(), len(graph_outputs)):   # the same value for every image
            d = np.asarray(device[k]).reshape(1, -1)
            if d.size != e.size:
                raise QuantflowError(f".om output {out_names[k]} holds {d.size} values, the constant {name} {e.size}")
            stats[k].add(np.repeat(d, real, axis=0), np.repeat(e, real, axis=0))
    return [{"output": out_names[k], "emulated": name, **stats[k].result(names)}
            for k, name in enumerate(graph_outputs + list(constants))]


def emulator_input(build: LastBuild, images: np.ndarray) -> np.ndarray:
    from ..engine.aipp import aipp_batch
    return aipp_batch(build.params, images, build.cfg.aipp.input_channel_order)


def format_table(report: dict) -> str:
    lines = [f"{report['om']} on device {report['device']}: {report['images']} held-out images in "
             f"{report['input_format']}, against the {report['emulation']} emulation",
             f"  {'output':<20} {'cosine':>10} {'max |diff|':>12} {'identical':>10}  worst image (cosine)"]
    for o in report["outputs"]:
        lines.append(f"  {o['output']:<20} {o['cosine']:>10.6f} {o['max_abs_diff']:>12.4g} "
                     f"{o['identical_share']:>9.2%}  {o['worst']['image']} ({o['worst']['cosine']:.6f})")
    lines.append(f"verify: {'PASS' if report['passed'] else 'FAIL'} (every output's cosine >= {report['min_cosine']})")
    return "\n".join(lines)


def verify(config: Path, om: Path | None, device: int, count: int | None, min_cosine: float) -> int:
    build = last_build(config)
    om = om or build.om
    if om is None:
        raise QuantflowError(f"the last build has no .om ({build.latest.get('atc')}); build on the Ascend host or give "
                             f"--om FILE")
    if not Path(om).is_file():
        raise QuantflowError(f".om not found: {om}")
    if not 0.0 < min_cosine <= 1.0:
        raise QuantflowError(f"--min-cosine must be in (0, 1], got {min_cosine}")
    InferSession = infer_session_class()
    names, paths, shape = held_out(build.cfg, count)
    try:
        session = InferSession(device, str(om))
    except (RuntimeError, ValueError, OSError) as err:
        raise QuantflowError(f"ais_bench could not load {om} on device {device}: {err}") from None
    try:
        outputs = compare(build, session, names, paths, shape)
    finally:
        free = getattr(session, "free_resource", None)
        if free:
            free()
    report = {"om": str(om), "device": device, "images": len(names), "input_format": build.params.get("input_format"),
              "aipp_config": str(build.dirs["aipp"] / "aipp.cfg"),
              "emulation": "INT8" if build.atc_model == "int8" else "float16 (the FP32 network)",
              "min_cosine": min_cosine, "outputs": outputs,
              "passed": all(o["cosine"] >= min_cosine for o in outputs)}
    path = write_json(build.dirs["gate"] / VERIFY_JSON, report, sort_keys=False)
    print(format_table(report))
    print(f"written: {path}")
    return 0 if report["passed"] else 1
