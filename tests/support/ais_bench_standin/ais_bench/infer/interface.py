"""Stand-in for ``ais_bench.infer.interface.InferSession`` (ait benchmark component, ``interface.py``), for tests on a
machine without an Ascend NPU: the "offline model" is a JSON file naming a ``deploy.onnx`` and the ``aipp.cfg`` the
.om would have been built with (``{"deploy_onnx": ..., "aipp_cfg": ...}``).  Like the real runtime it checks only
the input's byte size (ait ``ModelInferenceProcessor.cpp``: "in size:%zu needsize:%zu not match"); "the device" is
AIPP written from CANN's documentation (``support.aipp_reference``) feeding ``support.deploy_interpreter``, which
executes deploy.onnx from the operator specifications.  A deploy.onnx with other inputs (``model.inputs``) takes
them after the frames, float32 at the frames' batch, as declared.  Nothing here is quantflow's own code."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from support import aipp_reference, deploy_interpreter


@dataclass
class TensorDesc:
    """The fields of aclruntime's ``tensor_desc`` (API_GUIDE.md): name, datatype, format (1: NHWC), shape, size,
    realsize (bytes)."""
    name: str
    datatype: str
    format: int
    shape: list
    size: int
    realsize: int


class InferSession:
    def __init__(self, device_id: int, model_path: str, acl_json_path: str = None, debug: bool = False,
                 loop: int = 1):
        spec = json.loads(Path(model_path).read_text())
        self.device_id = device_id
        self.model = onnx.load(spec["deploy_onnx"])
        self.aipp = aipp_reference.read_config(Path(spec["aipp_cfg"]).read_text())
        dims = self.model.graph.input[0].type.tensor_type.shape.dim
        self.batch = dims[0].dim_value
        size = self.batch * aipp_reference.frame_bytes(self.aipp)
        self.inputs = [TensorDesc(self.model.graph.input[0].name, "uint8", 1, [size], size, size)]
        for i in self.model.graph.input[1:]:   # the others as declared, float32, at the frames' batch
            shape = [self.batch] + [d.dim_value for d in i.type.tensor_type.shape.dim[1:]]
            nbytes = 4 * int(np.prod(shape))
            self.inputs.append(TensorDesc(i.name, "float32", 0, shape, nbytes, nbytes))
        self.outputs = [TensorDesc(o.name, "float32", 0, [d.dim_value for d in o.type.tensor_type.shape.dim], 0, 0)
                        for o in self.model.graph.output]
        self.calls = 0

    def get_inputs(self):
        return self.inputs

    def get_outputs(self):
        return self.outputs

    def infer(self, feeds, mode: str = "static", custom_sizes=100000, out_array: bool = True):
        assert mode == "static" and len(feeds) == len(self.inputs)
        feeds = [np.ascontiguousarray(f) for f in feeds]
        for k, (f, desc) in enumerate(zip(feeds, self.inputs)):
            if f.nbytes != desc.size:
                raise RuntimeError(f"Check i:{k} name:{desc.name} in size:{f.nbytes} needsize:{desc.size} not match")
        frames = feeds[0].view(np.uint8).reshape(self.batch, -1)
        x16 = np.stack([aipp_reference.aipp(self.aipp, f) for f in frames])
        others = {d.name: f.view(np.float32).reshape(d.shape) for d, f in zip(self.inputs[1:], feeds[1:])}
        self.calls += 1
        return [np.asarray(o, np.float32) for o in deploy_interpreter.run(self.model, x16, others)]

    def free_resource(self):
        pass

    @staticmethod
    def finalize():
        pass
