"""What ``quantflow verify`` and ``quantflow dump`` share: the last build that passed the gate (named by
``<output_dir>/latest.json``), its AIPP config, the network the gate emulated, the held-out images as the
frames the device receives (``quantflow.engine.aipp.device_frame``), and the .om's other inputs (``model.inputs``)
with the values the gate fed them."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config import load_config
from ..errors import QuantflowError


@dataclass(frozen=True)
class LastBuild:
    cfg: object
    latest: dict
    dirs: dict                # stage -> artifact folder
    params: dict              # the verified AIPP config
    atc_model: str            # "int8" (the deploy graph) or "fp32": what the .om was converted from

    @property
    def om(self) -> Path | None:
        return Path(self.latest["om"]) if self.latest.get("om") else None

    @property
    def source_onnx(self) -> Path:
        """The ONNX whose node names an .om converted from it carries: deploy.onnx, or for ``build.atc_model =
        "fp32"`` the FP32 graph.onnx."""
        return Path(self.latest["deploy_onnx"] if self.atc_model == "int8" else self.latest["graph_onnx"])

    def emulated_graph(self):
        """The IR the emulation runs: the INT8 deploy IR the gate emulated, or for an FP32 .om the network itself
        (run in float16, as ``allow_fp32_to_fp16`` runs it)."""
        from ..quantization.deploy import quantized_graph
        from ..quantization.passes import fold_for_quantization
        from ..quantization.qparams import QuantParams
        from ..tasks.inputs import read_graph

        graph = read_graph(self.cfg, self.dirs["graph"])
        if self.atc_model != "int8":
            return graph
        return quantized_graph(fold_for_quantization(graph), QuantParams.load(self.dirs["fallback"]))


def last_build(config: Path) -> LastBuild:
    """The configuration's last build that passed the gate; a clear error when there is none."""
    from ..tasks.aipp import read_params
    from ..tasks.atc import ATC_JSON
    from ..tasks.summary import latest_path, read_latest

    cfg = load_config(config)
    path = latest_path(cfg)
    if not path.is_file():
        raise QuantflowError(f"no build to check: {path} not found (run `quantflow build {config}` first; it is "
                             f"written when a build passes its gate)")
    latest = read_latest(path)
    try:
        dirs = {k: Path(v) for k, v in latest["artifacts"].items()}
        params = read_params(dirs["aipp"])
        atc = json.loads((dirs["atc"] / ATC_JSON).read_text())
    except (KeyError, TypeError, OSError, ValueError) as err:
        raise QuantflowError(f"{path} does not name a complete build ({err}); rebuild with `quantflow build`") from None
    return LastBuild(cfg, latest, dirs, params, atc.get("model", "int8"))


def held_out(cfg, count: int | None):
    """(names, paths, (C, H, W)) of the first ``count`` (default all) held-out images of ``evaluation.data_dir``;
    the images are read a batch at a time (``load_images``)."""
    from ..tasks.inputs import evaluation_set

    ev = evaluation_set(cfg)
    n = len(ev) if count is None else min(count, len(ev))
    if n < 1:
        raise QuantflowError(f"--images must be at least 1, got {count}")
    return list(ev.names[:n]), list(ev.paths[:n]), ev.shape


def frames(params: dict, images: np.ndarray, frame_order: str) -> np.ndarray:
    """The frames the device receives for ``images``, stacked (N, ...) uint8, C-contiguous: what the .om's input
    takes (its byte size is N x the AIPP input format's frame size)."""
    from ..engine.aipp import device_frame, spec

    a = spec(params)
    return np.ascontiguousarray(np.stack([device_frame(a, img, frame_order) for img in images]))


def other_inputs(source_onnx: Path, fixed: dict, batch: int) -> list[tuple[str, np.ndarray]]:
    """The .om's inputs after the frames, in the order of ``source_onnx`` (the ONNX atc converted: its image input
    first, then the others, as atc's ``--input_shape`` names them), each with its value for one batch of ``batch``:
    the configured ``model.inputs`` value (``fixed``: ``Graph.fixed_inputs``) for every image, in the input's ONNX
    element type (an ONNX float32 input stays float32 in the .om), C-contiguous."""
    import onnx
    from onnx.helper import tensor_dtype_to_np_dtype

    from ..data.extra_inputs import FIELD, batch_of
    from ..engine.onnx_builder import graph_inputs

    out = []
    for i in graph_inputs(onnx.load(str(source_onnx), load_external_data=False))[1:]:
        if i.name not in fixed:
            raise QuantflowError(f"{source_onnx} takes input {i.name!r}, which {FIELD} gives no value: rebuild with "
                                 f"this configuration (`quantflow build`)")
        dtype = tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)
        out.append((i.name, np.ascontiguousarray(batch_of(np.asarray(fixed[i.name]), batch), dtype)))
    return out
