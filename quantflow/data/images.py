"""Image folders, image reading (OpenCV) and the reference training preprocessing."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from ..errors import DataError

IMAGE_EXTS = {".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".ppm", ".pgm", ".webp"}


@dataclass(frozen=True)
class LabeledImage:
    path: Path
    label: int
    class_name: str


def class_labels(names: list[str]) -> dict[str, int]:
    """Folder name -> label. Integer folder names are their own label; otherwise sorted order."""
    if names and all(n.isdigit() for n in names):
        return {n: int(n) for n in names}
    return {n: i for i, n in enumerate(sorted(names))}


def scan_class_folders(data_dir: Path, num_classes: int | None = None) -> list[LabeledImage]:
    """All image files in per-class sub-folders of ``data_dir``, in a stable order.

    Files whose extension is not an image extension are ignored; hidden files too.
    """
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise DataError(f"image folder not found: {data_dir}")
    folders = sorted(p for p in data_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not folders:
        raise DataError(f"{data_dir} holds no per-class sub-folders (expected e.g. {data_dir}/0/, {data_dir}/1/ ...)")
    labels = class_labels([f.name for f in folders])
    if num_classes is not None:
        bad = [f"{n} (label {l})" for n, l in labels.items() if not 0 <= l < num_classes]
        if bad:
            raise DataError(f"{data_dir}: class folder(s) outside the model's {num_classes} classes: {', '.join(bad)}")
    items = []
    for folder in folders:
        files = sorted(p for p in folder.iterdir()
                       if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in IMAGE_EXTS)
        items.extend(LabeledImage(p, labels[folder.name], folder.name) for p in files)
    if not items:
        raise DataError(f"{data_dir}: the class folders hold no image files ({', '.join(sorted(IMAGE_EXTS))})")
    return items


def scan_image_groups(data_dir: Path) -> list[LabeledImage]:
    """All image files of an unlabelled folder (``evaluation.metric = "outputs"``): those directly in
    ``data_dir`` (group ".") and those in each sub-folder (a group each, e.g. one per scene or camera),
    labelled by group index in sorted order, in a stable order.  Hidden files and folders are ignored."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise DataError(f"image folder not found: {data_dir}")

    def images(folder: Path) -> list[Path]:
        return sorted(p for p in folder.iterdir()
                      if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in IMAGE_EXTS)

    groups = [(".", images(data_dir))] + [(f.name, images(f)) for f in sorted(data_dir.iterdir())
                                          if f.is_dir() and not f.name.startswith(".")]
    groups = [(name, files) for name, files in groups if files]
    if not groups:
        raise DataError(f"{data_dir}: no image files in it or its sub-folders ({', '.join(sorted(IMAGE_EXTS))})")
    return [LabeledImage(p, label, name) for label, (name, files) in enumerate(groups) for p in files]


def scan_images(data_dir: Path, classes: int | None) -> list[LabeledImage]:
    """``classes`` per-class folders (the top-1 gate's layout), or for ``None`` an unlabelled image folder
    (``QuantflowConfig.labelled_classes``)."""
    return scan_image_groups(data_dir) if classes is None else scan_class_folders(data_dir, classes)


def read_image(path: Path, channels: int) -> np.ndarray:
    """Read an image as the device would receive it: uint8 HWC BGR (3 channels) or HW (1 channel)."""
    flag = cv2.IMREAD_GRAYSCALE if channels == 1 else cv2.IMREAD_COLOR
    img = cv2.imread(str(path), flag)
    if img is None:
        raise DataError(f"unreadable image (OpenCV could not decode it): {path}")
    if img.dtype != np.uint8:
        raise DataError(f"{path}: expected 8-bit pixels, got {img.dtype}")
    return img


def check_image(path: Path, channels: int, height: int, width: int) -> tuple[np.ndarray | None, str | None]:
    """(image, None) when usable, (None, reason) when not."""
    try:
        img = read_image(path, channels)
    except DataError as err:
        return None, str(err)
    if img.shape[:2] != (height, width):
        return None, f"wrong size {img.shape[1]}x{img.shape[0]} (expected {width}x{height}): {path}"
    return img, None


def load_images(paths, channels: int, height: int, width: int) -> np.ndarray:
    """Read a list of images, failing on the first unusable one with its path."""
    out = []
    for p in paths:
        img, reason = check_image(Path(p), channels, height, width)
        if img is None:
            raise DataError(reason)
        out.append(img)
    return np.stack(out) if out else np.zeros((0, height, width) + ((channels,) if channels == 3 else ()), np.uint8)


def preprocess(images: np.ndarray, mean, std, scale: str, channel_order: str) -> np.ndarray:
    """Reference implementation of a declared training normalization.

    ``images``: uint8 N,H,W,3 in BGR order as read by OpenCV (or N,H,W for grayscale).
    Returns float32 N,C,H,W: ((pixel [/255]) - mean) / std in ``channel_order``.
    """
    x = np.asarray(images)
    if x.ndim == 3:
        x = x[..., None]
    x = x.astype(np.float32)
    if channel_order == "RGB":
        x = x[..., ::-1]
    if scale == "0-1":
        x = x / np.float32(255.0)
    x = (x - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


class ImageBatches:
    """Re-iterable batches of preprocessed images, read from disk lazily (one batch in memory at a time)."""

    def __init__(self, paths, channels: int, height: int, width: int, mean, std, scale: str, channel_order: str,
                 batch_size: int):
        self.paths = [Path(p) for p in paths]
        self.shape = (channels, height, width)
        self.norm = (mean, std, scale, channel_order)
        self.batch_size = batch_size

    def __len__(self) -> int:
        return len(self.paths)

    def __iter__(self):
        c, h, w = self.shape
        for i in range(0, len(self.paths), self.batch_size):
            yield preprocess(load_images(self.paths[i:i + self.batch_size], c, h, w), *self.norm)
