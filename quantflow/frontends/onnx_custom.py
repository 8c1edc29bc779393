"""Ops outside standard ONNX in an ONNX file: those a converter leaves behind with a standard meaning, rewritten as
the standard ops that compute it (``standard_form``: the reader and onnxruntime then both run that form), and the
rest named with their domain and the fix (``nonstandard_nodes``, ``unknown_op_fix``).

MediaPipe's ``Convolution2DTransposeBias`` (a TFLite custom op): tf2onnx writes every TFLite op it cannot convert
as ``"TFL_" + <custom code>`` in the default domain, or in the domain given by ``--custom-ops``
(onnx/tensorflow-onnx ``tf2onnx/tflite_utils.py``: ``optype = 'TFL_' + opcodes_map[...]``; ``tfonnx.py``: an
unmapped op is only logged, "Unsupported ops"), with no attributes: the op's options are a raw
``TfLiteTransposeConvParams`` {padding, stride_width, stride_height}, not the flexbuffer map tf2onnx parses.
Inputs: the NHWC input, the weight as OHWI (C_out, kh, kw, C_in) and the bias (C_out,); MediaPipe's kernel
(google/mediapipe ``mediapipe/util/tflite/operations/transpose_conv_bias.cc``) computes
``out[y * s - P // 2 + fy] += x[y] * w[o, fy, fx, i]`` over an output of ``s * (in - 1) + k - P`` starting from the
bias, with P = max(0, k - (in - 1) % s - 1) for SAME padding and 0 for VALID: ONNX's ConvTranspose with the weight
as (C_in, C_out, kh, kw), pads [P // 2, P - P // 2], between NHWC <-> NCHW Transposes.  The stride is not in the
file: it is the one the model's shapes allow (the op's output shape where declared, as tf2onnx declares it for an
op given a domain with ``--custom-ops``, and the graph's declared outputs).
"""
from __future__ import annotations

import numpy as np

from ..errors import UnsupportedNetworkError

TRANSPOSE_CONV_BIAS = ("TFL_Convolution2DTransposeBias", "Convolution2DTransposeBias")
_STRIDES = range(1, 5)    # the strides tried for a transposed convolution whose stride the file does not hold
_DEFAULT = ("", "ai.onnx")


def _opset(model) -> int:
    return next((o.version for o in model.opset_import if o.domain in _DEFAULT), 1)


def _defined_since(op_type: str, opset: int | None = None) -> int | None:
    """The opset of the definition of ``op_type`` in ONNX's default domain in force at ``opset`` (the latest if
    None); None where there is none."""
    import onnx.defs
    try:
        if opset is None:
            return onnx.defs.get_schema(op_type, domain="").since_version
        return onnx.defs.get_schema(op_type, opset, domain="").since_version
    except onnx.defs.SchemaError:
        return None


def is_standard(domain: str, op_type: str, opset: int) -> bool:
    """Whether ONNX's default domain defines the op at the model's ``opset`` (no other domain is standard here)."""
    return domain in _DEFAULT and _defined_since(op_type, opset) is not None


def nonstandard_nodes(model) -> list[tuple[str, str, str]]:
    """(node name, domain, op type) of every node outside standard ONNX: in a domain other than the default one, or
    an op the default domain does not define at the model's opset (an unconverted ``TFL_...`` op)."""
    opset = _opset(model)
    return [(n.name or f"v{k}", n.domain or "ai.onnx", n.op_type) for k, n in enumerate(model.graph.node)
            if not is_standard(n.domain, n.op_type, opset)]


def describe_nodes(found: list[tuple[str, str, str]], most: int = 10) -> str:
    """``domain:op_type`` of each kind of node in ``found`` (how many, the first node), for a message."""
    kinds: dict[tuple[str, str], list[str]] = {}
    for name, domain, op in found:
        kinds.setdefault((domain, op), []).append(name)
    shown = [f"{d}:{op} x{len(names)} (first at node {names[0]})" for (d, op), names in list(kinds.items())[:most]]
    return ", ".join(shown) + (f" and {len(kinds) - most} more kinds" if len(kinds) > most else "")


def unknown_op_fix(domain: str, op_type: str, opset: int) -> str:
    """What to do about an op quantflow cannot read, by where it comes from."""
    if op_type.startswith("TFL_"):
        return (f"tf2onnx left the TFLite op {op_type[4:]} unconverted (it has no ONNX conversion): convert the "
                f"TensorFlow / Keras model rather than the .tflite file, or replace the node with standard ONNX ops "
                f"before quantflow reads the model")
    if domain == "com.microsoft":
        return ("it is an onnxruntime contrib op (written by onnxruntime's graph optimizer or a transformer "
                "optimizer): give quantflow the model as exported, before that optimization")
    if domain not in _DEFAULT:
        return (f"it is a custom op of domain {domain!r}: re-export the model with standard ONNX ops only (no custom "
                f"ops or operator plug-ins)")
    if _defined_since(op_type, opset) is not None:   # a standard op quantflow does not read
        return ("re-export the model with that part written in the ops listed, or cut the model before it and run "
                "the rest on the host")
    import onnx.defs
    since = next((v for v in range(opset + 1, onnx.defs.onnx_opset_version() + 1)
                  if _defined_since(op_type, v) is not None), None)
    if since is None:
        return "ONNX defines no such op: re-export the model with standard ONNX ops only"
    return (f"ONNX defines {op_type} from opset {since} on, and the model imports opset {opset}: re-export it at "
            f"opset {since} or later")


# ----------------------------------------------------------------------------- leftovers with a standard meaning

def standard_form(model, source: str):
    """``model`` with every converter leftover (``TRANSPOSE_CONV_BIAS``) rewritten as standard ONNX ops: a new model,
    or ``model`` itself where it holds none.  Its input shape must be static (a leftover's padding depends on its
    input's size).  An UnsupportedNetworkError naming the node where its parameters cannot be read off the file."""
    import onnx

    if not any(n.op_type in TRANSPOSE_CONV_BIAS for n in model.graph.node):
        return model
    others = [f for f in nonstandard_nodes(model) if f[2] not in TRANSPOSE_CONV_BIAS]
    if others:   # the rewrite infers shapes through the whole graph: name what stops that first
        name, domain, op = others[0]
        fix = unknown_op_fix("" if domain == "ai.onnx" else domain, op, _opset(model))
        raise UnsupportedNetworkError(
            f"{source}: unsupported ONNX op {op!r} (domain {domain}) at node {name}, beside MediaPipe's transposed "
            f"convolution: {describe_nodes(others)}. Fix: {fix}")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    _import_domains(out)
    k = 0
    while k < len(out.graph.node):
        if out.graph.node[k].op_type in TRANSPOSE_CONV_BIAS:
            _rewrite_transpose_conv_bias(out, k, source)
            k += 2   # the three nodes written in its place
        k += 1
    used = {n.domain for n in out.graph.node} | set(_DEFAULT)
    kept = [o for o in out.opset_import if o.domain in used]
    del out.opset_import[:]
    out.opset_import.extend(kept)
    return out


def _import_domains(model) -> None:
    """An opset import for every node domain the model lacks one for: tf2onnx's ``--custom-ops OP:domain`` writes
    the node in that domain without importing it (tf2onnx 1.17), and ONNX's shape inference then refuses the model."""
    from onnx import helper

    have = {o.domain for o in model.opset_import}
    for domain in dict.fromkeys(n.domain for n in model.graph.node if n.domain not in _DEFAULT):
        if domain not in have:
            model.opset_import.append(helper.make_opsetid(domain, 1))


def _constant(model, name: str):
    from onnx import numpy_helper
    for t in model.graph.initializer:
        if t.name == name:
            return numpy_helper.to_array(t)
    for n in model.graph.node:
        if n.op_type == "Constant" and n.output[0] == name and n.attribute and n.attribute[0].name == "value":
            return numpy_helper.to_array(n.attribute[0].t)
    return None


def _transpose_conv_nodes(node, k: int, w: np.ndarray, bias: np.ndarray, strides, pads) -> tuple[list, list]:
    """The standard ONNX nodes (and initializers) computing ``node``: NHWC -> NCHW, ConvTranspose, back to NHWC."""
    from onnx import helper, numpy_helper
    base = f"{node.name or f'v{k}'}:std"
    wname, bname = f"{base}:weight", f"{base}:bias"
    inits = [numpy_helper.from_array(np.ascontiguousarray(w.transpose(3, 0, 1, 2), np.float32), wname),
             numpy_helper.from_array(np.ascontiguousarray(bias.reshape(-1), np.float32), bname)]
    nodes = [helper.make_node("Transpose", [node.input[0]], [f"{base}:nchw"], name=f"{base}:to_nchw",
                              perm=[0, 3, 1, 2]),
             helper.make_node("ConvTranspose", [f"{base}:nchw", wname, bname], [f"{base}:y"], name=node.name or base,
                              kernel_shape=list(w.shape[1:3]), strides=list(strides), pads=list(pads)),
             helper.make_node("Transpose", [f"{base}:y"], [node.output[0]], name=f"{base}:to_nhwc",
                              perm=[0, 2, 3, 1])]
    return nodes, inits


def _candidates(hw, kernel) -> dict[tuple, tuple]:
    """{(strides, pads): output (h, w)} for every stride in ``_STRIDES`` with SAME and VALID padding (MediaPipe's
    output size and padding; the same strides and pads from both count once)."""
    out = {}
    for sh in _STRIDES:
        for sw in _STRIDES:
            for same in (True, False):
                total = [max(0, k - (n - 1) % s - 1) if same else 0 for n, k, s in zip(hw, kernel, (sh, sw))]
                pads = (total[0] // 2, total[1] // 2, total[0] - total[0] // 2, total[1] - total[1] // 2)
                out[((sh, sw), pads)] = tuple(s * (n - 1) + k - p for n, k, s, p in zip(hw, kernel, (sh, sw), total))
    return out


def _rewrite_transpose_conv_bias(model, k: int, source: str) -> None:
    """Node ``k`` of ``model`` (a Convolution2DTransposeBias) replaced in place by its standard ONNX form, with the
    one stride and padding the model's declared shapes allow."""
    import onnx

    node = model.graph.node[k]
    where = (f"{source}: ONNX node {node.name or f'v{k}'} ({node.domain or 'ai.onnx'}:{node.op_type}, MediaPipe's "
             f"transposed convolution with bias)")
    w, bias = (_constant(model, i) if i else None for i in (list(node.input) + ["", ""])[1:3])
    if len(node.input) != 3 or w is None or bias is None or w.ndim != 4 or bias.size != w.shape[0]:
        raise UnsupportedNetworkError(f"{where}: expected inputs (NHWC input, constant OHWI weight, constant bias of "
                                      f"C_out values); re-export it with constant weights")
    head = onnx.ModelProto()
    head.CopyFrom(model)
    del head.graph.value_info[:]
    inferred = onnx.shape_inference.infer_shapes(head)
    shapes = {v.name: v.type.tensor_type.shape for v in [*inferred.graph.input, *inferred.graph.value_info]}
    dims = [d.dim_value if d.HasField("dim_value") else None for d in shapes[node.input[0]].dim] \
        if node.input[0] in shapes else None
    if dims is None or len(dims) != 4 or not all(dims[1:3]) or dims[3] not in (None, w.shape[3]):
        raise UnsupportedNetworkError(f"{where}: its input's shape {dims} is not a static NHWC shape with "
                                      f"{w.shape[3]} channels (the weight's OHWI {list(w.shape)})")
    declared = [v for v in model.graph.value_info if v.name == node.output[0]]
    fits = {}
    for (strides, pads), size in _candidates(dims[1:3], w.shape[1:3]).items():
        trial = onnx.ModelProto()
        trial.CopyFrom(model)
        del trial.graph.value_info[:]
        trial.graph.value_info.extend(declared)   # the file's other value_info may be stale; its outputs count
        nodes, inits = _transpose_conv_nodes(node, k, w, bias, strides, pads)
        del trial.graph.node[k]
        for j, n in enumerate(nodes):
            trial.graph.node.insert(k + j, n)
        trial.graph.initializer.extend(inits)
        try:
            onnx.shape_inference.infer_shapes(trial, strict_mode=True)
        except Exception:  # onnx's InferenceError: the shapes after it contradict this stride
            continue
        fits[(strides, pads)] = (size, nodes, inits)
    if len(fits) != 1:
        seen = "; ".join(f"strides {s}, pads {list(p)}: output {list(v[0])}" for (s, p), v in list(fits.items())[:3])
        seen = (seen + ("; ..." if len(fits) > 3 else "")) or "none"
        raise UnsupportedNetworkError(
            f"{where}: tf2onnx does not carry its stride and padding over, and {len(fits)} of the strides "
            f"{list(_STRIDES)} (SAME or VALID) fit the shapes the model declares ({seen}). Fix: convert with "
            f"`python -m tf2onnx.convert --tflite model.tflite --custom-ops {node.op_type}:mediapipe ...`, which "
            f"declares the op's output shape (quantflow reads the op in any domain), or replace the node with a "
            f"standard ConvTranspose (see docs/onnx-models.md)")
    (_, nodes, inits), = fits.values()
    del model.graph.node[k]
    for j, n in enumerate(nodes):
        model.graph.node.insert(k + j, n)
    model.graph.initializer.extend(inits)
