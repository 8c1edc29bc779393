"""Demo data: scikit-learn's digits, upscaled to 32x32 and coloured, and their training preprocessing.

``python -m quantflow.demo.data ROOT`` (re)writes ROOT/calib_data and ROOT/eval_data; the files
shipped in the repository were written by it and are reproduced bit for bit.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import cv2
import numpy as np

SIZE = 32
SEED = 20261202
EVAL_FRACTION = 0.2
CALIB_POOL_PER_CLASS = 30

# The training normalization of the demo model (pixels scaled to 0-1, RGB order).
MEAN_RGB = (0.471, 0.463, 0.467)
STD_RGB = (0.257, 0.260, 0.260)


def _colour_pair(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A random background colour and a random ink colour brighter than it in every channel."""
    bg = rng.integers(0, 150, 3)
    fg = np.minimum(bg + rng.integers(70, 256, 3), 255)
    return bg.astype(np.float32), fg.astype(np.float32)


def make_images(seed: int = SEED) -> tuple[np.ndarray, np.ndarray]:
    """All 1797 digits as uint8 N,32,32,3 **BGR** images (as OpenCV reads them) and their labels."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    rng = np.random.default_rng(seed)
    out = np.empty((len(digits.images), SIZE, SIZE, 3), np.uint8)
    for i, img in enumerate(digits.images):
        ink = cv2.resize((img / 16.0).astype(np.float32), (SIZE, SIZE), interpolation=cv2.INTER_CUBIC)
        ink = np.clip(ink, 0.0, 1.0)[..., None]
        bg, fg = _colour_pair(rng)
        rgb = bg * (1.0 - ink) + fg * ink
        out[i] = np.clip(np.rint(rgb), 0, 255).astype(np.uint8)[..., ::-1]
    return out, digits.target.astype(np.int64)


def split(labels: np.ndarray, seed: int = SEED) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Stratified split: (train indices, held-out eval indices, calibration pool indices within train)."""
    rng = np.random.default_rng(seed + 1)
    train, held, pool = [], [], []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        rng.shuffle(idx)
        n_eval = int(round(len(idx) * EVAL_FRACTION))
        held.extend(idx[:n_eval])
        train.extend(idx[n_eval:])
        pool.extend(idx[n_eval:n_eval + CALIB_POOL_PER_CLASS])
    return np.sort(train), np.sort(held), np.sort(pool)


def perturb(images_bgr: np.ndarray, seed: int = SEED + 2) -> np.ndarray:
    """A harder copy of ``images_bgr`` (deterministic): a random affine change (rotation +-20 degrees,
    scale 0.8-1.2, shift +-4 pixels, border replicated), a Gaussian blur (sigma 0.8-1.6) and
    Gaussian pixel noise (sigma 24)."""
    rng = np.random.default_rng(seed)
    out = np.empty_like(images_bgr)
    for i, img in enumerate(images_bgr):
        m = cv2.getRotationMatrix2D((SIZE / 2, SIZE / 2), rng.uniform(-20, 20), rng.uniform(0.8, 1.2))
        m[:, 2] += rng.uniform(-4, 4, 2)
        x = cv2.warpAffine(img, m, (SIZE, SIZE), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
        x = cv2.GaussianBlur(x, (5, 5), rng.uniform(0.8, 1.6)).astype(np.float32)
        out[i] = np.clip(np.rint(x + rng.normal(0.0, 24.0, x.shape)), 0, 255).astype(np.uint8)
    return out


def preprocess(image_bgr: np.ndarray) -> np.ndarray:
    """The demo's training preprocessing of one uint8 HWC BGR image -> float32 CHW."""
    rgb = image_bgr[..., ::-1].astype(np.float32) / 255.0
    x = (rgb - np.array(MEAN_RGB, np.float32)) / np.array(STD_RGB, np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1))


def preprocess_batch(images_bgr: np.ndarray) -> np.ndarray:
    return np.stack([preprocess(im) for im in images_bgr]) if len(images_bgr) else np.zeros((0, 3, SIZE, SIZE), np.float32)


def write_folders(root: Path) -> dict[str, int]:
    """Write calib_data/<digit>/ and eval_data/<digit>/ PNG files under ``root``."""
    images, labels = make_images()
    _, held, pool = split(labels)
    counts = {}
    for name, idx in (("calib_data", pool), ("eval_data", held)):
        for i in idx:
            folder = Path(root) / name / str(labels[i])
            folder.mkdir(parents=True, exist_ok=True)
            if not cv2.imwrite(str(folder / f"digit_{i:04d}.png"), images[i]):
                raise OSError(f"could not write {folder / f'digit_{i:04d}.png'}")
        counts[name] = len(idx)
    return counts


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("root", type=Path, nargs="?", default=Path("."))
    args = ap.parse_args(argv)
    print(write_folders(args.root))


if __name__ == "__main__":
    main()
