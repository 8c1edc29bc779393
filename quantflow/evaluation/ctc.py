"""The shipped task metric for CTC sequence recognizers (``evaluation.metric = "ctc"``: CRNN, SVTR, PP-OCR rec;
``task.py`` holds the task-metric protocol).

Each image's output, [time, symbols] scores (logits or a softmax), is read by greedy CTC decoding as PaddleOCR's
``CTCLabelDecode`` and ddddocr do: the best symbol per step, repeats merged, the blank (``options.blank``, 0 as
in both) dropped.  The numbers, INT8 against FP32: ``agreement``, the share of images whose INT8 reading equals
FP32's; ``cer``, the summed edit distance (Levenshtein) of INT8's readings to FP32's over the summed length of
FP32's.  With ``options.labels`` (a text file of ``image<TAB>text`` lines, PaddleOCR's rec label format: the
image by its path relative to the label file's folder or by its file name) and ``options.charset`` (the symbol
of each index: PaddleOCR's rec dict, one symbol per line, the blank first as index 0 added when the file holds
``symbols - 1`` lines and the blank plus a trailing space -- ``use_space_char`` -- when it holds ``symbols - 2``;
a file of exactly ``symbols`` lines is taken as it is, its first line the blank), also ``accuracy_fp32``,
``accuracy_int8`` (the share of labelled images read exactly as labelled) and ``accuracy_drop``; relative
paths are taken from the config's folder.

Layouts (``options.layout``): ``"ntc"`` [images, time, symbols]; ``"tnc"`` [time, images, symbols];
``"auto"`` reads the images' axis from the batch: the axis of the output whose size is the batch's image count
(axis 0 first).  A network with a time-major output is run image by image at batch 1 (README, "ONNX models"), so
a batch of n images arrives as the n outputs [T, 1, symbols] stacked along the time axis, [n * T, 1, symbols];
``"auto"`` and ``"tnc"`` read that form too.

The fallback steers by the least SQNR of the output (``steering.py``), not by a per-step divergence of the symbol
distributions: measured on ddddocr's captcha reader (664 tuning images, 1200 judged), the KL divergence is led by a
few images (rolling back Conv_3 lowered it 41%, Conv_8 16%, where Conv_8 is what lowers the CER most), and the total
variation distance moves by less than the fallback's 5% for layers that each lower the CER a little: it kept one
layer, and the gate read CER 0.0210 [0.0173, 0.0249], against 0.0180 [0.0146, 0.0214] with the five layers the
output's SQNR keeps.

Default limits: ``agreement`` >= 0.9 (at most one line in ten read differently from FP32: a line of ten
symbols with one changed symbol already has a CER of 0.1, so the line share is the coarse check), ``cer`` <=
0.02 (at most two symbols in a hundred changed against FP32, the fine one), and with labels ``accuracy_drop`` <=
0.01 (one point, as the top-1 gate's usual threshold).
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ..errors import ConfigError, DataError
from .options import read_options
from .shipped import per_image


class CTCOptions(BaseModel):
    """``evaluation.options`` of ``evaluation.metric = "ctc"``."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    output: Optional[str] = Field(default=None, description="the output holding the sequence (default: the first)")
    layout: Literal["auto", "ntc", "tnc"] = "auto"
    blank: int = Field(default=0, ge=0, description="the blank symbol's index")
    labels: Optional[str] = Field(default=None, description="image<TAB>text lines, the held-out images' texts")
    charset: Optional[str] = Field(default=None, description="the symbol of each index (PaddleOCR rec dict format)")


def greedy(scores: np.ndarray, blank: int = 0) -> tuple[int, ...]:
    """Greedy CTC decoding of one sequence [time, symbols]: the best symbol per step, repeats merged, blanks
    dropped."""
    best = np.asarray(scores).argmax(-1)
    keep = np.ones(len(best), bool)
    keep[1:] = best[1:] != best[:-1]
    return tuple(int(s) for s in best[keep & (best != blank)])


def edit_distance(a, b) -> int:
    """Levenshtein distance of two sequences (insertions, deletions, substitutions, each 1)."""
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


def sequences(out: np.ndarray, n: int, layout: str, name: str = "output") -> np.ndarray:
    """The output of a batch of ``n`` images as [n, time, symbols] (``layout``: see the module docstring)."""
    a = np.asarray(out)
    if a.ndim != 3:
        raise ConfigError(f"evaluation.metric ctc: output {name} {list(a.shape)} is not a sequence [images, time, "
                          f"symbols] or [time, images, symbols]; set evaluation.options.output")
    if layout == "auto":
        layout = "ntc" if a.shape[0] == n and not (a.shape[1] == n and n == 1 and a.shape[0] != 1) else (
            "tnc" if a.shape[1] == n or (a.shape[1] == 1 and a.shape[0] % n == 0) else "")
        if not layout:
            raise ConfigError(f"evaluation.options.layout: output {name} {list(a.shape)} holds no axis of the "
                              f"batch's {n} images; set layout = \"ntc\" or \"tnc\"")
    if layout == "ntc":
        if a.shape[0] != n:
            raise ConfigError(f"evaluation.options.layout: output {name} {list(a.shape)} is not [images, time, "
                              f"symbols] for a batch of {n} images")
        return a
    if a.shape[1] == n:
        return a.transpose(1, 0, 2)
    if a.shape[1] == 1 and a.shape[0] % n == 0:   # run image by image: each image's [T, 1, C], stacked on T
        return a.reshape(n, a.shape[0] // n, a.shape[2])
    raise ConfigError(f"evaluation.options.layout: output {name} {list(a.shape)} is not [time, images, symbols] "
                      f"for a batch of {n} images")


def read_charset(path: Path, symbols: int) -> list[str]:
    """The symbol of each of ``symbols`` indices from a PaddleOCR-style dict file (see the module docstring)."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise ConfigError(f"evaluation.options.charset: cannot read {path}: {err.strerror}") from None
    if len(lines) == symbols - 1:
        return [""] + lines
    if len(lines) == symbols - 2:
        return [""] + lines + [" "]
    if len(lines) == symbols:
        return [""] + lines[1:]
    raise ConfigError(f"evaluation.options.charset: {path} holds {len(lines)} symbols; the output has {symbols} "
                      f"(the file needs {symbols - 1}, the blank added first, or {symbols - 2}, a space added last)")


def read_labels(path: Path) -> dict[str, str]:
    """{image (as written in the file): text} of ``image<TAB>text`` lines."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"evaluation.options.labels: cannot read {path}: {err.strerror}") from None
    out = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        image, tab, label = line.partition("\t")
        if not tab:
            raise DataError(f"{path}:{n}: not an 'image<TAB>text' line: {line.strip()!r}")
        out[image.strip()] = label
    return out


def config_folder(batch) -> Path:
    """The config's folder: the images' shown names are their paths relative to it."""
    path, name = Path(batch.paths[0]), Path(batch.names[0])
    return path.parents[len(name.parts) - 1] if not name.is_absolute() and len(name.parts) else Path.cwd()


class CTC:
    """The task metric (``task.py``'s class form, one record per image)."""
    records_per_image = True
    limits = {"min": {"agreement": 0.9}, "max": {"cer": 0.02, "accuracy_drop": 0.01}}
    outcome = "strings"   # what changed() counts

    @staticmethod
    def changed(record: dict) -> int:
        """1 where INT8 reads the image's string otherwise than FP32."""
        return int(not record["same"])

    def __init__(self, **options):
        self.o = read_options(CTCOptions, options, "ctc")
        if self.o.labels and not self.o.charset:
            raise ConfigError("evaluation.options.labels: reading the labels needs evaluation.options.charset (the "
                              "symbol of each index of the output)")
        self._labels: tuple[dict, Path] | None = None
        self._charset: list[str] | None = None

    def _texts(self, batch, symbols: int) -> tuple[list[str | None], list[str]]:
        """The label of each image of the batch (None: not in the file), and the charset."""
        if self._labels is None:
            root = config_folder(batch)
            lab, cs = root / self.o.labels, root / self.o.charset
            self._labels, self._charset = (read_labels(lab), lab.parent), read_charset(cs, symbols)
        labels, folder = self._labels
        found = []
        for p in batch.paths:
            p = Path(p)
            rel = p.relative_to(folder).as_posix() if p.is_relative_to(folder) else None
            found.append(labels.get(rel) if rel in labels else labels.get(p.name))
        return found, self._charset

    def batch(self, fp32: dict, int8: dict, batch) -> list[dict]:
        """Per image: whether the two readings agree, their edit distance and FP32's length; with labels whether
        each reads the label."""
        name = self.o.output or next(iter(fp32))
        if name not in fp32:
            raise ConfigError(f"evaluation.options.output: the network has no output {name!r} "
                              f"(its outputs: {', '.join(fp32)})")
        n = len(batch.paths)
        f = sequences(fp32[name], n, self.o.layout, name)
        q = sequences(int8[name], n, self.o.layout, name)
        labels, charset = self._texts(batch, f.shape[-1]) if self.o.labels else ([None] * n, None)
        records = []
        for i in range(n):
            a, b = greedy(f[i], self.o.blank), greedy(q[i], self.o.blank)
            r = {"same": a == b, "distance": edit_distance(b, a), "length": len(a)}
            if labels[i] is not None:
                text = lambda s: "".join(charset[k] if k < len(charset) else "" for k in s)  # noqa: E731
                r.update(fp32_ok=text(a) == labels[i], int8_ok=text(b) == labels[i])
            records.append(r)
        return records

    def summarize(self, records: list) -> dict:
        records = per_image(records)
        images = len(records)
        length = sum(r["length"] for r in records)
        numbers = {"agreement": sum(r["same"] for r in records) / images if images else None,
                   "cer": sum(r["distance"] for r in records) / length if length else None,
                   "images": images, "fp32_symbols": length}
        labelled = [r for r in records if "fp32_ok" in r]
        if labelled:
            fa = sum(r["fp32_ok"] for r in labelled) / len(labelled)
            qa = sum(r["int8_ok"] for r in labelled) / len(labelled)
            numbers.update(accuracy_fp32=fa, accuracy_int8=qa, accuracy_drop=fa - qa, labelled_images=len(labelled))
        return numbers
