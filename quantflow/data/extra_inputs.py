"""The values of a network's inputs other than the image (``[model.inputs]``), e.g. a PaddleDetection detector's
``scale_factor``: a constant per image, ``scale_factor = { value = [1.0, 1.0] }``.

``sample_value`` turns one input's configured value into the array one image is fed with (the input's shape
without its batch axis, its declared dtype); ``batch_of`` repeats it for ``n`` images.  Every run of the network
(FP32, the INT8 emulation, calibration, the check against the source runtime) is fed these arrays beside the
images, through the graph IR's ``Graph.fixed_inputs`` and ``engine.runner.Runner``.  The deploy graph keeps such
an input as an input (the application feeds it on the device).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import UnsupportedNetworkError

FIELD = "model.inputs"   # the configuration table holding the values


def sample_value(name: str, value, dims: Sequence, dtype: str, where: str) -> np.ndarray:
    """The value one image is fed with for input ``name``, whose declared dims are ``dims`` (the batch first;
    ints where static, anything else where dynamic) and element type ``dtype``.  The configured ``value`` is
    broadcast to the declared per-image shape where that is static; where it is not, ``value`` gives it.
    ``where``: the model file, for messages."""
    given = np.asarray(value, np.float64)
    per_image = list(dims[1:]) if dims else []
    if not dims:
        raise UnsupportedNetworkError(f"{where}: input {name!r} ({FIELD}.{name}) has no declared rank; quantflow "
                                      f"needs an input with the images as its first axis, e.g. [N, 2]")
    if all(isinstance(d, int) and d > 0 for d in per_image):
        try:
            arr = np.broadcast_to(given, tuple(per_image))
        except ValueError:
            raise UnsupportedNetworkError(
                f"{where}: {FIELD}.{name}.value has shape {list(given.shape)}, which does not fit the input's "
                f"per-image shape {per_image} (declared {list(dims)}, the first axis the images)") from None
    else:
        if given.ndim != len(per_image) or any(isinstance(d, int) and d > 0 and d != g
                                               for d, g in zip(per_image, given.shape)):
            raise UnsupportedNetworkError(
                f"{where}: {FIELD}.{name}.value has shape {list(given.shape)}; input {name!r} is declared "
                f"{list(dims)} (the first axis the images), so one image's value has shape {per_image}")
        arr = given
    if np.dtype(dtype).kind != "f":
        raise UnsupportedNetworkError(
            f"{where}: input {name!r} ({FIELD}.{name}) is {dtype}; quantflow feeds float inputs other than the "
            f"image only (the device computes them in float16)")
    return np.ascontiguousarray(arr, np.dtype(dtype))


def batch_of(value: np.ndarray, n: int) -> np.ndarray:
    """``value`` (one image's) for ``n`` images: the batch axis first."""
    return np.broadcast_to(value, (n,) + value.shape)


def guess(name: str, dims: Sequence, image_hw: tuple[int, int]) -> tuple[list | float, bool]:
    """A value for input ``name`` (declared ``dims``) that ``quantflow init`` writes, and whether it is a sure
    guess: ``scale_factor`` (the resize from the original image, PaddleDetection) ones, ``im_shape`` the input's
    H, W; anything else zeros, to be edited."""
    per_image = [d if isinstance(d, int) and d > 0 else 1 for d in list(dims)[1:]] if dims else []
    low = name.lower()
    if "scale_factor" in low or low in ("scale", "scales"):
        value = np.ones(per_image or [2])
        return value.tolist(), True
    if "im_shape" in low or "image_shape" in low or low == "img_shape":
        value = np.broadcast_to(np.asarray(image_hw, np.float64), per_image or [2]) \
            if (per_image or [2])[-1] == 2 else np.zeros(per_image)
        return value.tolist(), True
    return np.zeros(per_image).tolist(), False
