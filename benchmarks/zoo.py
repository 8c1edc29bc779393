"""Model-zoo projects: a mindcv architecture (or mindyolo's YOLOv5-n / YOLOv8-n, or the demo's DigitsNet as
``digits``) as a quantflow project, for trying real network graphs.

``python -m benchmarks.zoo resnet18 build/zoo/resnet18 --size 64`` writes

- ``model.mindir``: the mindcv network (``mindcv.models.create_model(arch, num_classes=10)``)
  with deterministic random weights **and BatchNorm statistics** (pretrained weights cannot be
  downloaded here), exported at ``1 x 3 x size x size``;
- ``calib_data/`` and ``eval_data/``: the shipped digits images upscaled to ``size``;
- ``quantflow.toml`` pointing at them (``model.mindir``; ``quantflow build <dir>/quantflow.toml``).

With random weights accuracy means nothing, so the gate threshold is 1.0 (always passes): a
zoo project shows that the graph is read, matches MindSpore, calibrates, quantizes and emulates;
the FP32/INT8 top-1 agreement in its accuracy report says how closely INT8 follows FP32.  A detector
(``yolov5n``, ``yolov8n``, from mindyolo: ``benchmarks.yolo``) gets the outputs gate instead: every
output's cosine similarity of INT8 to FP32, at ``evaluation.min_cosine`` 0.9.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

ARCHS = {  # the architectures quantflow is tried on, and the smallest input each takes here
    "resnet18": 64, "mobilenet_v2_100": 64, "mobilenet_v3_small_100": 64, "efficientnet_b0": 64,
    "densenet121": 64, "inception_v3": 96, "shufflenet_v2_x1_0": 64, "regnet_x_200mf": 64, "convnext_tiny": 64,
    "vit_b_32_224": 224, "yolov5n": 160, "yolov8n": 160, "digits": 32,
}
DETECTORS = {"yolov5n", "yolov8n"}   # from mindyolo (benchmarks.yolo), gated on every output

TOML = """# quantflow project for {arch} (random weights; see benchmarks/zoo.py)
[model]
mindir = "model.mindir"
input_shape = [1, 3, {size}, {size}]
{classes}{verify}
[normalization]
mean = [0.485, 0.456, 0.406]
std = [0.229, 0.224, 0.225]
scale = "0-1"
channel_order = "RGB"

[calibration]
data_dir = "calib_data"
count = {calib}
per_class_min = 1
method = "{method}"

[evaluation]
data_dir = "eval_data"
{gate}

[aipp]
template = "{aipp}"
input_channel_order = "BGR"
"""


def randomize(net, seed: int = 0):
    """Deterministic random weights, with BatchNorm statistics far from the 0/1 defaults."""
    import mindspore as ms

    rng = np.random.default_rng(seed)
    for p in net.get_parameters():
        shape, name = p.shape, p.name
        fixed = not p.requires_grad and not name.endswith(("moving_mean", "moving_variance"))
        if fixed or not np.issubdtype(p.asnumpy().dtype, np.floating):
            continue   # the architecture's own constants (a YOLO head's strides and DFL projection)
        if name.endswith("moving_variance"):
            v = rng.uniform(0.5, 1.5, shape)
        elif name.endswith("gamma"):
            v = rng.uniform(0.5, 1.5, shape)
        elif name.endswith(("moving_mean", "beta")):
            v = rng.normal(0.0, 0.2, shape)
        elif len(shape) == 1:  # biases: small, so that the logits depend on the image
            v = rng.normal(0.0, 0.01, shape)
        else:
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
            v = rng.normal(0.0, 1.0 / np.sqrt(fan_in), shape)
        p.set_data(ms.Tensor(v.astype(np.float32)))
    net.set_train(False)
    return net


def create(arch: str, num_classes: int = 10):
    if arch == "digits":  # the shipped demo's DigitsNet
        from quantflow.demo.net import build
        return build(num_classes)
    if arch in DETECTORS:
        from benchmarks import yolo
        return yolo.create(arch, num_classes)
    from mindcv.models import create_model
    return create_model(arch, num_classes=num_classes, pretrained=False)


def _pick(src: Path, per_class: int, total: int | None) -> list[Path]:
    """``per_class`` images of each class folder of ``src``, or with ``total`` that many taken in turn from the
    classes (the first of each class, then the second, ...)."""
    classes = [sorted(f for f in c.iterdir() if f.is_file()) for c in sorted(p for p in src.iterdir() if p.is_dir())]
    if total is None:
        return [f for files in classes for f in files[:per_class]]
    turns = [files[i] for i in range(max(map(len, classes))) for files in classes if i < len(files)]
    if total > len(turns):
        raise ValueError(f"{src} holds {len(turns)} images, {total} asked for")
    return sorted(turns[:total])


def _write_images(src: Path, dst: Path, size: int, per_class: int, total: int | None = None) -> int:
    import cv2

    picked = _pick(src, per_class, total)
    for f in picked:
        (dst / f.parent.name).mkdir(parents=True, exist_ok=True)
        img = cv2.imread(str(f), cv2.IMREAD_COLOR)
        cv2.imwrite(str(dst / f.parent.name / f.name), cv2.resize(img, (size, size), interpolation=cv2.INTER_LINEAR))
    return len(picked)


def build_project(arch: str, out: Path, size: int | None = None, calib_per_class: int = 4, eval_per_class: int = 4,
                  method: str = "mse", verify_images: int = 2, data_root: Path | None = None,
                  calib_images: int | None = None, eval_images: int | None = None) -> Path:
    """Write the project folder for ``arch``; returns its quantflow.toml.  ``calib_images`` / ``eval_images``:
    that many images in all (taken in turn from the classes) instead of ``calib_per_class`` / ``eval_per_class``;
    ``verify_images`` None: the build's default; ``data_root``: the folder holding the digits' calib_data/ and
    eval_data/ (default: this checkout)."""
    from quantflow.backends.export import export_mindir

    size = size or ARCHS.get(arch, 64)
    out = Path(out)
    repo = Path(data_root) if data_root else Path(__file__).resolve().parents[1]
    out.mkdir(parents=True, exist_ok=True)
    export_mindir(randomize(create(arch)), (1, 3, size, size), out / "model.mindir")
    calib = _write_images(repo / "calib_data", out / "calib_data", size, calib_per_class, calib_images)
    _write_images(repo / "eval_data", out / "eval_data", size, eval_per_class, eval_images)
    aipp = Path("static_rgb888_u8.cfg")  # shipped with quantflow
    toml = out / "quantflow.toml"
    gate = 'metric = "outputs"\nmin_cosine = 0.9' if arch in DETECTORS else "threshold = 1.0"
    toml.write_text(TOML.format(arch=arch, size=size, calib=calib, method=method, aipp=aipp.as_posix(), gate=gate,
                                verify=f"verify_images = {verify_images}\n" if verify_images else "",
                                classes="" if arch in DETECTORS else "num_classes = 10\n"))
    return toml


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("arch", help=f"mindcv architecture, e.g. {', '.join(ARCHS)}")
    ap.add_argument("out", type=Path, help="project folder to write")
    ap.add_argument("--size", type=int, default=None, help="input height/width (default: per architecture)")
    ap.add_argument("--calib-per-class", type=int, default=4)
    ap.add_argument("--eval-per-class", type=int, default=4)
    ap.add_argument("--calib-images", type=int, default=None, help="calibration images in all (instead of per class)")
    ap.add_argument("--eval-images", type=int, default=None, help="held-out images in all (instead of per class)")
    ap.add_argument("--method", default="mse", choices=["minmax", "percentile", "kl", "mse"])
    a = ap.parse_args(argv)
    toml = build_project(a.arch, a.out, a.size, a.calib_per_class, a.eval_per_class, a.method,
                         calib_images=a.calib_images, eval_images=a.eval_images)
    print(f"wrote {toml}; run: quantflow build {toml}")


if __name__ == "__main__":
    main()
