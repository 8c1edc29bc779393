"""``quantflow init``: a commented quantflow.toml for the user's model (``quantflow.scaffold`` writes it; this is its
command line: the arguments, and the lines it prints)."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..config import DEFAULT_CONFIG_NAME


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--onnx", type=Path, help="the trained network as ONNX")
    src.add_argument("--mindir", type=Path, help="the trained network as MindIR")
    src.add_argument("--entry", help="'package.module:callable' building the MindSpore network (with --checkpoint)")
    p.add_argument("--checkpoint", type=Path, help="the MindSpore checkpoint, with --entry")
    p.add_argument("--calib", type=Path, default=Path("calib_data"), help="calibration images (per-class folders)")
    p.add_argument("--eval", type=Path, default=Path("eval_data"), help="held-out images (per-class folders)")
    p.add_argument("--input-shape", type=_shape_arg, metavar="N,C,H,W",
                   help="the input shape to build for, N, C, H, W whatever the model file's input layout (default: "
                        "the model file's, its dynamic height and width from the calibration images)")
    p.add_argument("-o", "--output", type=Path, default=Path(DEFAULT_CONFIG_NAME))


def _shape_arg(text: str) -> list[int]:
    try:
        dims = [int(d) for d in text.replace("x", ",").split(",")]
    except ValueError:
        dims = []
    if len(dims) != 4 or min(dims) < 1 or dims[1] not in (1, 3):
        raise argparse.ArgumentTypeError(f"expected N,C,H,W with C 1 or 3, e.g. 1,3,224,224 (got {text!r})")
    return dims


def write_config(a) -> Path:
    """The configuration written (``quantflow.scaffold.write_config``), each line of the gate's power printed."""
    from ..scaffold import write_config as write

    out, said = write(a)
    for line in said:
        print(f"quantflow init: the gate's power: {line}")
    return out
