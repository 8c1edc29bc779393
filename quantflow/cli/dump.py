"""``quantflow dump``: the emulation's per-layer tensors for one batch of images, as golden data for CANN's
accuracy comparison (msaccucmp / msprobe), so that a dump of the .om on the device can be compared layer by layer.

Naming (CANN "Data Format Requirements", atlasaccuracy_16_0062: ".npy file (Caffe, TensorFlow, or ONNX) |
{op_name}.{output_index}.{timestamp}.npy"; "Periods (.), forward slashes (/), backslashes (\\), and spaces in
op_type or op_name are replaced with underscores"; msaccucmp's ``NUMPY_DUMP_PATTERN``
``^([\\.A-Za-z0-9_-]+\\.[0-9]+)\\.[0-9]{1,255}\\.npy$``): one file per output of each node of the ONNX the .om was
converted from (``deploy.onnx``; ``graph.onnx`` for ``build.atc_model = "fp32"``), the node's name with every
character outside ``[A-Za-z0-9_-]`` made ``_``, the output's index, and one microsecond timestamp for the dump.
msaccucmp matches them with the .om's ops through the ``_datadump_original_op_names`` that atc records (the
original ONNX node names).  Values: what the emulation computes for the tensor, in the device's type (int8 after
AscendQuant, int32 out of the cube, float16 values held as float32 elsewhere, as ONNX goldens are).

Beside the goldens: ``input/frames.bin`` (the .om's input for these images: the frames in the AIPP input format,
for ``ais_bench --input ... --dump 1``), ``input/aipp_output.npy`` (AIPP's float16 output: what ait's compare
feeds an ONNX golden of an AIPP model) and ``dump.json`` (the images, every golden file and the node, tensor,
dtype and shape it holds, the outputs not dumped and why).  A network with other inputs (``model.inputs``) gets
one folder per .om input instead, numbered in its order -- ``input/0_frames/frames.bin``,
``input/1_<name>/<name>.bin`` with the value the gate fed it -- since ais_bench takes several inputs as one folder
each, in the model's input order (ait ``examples/cli/benchmark/02_specify_input_data/README.md``: "模型输入需要与
传入文件夹的个数一致 ... 顺序要对应").
"""
from __future__ import annotations

import io
import json
import re
import time
from pathlib import Path

import numpy as np
import onnx

from ..errors import QuantflowError
from ..io.atomic import write_bytes, write_json
from .device import LastBuild, frames, held_out, last_build, other_inputs

DUMP_JSON = "dump.json"
GOLDEN, INPUT = "golden", "input"


def golden_name(op_name: str, output_index: int, timestamp: int) -> str:
    """``{op_name}.{output_index}.{timestamp}.npy`` with the op name as msaccucmp reads it."""
    return f"{re.sub(r'[^A-Za-z0-9_-]', '_', op_name)}.{output_index}.{timestamp}.npy"


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def emulated_tensors(graph, names: list[str], x16: np.ndarray) -> dict[str, np.ndarray]:
    """The emulation's values of the IR tensors ``names`` for the float16 input ``x16``, each in the IR's type
    (the float16 lowering carries an int8 tensor as uint8 ``q + 128``: ``quantflow.ops.quant``)."""
    from ..engine.lowering import lower
    from ..engine.int8_emulator import keeps_every_step
    from ..engine.runner import Runner
    from ..ops.quant import ZERO_SHIFT

    model = lower(graph, "float16", extra_outputs=names)
    # the lowering declares every extra output float32: take each one's real type from shape inference over the
    # graph without its outputs (where they are inner tensors)
    bare = onnx.ModelProto()
    bare.CopyFrom(model)
    del bare.graph.output[:]
    inferred = onnx.shape_inference.infer_shapes(bare)
    types = {v.name: v.type.tensor_type.elem_type for v in inferred.graph.value_info}
    for out in model.graph.output:
        if out.name in types:
            out.type.tensor_type.elem_type = types[out.name]
    # run as the gate's emulation runs (onnxruntime's optimizations, vetted): the same float kernels, so that a
    # float16 convolution's float32 sums come out as there
    feeds = dict(zip(graph.inputs, (i.name for i in model.graph.input)))
    runner = Runner(model, feeds[graph.inputs[0]], graph.tensors[graph.inputs[0]].shape[0],
                    keeps=keeps_every_step(model), input_dtype=np.float16,
                    fixed={feeds[k]: v for k, v in graph.fixed_inputs.items() if k in feeds})
    values = runner.run(x16, names)
    out = {}
    for name, v in values.items():
        dtype = graph.tensors[name].dtype if name in graph.tensors else "float32"
        if dtype == "int8" and v.dtype == np.uint8:
            v = (v.astype(np.int16) - ZERO_SHIFT).astype(np.int8)
        out[name] = v
    return out


def _clear_previous(out: Path) -> None:
    """A folder holding an earlier dump loses its files (so msaccucmp never sees two timestamps); any other
    non-empty folder is refused."""
    listing = out / DUMP_JSON
    if listing.is_file():
        old = json.loads(listing.read_text())
        for f in [g["file"] for g in old.get("golden", [])] + old.get("inputs", []):
            (out / f).unlink(missing_ok=True)
    elif out.is_dir() and any(out.iterdir()):
        raise QuantflowError(f"{out} is not empty and holds no earlier dump ({DUMP_JSON}); give an empty folder with -o")


def dump(config: Path, out: Path | None, image_paths: list[Path]) -> int:
    build = last_build(config)
    cfg = build.cfg
    batch = cfg.model.input_shape[0]
    names, images = _images(build, image_paths, batch)
    out = Path(out) if out else cfg.out / "dump"
    _clear_previous(out)
    source = onnx.load(str(build.source_onnx), load_external_data=False)
    graph = build.emulated_graph()
    x16 = _aipp(build, images)
    wanted, skipped = [], []
    for node in source.graph.node:
        for k, t in enumerate(node.output):
            if t in graph.tensors:
                wanted.append((node, k, t))
            elif t:
                skipped.append({"node": node.name, "op_type": node.op_type, "output_index": k, "tensor": t,
                                "reason": "an inner tensor of the node's lowering, not a tensor the emulation names"})
    values = emulated_tensors(graph, list(dict.fromkeys(t for _, _, t in wanted)), x16)
    ts = int(time.time() * 1e6)
    golden = []
    for node, k, t in wanted:
        v = values[t]
        v = v if v.dtype in (np.int8, np.int32) else v.astype(np.float32)
        fname = golden_name(node.name, k, ts)
        write_bytes(out / GOLDEN / fname, _npy(v))
        golden.append({"file": f"{GOLDEN}/{fname}", "node": node.name, "op_type": node.op_type, "output_index": k,
                       "tensor": t, "dtype": str(v.dtype), "shape": list(v.shape)})
    raw = frames(build.params, images, cfg.aipp.input_channel_order)
    device_inputs = _write_device_inputs(out, source.graph.input[0].name, raw,
                                         other_inputs(build.source_onnx, graph.fixed_inputs, batch))
    write_bytes(out / INPUT / "aipp_output.npy", _npy(x16.astype(np.float16)))
    om = build.om or "model.om"
    given = ",".join(str(out / (d["file"] if len(device_inputs) == 1 else Path(d["file"]).parent))
                     for d in device_inputs)
    listing = {
        "images": names, "timestamp": ts, "source_onnx": str(build.source_onnx), "aipp_config": str(build.dirs["aipp"] / "aipp.cfg"),
        "input_format": build.params.get("input_format"), "frames_bytes": int(raw.nbytes),
        "device_inputs": device_inputs, "inputs": [d["file"] for d in device_inputs] + [f"{INPUT}/aipp_output.npy"],
        "golden": golden, "not_dumped": skipped,
        "device_dump": f"python3 -m ais_bench --model {om} --input {given} --dump 1 --output <device_dump_dir>",
        "om_json": f"atc --mode=1 --om={om} --json=model.json",
        "compare": f"python3 msaccucmp.py compare -m <the folder of the device's dump files> -g {out / GOLDEN} "
                   f"-f model.json"}
    write_json(out / DUMP_JSON, listing, sort_keys=False)
    print(f"wrote {len(golden)} golden tensors of {len(names)} image(s) to {out / GOLDEN} "
          f"({len(skipped)} inner tensors not dumped; {out / DUMP_JSON} lists them)")
    print(f"on the Ascend host:\n  {listing['device_dump']}\n  {listing['om_json']}\n  {listing['compare']}")
    return 0


def _write_device_inputs(out: Path, image_input: str, raw: np.ndarray, others: list) -> list[dict]:
    """The .om's inputs for the dumped batch, written under ``out/input`` (module docstring): the frames ``raw`` of
    ``image_input``, then ``others`` (``device.other_inputs``); each one's input name, file, dtype and shape."""
    named = [(image_input, "frames", raw)] + [(name, re.sub(r"[^A-Za-z0-9_-]", "_", name), v) for name, v in others]
    rows = []
    for k, (name, stem, value) in enumerate(named):
        file = f"{INPUT}/{stem}.bin" if len(named) == 1 else f"{INPUT}/{k}_{stem}/{stem}.bin"   # one folder each
        write_bytes(out / file, np.ascontiguousarray(value).tobytes())
        rows.append({"input": name, "file": file, "dtype": str(value.dtype), "shape": list(value.shape)})
    return rows


def _images(build: LastBuild, paths: list[Path], batch: int):
    """``paths`` (or the first held-out images): one model batch, the last image repeated to fill it."""
    from ..data.images import load_images

    _, c, h, w = build.cfg.model.input_shape
    if paths:
        if len(paths) > batch:
            raise QuantflowError(f"--image given {len(paths)} times; the model's batch (model.input_shape) is {batch}")
        names, images = [str(p) for p in paths], load_images(paths, c, h, w)
    else:
        names, held, _ = held_out(build.cfg, batch)
        images = load_images(held, c, h, w)
    if len(images) < batch:
        images = np.concatenate([images, np.repeat(images[-1:], batch - len(images), axis=0)])
        names = names + [names[-1]] * (batch - len(names))
    return names, images


def _aipp(build: LastBuild, images: np.ndarray) -> np.ndarray:
    from ..engine.aipp import aipp_batch
    return aipp_batch(build.params, images, build.cfg.aipp.input_channel_order)
