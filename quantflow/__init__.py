"""quantflow: INT8 post-training quantization and offline-model build pipeline for Ascend NPUs.

The Python API (``quantflow.api``): ``build(config)`` runs one configuration's build, ``quantize(model, calibration,
evaluation, **options)`` quantizes a model from two image folders in one call; both return a ``BuildResult``.
A failing gate is a result; a bad configuration or input raises ``QuantflowError`` (``ConfigError``, ...)."""
import os as _os
import platform as _platform

# MindSpore logs a great deal at WARNING level on the CPU backend; keep its C++ log to errors
# unless the user asked for something else.
_os.environ.setdefault("GLOG_v", "3")

# On a CPU with AVX-512, the oneDNN inside MindSpore (2.10: oneDNN 3.10) runs a convolution on MindSpore's plain
# NCHW tensors through its slow reference fallback (``jit_uni_ncsp:conv+ref``): ResNet-18 at 224x224 takes 4-5 s
# per image.  Capped at AVX2 it picks its im2col + GEMM kernel (``gemm:jit``): 0.06 s; the outputs
# agree to float32 rounding.  oneDNN reads the cap at its first kernel, so it is set here, before anything in
# quantflow runs MindSpore; a cap the user set stands.  Only oneDNN reads it (onnxruntime's CPU kernels are MLAS).
if _platform.machine().lower() in ("x86_64", "amd64"):
    _os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")

__version__ = "0.1.0"

from .api import BuildResult, Figure, Float16Floor, build, quantize  # noqa: E402  (after the environment above is set)
from .errors import (AccuracyGateError, AippMismatchError, AtcError, ConfigError, DataError,  # noqa: E402
                     QuantflowError, UnsupportedNetworkError)

__all__ = ["AccuracyGateError", "AippMismatchError", "AtcError", "BuildResult", "ConfigError", "DataError", "Figure",
           "Float16Floor", "QuantflowError", "UnsupportedNetworkError", "__version__", "build", "quantize"]
