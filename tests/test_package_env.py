"""What importing quantflow sets in the process environment (quantflow/__init__.py): oneDNN's ISA cap, which keeps
MindSpore's CPU convolutions off oneDNN's slow reference path on AVX-512 machines, unless the user set one; and that
MindSpore under that cap computes a convolution right (against numpy).  Each case runs in a fresh process: oneDNN
reads the cap once, at its first kernel."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

X86 = platform.machine().lower() in ("x86_64", "amd64")


def _python(code: str, **env) -> dict:
    base = {k: v for k, v in os.environ.items() if k != "ONEDNN_MAX_CPU_ISA"}
    out = subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


READ_CAP = "import json, os, quantflow; print(json.dumps({'cap': os.environ.get('ONEDNN_MAX_CPU_ISA')}))"


def test_importing_quantflow_caps_onednn_at_avx2_on_x86():
    assert _python(READ_CAP)["cap"] == ("AVX2" if X86 else None)


def test_a_cap_the_user_set_stands():
    assert _python(READ_CAP, ONEDNN_MAX_CPU_ISA="AVX512_CORE")["cap"] == "AVX512_CORE"


CONV = """
import json
import quantflow  # first: the cap is in place before MindSpore's first kernel
import mindspore as ms
import numpy as np

rng = np.random.default_rng(0)
x = rng.normal(size=(2, 8, 12, 12)).astype(np.float32)
w = rng.normal(size=(16, 8, 3, 3)).astype(np.float32)
ms.set_context(mode=ms.GRAPH_MODE)
got = ms.ops.conv2d(ms.Tensor(x), ms.Tensor(w), pad_mode="pad", padding=1).asnumpy()
# the same convolution in float64 numpy: zero padding, then each output pixel's 3x3 window
xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
windows = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))   # n, c, h, w, 3, 3
ref = np.einsum("nchwij,ocij->nohw", windows, w.astype(np.float64))
print(json.dumps({"shape": list(got.shape), "err": float(np.abs(got - ref).max()), "scale": float(np.abs(ref).max())}))
"""


@pytest.mark.skipif(not X86, reason="the cap is set on x86-64 only")
def test_mindspore_convolves_right_under_the_cap():
    r = _python(CONV)
    assert r["shape"] == [2, 16, 12, 12]
    assert r["err"] <= 1e-5 * r["scale"]
