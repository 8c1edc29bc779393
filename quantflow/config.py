"""The pipeline configuration: one pydantic model loaded from a TOML file.

Every section forbids unknown keys, and every invalid value is rejected with a
message that names the offending field (``ConfigError``).  Relative paths are
resolved against the directory holding the configuration file.
"""
from __future__ import annotations

import difflib
import json
import math
import os
import tomllib
from pathlib import Path
from typing import Any, Literal, Optional, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from . import aipp_templates
from .backends.atc import check_atc_args, check_precision_mode
from .engine.aipp import MAX_IMAGE_SIZE, MAX_PADDING, STANDARDS, SUPPORTED_FORMATS
from .errors import ConfigError, QuantflowError
from .quantization.ranges import METHODS

DEFAULT_CONFIG_NAME = "quantflow.toml"

RangeMethod = Literal[tuple(METHODS)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_entry(value: str) -> str:
    module, sep, attr = value.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"must look like 'package.module:callable', got {value!r}")
    return value


class ExtraInput(_Section):
    value: Union[float, list] = Field(
        description="the value every image is fed with on this input (e.g. [1.0, 1.0]), broadcast to its per-image "
                    "shape")

    @field_validator("value")
    @classmethod
    def _numbers(cls, v):
        try:
            arr = np.asarray(v, np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"must be a number or a (nested) list of numbers, got {v!r}") from None
        if arr.dtype == object or not np.all(np.isfinite(arr)):
            raise ValueError(f"must be finite numbers in a rectangular (nested) list, got {v!r}")
        return v


class ModelSection(_Section):
    entry: Optional[str] = Field(default=None,
                                 description="'package.module:callable' returning the (untrained) mindspore.nn.Cell")
    checkpoint: Optional[Path] = Field(default=None, description="MindSpore .ckpt with the trained weights")
    mindir: Optional[Path] = Field(
        default=None, description="the trained network as a MINDIR file, instead of entry + checkpoint")
    onnx: Optional[Path] = Field(
        default=None, description="the trained network as an ONNX file (e.g. exported from PyTorch), instead of "
                                  "entry + checkpoint")
    input_shape: tuple[int, int, int, int] = Field(description="N, C, H, W of the network input")
    input_layout: Literal["NCHW", "NHWC"] = Field(
        default="NCHW", description="layout of model.onnx's input: \"NHWC\" for a channels-last file (tf2onnx's), "
                                    "read with an N, C, H, W input (input_shape stays N, C, H, W)")
    input_name: str = Field(default="x", description="name of the graph input, used for atc --input_shape")
    inputs: dict[str, ExtraInput] = Field(
        default_factory=dict, description="model.onnx only: the inputs other than the image, each by its name in "
                                          "the file, with the value every image is fed with")
    outputs: tuple[str, ...] = Field(
        default=(), description="model.onnx only: tensors of the file the network ends at (its outputs become "
                                "these; what follows them, a NonMaxSuppression tail, runs on the host)")
    num_classes: Optional[int] = Field(
        default=None, gt=1, description="classes of the classification output (needed by evaluation.metric = "
                                        "\"top1\"); passed to model.entry when it takes num_classes")
    verify_images: int = Field(default=2, gt=0, le=256,
                               description="calibration images on which the graph IR is checked against MindSpore")
    verify_tolerance: float = Field(default=1e-3, gt=0.0, description="largest allowed |IR - MindSpore| relative "
                                                                      "to the largest |output|")

    @field_validator("entry")
    @classmethod
    def _entry(cls, v):
        return None if v is None else _check_entry(v)

    @model_validator(mode="after")
    def _source(self):
        given = [k for k, v in (("model.entry", self.entry), ("model.mindir", self.mindir), ("model.onnx", self.onnx))
                 if v is not None]
        if len(given) > 1:
            raise ValueError(f"give one network: model.entry (with model.checkpoint), model.mindir or model.onnx, "
                             f"not {' and '.join(given)}")
        if self.entry is not None and self.checkpoint is None:
            raise ValueError(f"model.checkpoint is required with model.entry = {self.entry!r} (the trained weights; "
                             f"with [train], the file training writes)")
        if self.entry is None and self.checkpoint is not None:
            raise ValueError(f"model.checkpoint = {str(self.checkpoint)!r} needs model.entry (the network it is "
                             f"loaded into)" + (f", not {given[0]}" if given else ""))
        if not given:
            raise ValueError("give the network: model.entry and model.checkpoint, or model.mindir, or model.onnx")
        if self.input_layout != "NCHW" and self.onnx is None:
            raise ValueError(f"model.input_layout = {self.input_layout!r} applies to model.onnx only; {given[0]} is "
                             f"read as MindSpore exports it (N, C, H, W): remove model.input_layout")
        if self.inputs and self.onnx is None:
            raise ValueError(f"model.inputs ({', '.join(self.inputs)}) applies to model.onnx only; {given[0]} is read "
                             f"as a single-input network: remove model.inputs")
        if self.outputs and self.onnx is None:
            raise ValueError(f"model.outputs ({', '.join(self.outputs)}) applies to model.onnx only; {given[0]} is read "
                             f"with its own outputs: remove model.outputs")
        if self.input_name in self.inputs:
            raise ValueError(f"model.inputs.{self.input_name}: model.input_name {self.input_name!r} names the image "
                             f"input, which takes the images, not a value")
        return self

    @field_validator("input_shape")
    @classmethod
    def _positive(cls, v):
        if any(d <= 0 for d in v):
            raise ValueError(f"every dimension must be positive, got {list(v)}")
        if v[1] not in (1, 3):
            raise ValueError(f"channels must be 1 or 3 (image input), got {v[1]}")
        return v


class NormalizationSection(_Section):
    mean: tuple[float, ...] = Field(description="per-channel mean, in the domain given by 'scale'")
    std: tuple[float, ...] = Field(description="per-channel std, in the domain given by 'scale'")
    scale: Literal["0-1", "0-255"] = Field(description="pixel domain mean/std refer to: pixels/255 or raw pixels")
    channel_order: Literal["RGB", "BGR", "GRAY"] = Field(description="channel order the network was trained on")
    reference: Optional[str] = Field(
        default=None,
        description="optional 'module:callable' of the training preprocessing (BGR uint8 HWC image -> float CHW); "
        "the AIPP check compares against it when given",
    )

    @field_validator("std")
    @classmethod
    def _std_positive(cls, v):
        if any(s <= 0 for s in v):
            raise ValueError(f"every std must be > 0, got {list(v)}")
        return v

    @field_validator("reference")
    @classmethod
    def _ref(cls, v):
        return None if v is None else _check_entry(v)

    @model_validator(mode="after")
    def _lengths(self):
        if len(self.mean) != len(self.std):
            raise ValueError(f"normalization.mean has {len(self.mean)} values but normalization.std has "
                             f"{len(self.std)}")
        if self.channel_order == "GRAY" and len(self.mean) != 1:
            raise ValueError(f"normalization.channel_order GRAY needs exactly one mean/std value, got "
                             f"{len(self.mean)}")
        if self.channel_order != "GRAY" and len(self.mean) != 3:
            raise ValueError(f"normalization.channel_order {self.channel_order} needs three mean/std values, got "
                             f"{len(self.mean)}")
        return self


class CalibrationSection(_Section):
    data_dir: Path = Field(description="folder of per-class sub-folders of calibration images (with evaluation.metric "
                                       "= \"outputs\": any image folder, its sub-folders sampled as groups)")
    count: int = Field(gt=0, description="number of images to sample")
    per_class_min: int = Field(default=1, ge=0, description="at least this many images of every class (or group)")
    seed: int = Field(default=0, ge=0)
    method: RangeMethod = "mse"
    percentile: float = Field(default=99.99, gt=50.0, le=100.0)
    kl_max_clipped: float = Field(default=0.01, ge=0.0, le=1.0,
                                  description="largest fraction of values the kl range may clip (1 = plain KL)")
    histogram_bins: int = Field(default=2048, ge=256, le=16384)
    # the observers see every quantized op's input for a whole batch at once: 8 keeps that in a few hundred MB at
    # 416x416 (the ranges and histograms do not depend on it)
    batch_size: int = Field(default=8, gt=0)
    on_bad_image: Literal["error", "skip"] = Field(
        default="error", description="unreadable / wrong-size images fail the build, or are skipped and listed")


class QuantizationSection(_Section):
    """Which ops are INT8 and how their ranges are chosen.  A pattern names ops by node name or layer
    scope (glob patterns allowed, e.g. "Default/features.1*") or by op type (e.g. "MatMul")."""
    skip: tuple[str, ...] = Field(default=(), description="ops left in float16 (patterns)")
    methods: dict[str, RangeMethod] = Field(default_factory=dict,
                                            description="per-layer range method: pattern -> method")
    bias_correction: bool = Field(default=False, description="correct each op's per-channel output mean shift")
    channel_scale: bool = Field(
        default=True, description="scale the input of an INT8 convolution per channel (a float16 Mul before its "
                                  "AscendQuant, the weights divided) where its channels' ranges differ and "
                                  "equalization cannot balance them")
    fallback: Literal["off", "auto"] = Field(
        default="off", description="auto: roll the most sensitive ops back to float16 until the gate passes")
    max_fallback: int = Field(default=5, ge=0, description="most ops fallback = 'auto' may roll back")
    sensitivity: Literal["auto", "always"] = Field(
        default="auto", description="when the per-layer analysis runs: auto: for fallback = 'auto' and for a failing "
                                    "gate (to name the layers to try); always: in every build, for the report")
    sensitivity_images: int = Field(default=32, gt=0, description="calibration images for the per-layer analysis")
    recover: Union[Literal["auto", "off"], tuple[str, ...]] = Field(
        default="auto", description="recovery before any fallback: auto: where there are tuning images, cross-layer "
                                    "equalization, output-aware ranges and learned rounding, each kept by the check "
                                    "on them; with none, equalization of the tensors INT8 starves; off; or a list "
                                    "of methods, run in order")
    recovery_images: int = Field(default=32, gt=0, description="calibration images the recovery measures and learns on")
    recovery_iterations: int = Field(default=3, gt=0,
                                     description="adaround: coordinate-descent passes over each layer's weights, at most")

    @field_validator("recover")
    @classmethod
    def _recover(cls, v):
        from .quantization.recovery import METHODS as RECOVERY
        if isinstance(v, str):
            return v
        bad = [m for m in v if m not in RECOVERY]
        if bad or not v:
            raise ValueError(f"unknown recovery method(s) {', '.join(map(repr, bad))}; give 'auto', 'off' or a "
                             f"list of {', '.join(map(repr, RECOVERY))}" if bad else
                             "an empty list: give 'off' for no recovery")
        return v


class OutputPart(_Section):
    """A part of a network output the gate compares and gates on its own (``evaluation.parts.<name>``): the
    elements ``slice`` along ``axis`` of ``output``, e.g. a detector's class scores."""
    output: Optional[str] = Field(default=None, description="the network output it is part of (default: the only one)")
    axis: int = Field(description="the axis it is sliced along: 1 for the channels of [1, 4 + classes, N], -1 for the "
                                  "last axis of [1, N, 5 + classes]; not the batch axis 0")
    slice: str = Field(description='"start:stop" along the axis, e.g. "0:4" or "4:" (Python slice bounds)')
    min_cosine: Optional[float] = Field(default=None, gt=0.0, le=1.0,
                                        description="its least cosine of INT8 to FP32 (default evaluation.min_cosine)")
    min_sqnr_db: Optional[float] = Field(default=None, description="its least SQNR of INT8 to FP32 (dB), if any")
    gate: bool = Field(default=True, description="false: a diagnostic, its figures reported, never failing the build")

    @field_validator("axis")
    @classmethod
    def _axis(cls, v):
        if v == 0:
            raise ValueError("axis 0 holds the images (the batch); give the axis the part is sliced along, e.g. 1")
        return v

    @field_validator("slice")
    @classmethod
    def _slice(cls, v):
        from .evaluation.parts import parse_slice
        parse_slice(v)
        return v


def _builtin_metrics() -> tuple[str, ...]:
    from .evaluation.shipped import SHIPPED
    return ("top1", "outputs", *SHIPPED)


class EvaluationSection(_Section):
    data_dir: Path = Field(description="held-out images for the accuracy gate: per-class folders (top1), or any "
                                       "image folder (outputs and task metrics)")
    metric: str = Field(
        default="top1", description="top1: classification accuracy of INT8 against FP32 on labelled images; "
                                    "outputs: INT8 against FP32 on every network output (or each part of it), by "
                                    "cosine similarity; detection: YOLO-style detections of INT8 against FP32 (F1, "
                                    "and mAP against YOLO label files); ctc, text_regions, segmentation: the text read, "
                                    "the text boxes, the pixel classes; 'module:callable': your own task metric")
    threshold: Optional[float] = Field(default=None, ge=0.0, le=1.0,
                                       description="top1: largest allowed top-1 accuracy drop (fraction, 0.01 = 1 point)")
    min_cosine: float = Field(default=0.99, gt=0.0, le=1.0,
                              description="outputs: least cosine similarity of INT8 to FP32 allowed on any output; "
                                          "the default limit of every part")
    parts: dict[str, OutputPart] = Field(
        default_factory=dict, description="parts of outputs compared and gated on their own: name -> part")
    min: dict[str, float] = Field(default_factory=dict,
                                  description="task metrics: least value of each named number the metric returns")
    max: dict[str, float] = Field(default_factory=dict,
                                  description="task metrics: largest value of each named number the metric returns")
    options: dict[str, Any] = Field(default_factory=dict,
                                    description="task metrics: keyword arguments of the metric")
    max_vs_float16: Optional[float] = Field(
        default=None, gt=0.0, description="the most task outcomes (classes, strings, boxes, pixels; the outputs' noise "
                                          "energy where the metric counts none) INT8 may change against FP32, as a "
                                          "multiple of what the float16-only path changes on the same images (its "
                                          "count taken as at least 1); gated with an interval like every figure, and "
                                          "steers the automatic fallback. Off by default (the ratio is reported)")
    tune_dir: Optional[Path] = Field(
        default=None, description='images the recovery and the automatic fallback tune on (quantization.fallback = '
                                  '"auto"); the gate judges all of data_dir. Default: see tune_from')
    tune_from: Literal["calibration", "held_out"] = Field(
        default="calibration", description="without tune_dir: calibration: tune on calibration.data_dir's images "
                                           "beyond the calibration sample (topped up by the sample itself), the gate "
                                           "judging all of data_dir; held_out: on tune_share of data_dir, the gate "
                                           "judging the rest")
    tune_images: Optional[int] = Field(
        default=None, gt=0, description="tune_from = calibration: how many images to tune on (default: as many as "
                                        "data_dir holds, or all the calibration folder has)")
    tune_share: float = Field(default=0.5, gt=0.0, lt=1.0,
                              description="tune_from = held_out: the share of each class (or group) of data_dir the "
                                          "automatic fallback tunes on; the gate judges the other images")
    batch_size: int = Field(default=64, gt=0)
    max_class_drop: Optional[float] = Field(
        default=None, ge=0.0, le=1.0, description="largest allowed top-1 drop of any single class (off by default)")
    allow_missing_classes: bool = Field(
        default=False, description="let the gate run when some of the model's classes have no held-out images")
    seed: int = Field(default=0, ge=0, description="seeds the tuning/gate split of data_dir and the bootstrap "
                                                   "intervals (the same seed: the same split and intervals)")
    confidence: float = Field(default=0.95, gt=0.5, lt=1.0,
                              description="the confidence of every gated figure's bootstrap interval")
    resamples: int = Field(default=1000, ge=100, le=100000,
                           description="bootstrap resamples of the held-out images per interval")
    on_undecided: Literal["fail", "pass", "warn"] = Field(
        default="fail", description="what an UNDECIDED verdict (the interval straddles the limit) does to the build: "
                                    "fail it, pass it, or pass it with a warning")
    baseline: Optional[Path] = Field(
        default=None, description="a previous build's accuracy_report.json or output folder: the gate also fails "
                                  "where a gated figure is worse than it beyond the interval")

    @field_validator("metric")
    @classmethod
    def _metric_name(cls, v):
        names = _builtin_metrics()
        if v in names:
            return v
        if ":" not in v:
            said = ", ".join(f'"{n}"' for n in names)
            raise ValueError(f'must be {said} or "module:callable" (your own task metric), got {v!r}')
        return _check_entry(v)

    @field_validator("parts")
    @classmethod
    def _part_names(cls, v):
        for name in v:
            if not name or not all(c.isalnum() or c in "_-" for c in name):
                raise ValueError(f"part name {name!r}: use letters, digits, '_' or '-'")
        return v

    @property
    def task(self) -> bool:
        """A task metric: a shipped one (``evaluation.shipped.SHIPPED``) or the user's own ``module:callable``."""
        return self.metric not in ("top1", "outputs")

    @model_validator(mode="after")
    def _metric(self):
        if self.metric == "top1" and self.threshold is None:
            raise ValueError('evaluation.threshold is required with evaluation.metric = "top1"')
        if self.metric != "top1" and self.max_class_drop is not None:
            raise ValueError(f'evaluation.max_class_drop is a top-1 setting; evaluation.metric = "{self.metric}" has '
                             f"no classes")
        if self.metric == "top1" and self.parts:
            raise ValueError('evaluation.parts: the top-1 gate reads the first output as class scores; parts are '
                             'gated with evaluation.metric = "outputs" or a task metric')
        if not self.task:
            given = [k for k in ("min", "max", "options") if getattr(self, k)]
            if given:
                raise ValueError(f"evaluation.{given[0]} belongs to a task metric (evaluation.metric = \"detection\", "
                                 f"\"ctc\", ... or \"module:callable\"), not to evaluation.metric = \"{self.metric}\"")
        if self.metric == "detection":
            from .evaluation.detection import check_options
            check_options(dict(self.options))
        elif self.task and self.metric in _builtin_metrics():   # shipped: its options checked as it takes them
            import importlib

            from .evaluation.shipped import SHIPPED
            module, _, name = SHIPPED[self.metric].partition(":")
            try:
                getattr(importlib.import_module(module), name)(**dict(self.options))
            except (TypeError, ValueError, QuantflowError) as err:
                raise ValueError(f"evaluation.options: {err}") from None
        elif self.task and not (self.min or self.max):
            raise ValueError(f"evaluation.min / evaluation.max: give the limits of the numbers {self.metric} returns, "
                             f"e.g. min = {{ accuracy = 0.99 }}; without one the gate would test nothing")
        return self


class AippPadding(_Section):
    """``aipp.padding``: border pixels added around the frame's pixels, per side (at most 32 each on the device)."""
    top: int = Field(default=0, ge=0, le=MAX_PADDING)
    bottom: int = Field(default=0, ge=0, le=MAX_PADDING)
    left: int = Field(default=0, ge=0, le=MAX_PADDING)
    right: int = Field(default=0, ge=0, le=MAX_PADDING)


class AippSection(_Section):
    template: Optional[Path] = Field(
        default=None, description="an AIPP template file, or the name of one shipped with quantflow; default: the "
                                  "shipped template of aipp.input_format (static_<format>.cfg)")
    input_format: Optional[Literal[tuple(SUPPORTED_FORMATS)]] = Field(
        default=None, description="the frames the device receives: RGB888_U8, YUV400_U8, YUV420SP_U8 (NV12) or "
                                  "XRGB8888_U8; default: the template's")
    color_matrix: Optional[Literal[tuple(STANDARDS)]] = Field(
        default=None, description="YUV420SP_U8: the frames' YUV standard, bt601_narrow (default), bt601_full (JPEG) "
                                  "or bt709_narrow; the matrix rows follow normalization.channel_order")
    input_channel_order: Literal["RGB", "BGR", "GRAY"] = Field(
        default="BGR", description="channel order of the raw RGB888_U8 / XRGB8888_U8 frames fed to the model on the "
                                   "device (not used for YUV frames)")
    src_image_size: Optional[tuple[int, int]] = Field(
        default=None, description="[w, h] of the frames, when larger than the crop (default: the crop window's end)")
    load_start_pos: Optional[tuple[int, int]] = Field(default=None, description="[w, h]: where the crop starts")
    crop_size: Optional[tuple[int, int]] = Field(
        default=None, description="[w, h] of the crop: the model input less the padding (the default)")
    padding: Optional[AippPadding] = Field(default=None, description="{top, bottom, left, right} border pixels")
    padding_value: float = Field(default=0.0, description="the AIPP output value of padded pixels (after "
                                                          "normalization: 0 is the training mean)")
    config_file: Optional[Path] = Field(
        default=None, description="a hand-written AIPP config to verify and use instead of the generated one")
    tolerance: float = Field(default=5e-3, gt=0.0, description="largest allowed |AIPP - training| difference, relative to max(1, |value|)")
    verify_images: int = Field(default=8, gt=0, description="calibration images used for the AIPP check")

    @model_validator(mode="before")
    @classmethod
    def _template_of_format(cls, data):
        if isinstance(data, dict) and data.get("template") is None and data.get("input_format") in SUPPORTED_FORMATS:
            data = {**data, "template": f"static_{data['input_format'].lower()}.cfg"}
        return data

    @field_validator("src_image_size", "crop_size")
    @classmethod
    def _size(cls, v):
        if v is not None and not all(1 <= d <= MAX_IMAGE_SIZE for d in v):
            raise ValueError(f"[w, h], each in [1, {MAX_IMAGE_SIZE}], got {list(v)}")
        return v

    @field_validator("load_start_pos")
    @classmethod
    def _start(cls, v):
        if v is not None and not all(0 <= d < MAX_IMAGE_SIZE for d in v):
            raise ValueError(f"[w, h], each in [0, {MAX_IMAGE_SIZE - 1}], got {list(v)}")
        return v

    @field_validator("padding_value")
    @classmethod
    def _float16(cls, v):
        if not (math.isfinite(v) and abs(v) <= 65504.0):
            raise ValueError(f"must be a finite float16 value (|v| <= 65504), got {v}")
        return v

    @model_validator(mode="after")
    def _consistent(self):
        if self.template is None and self.config_file is None:
            raise ValueError(f"give aipp.input_format ({', '.join(SUPPORTED_FORMATS)}), aipp.template or "
                             f"aipp.config_file")
        set_geometry = [f"aipp.{k}" for k in ("src_image_size", "load_start_pos", "crop_size", "padding", "color_matrix")
                        if getattr(self, k) is not None]
        if self.config_file is not None and set_geometry:
            raise ValueError(f"{', '.join(set_geometry)}: not used with aipp.config_file (the hand-written config "
                             f"holds its own; write it there)")
        if self.color_matrix is not None and self.input_format not in (None, "YUV420SP_U8"):
            raise ValueError(f"aipp.color_matrix applies to YUV420SP_U8 frames, not aipp.input_format = "
                             f"{self.input_format}")
        if self.input_format == "YUV420SP_U8":
            odd = [f"aipp.{k} {list(v)}" for k in ("src_image_size", "load_start_pos", "crop_size")
                   if (v := getattr(self, k)) is not None and any(d % 2 for d in v)]
            if odd:
                raise ValueError(f"{', '.join(odd)}: must be even with YUV420SP_U8 (4:2:0 chroma blocks)")
        if self.src_image_size and self.crop_size:
            start = self.load_start_pos or (0, 0)
            for i, axis in enumerate("wh"):
                if start[i] + self.crop_size[i] > self.src_image_size[i]:
                    raise ValueError(f"aipp.load_start_pos + aipp.crop_size ({start[i]} + {self.crop_size[i]}) exceeds "
                                     f"aipp.src_image_size ({self.src_image_size[i]}) in {axis}")
        return self


class BuildSection(_Section):
    output_dir: Path = Path("build")
    soc_version: str = "Ascend310P3"
    precision_mode: Literal[
        "force_fp16", "allow_fp32_to_fp16", "allow_mix_precision", "force_fp32", "must_keep_origin_dtype"
    ] = Field(default="force_fp16", description="atc --precision_mode; the emulation models float16 between the "
                                                "INT8 layers, atc's default force_fp16")
    atc_timeout_s: int = Field(default=1800, gt=0)
    require_om: bool = Field(default=False, description="fail (instead of skipping) when no .om can be built")
    atc_model: Literal["int8", "fp32", "int8sim"] = Field(
        default="int8", description="what atc converts: the INT8 deploy graph, or the FP32 network")
    atc_args: tuple[str, ...] = Field(default=(), description="extra atc options, e.g. --fusion_switch_file=f.cfg")
    batch_sizes: tuple[int, ...] = Field(
        default=(), description="batch sizes the device runs (e.g. [1, 8, 16]): deploy.onnx with a free batch, "
                                "one INT8 .om per size (a dynamic-batch .om of the FP32 network); empty: "
                                "model.input_shape's")

    @model_validator(mode="after")
    def _atc_args(self):
        try:
            check_atc_args(self.atc_args, self.atc_model)
        except ValueError as err:
            raise ValueError(f"build.atc_args: {err}") from None
        from .backends.atc import check_batch_sizes
        try:
            check_batch_sizes(self.batch_sizes, self.atc_args)
        except ValueError as err:
            raise ValueError(f"build.batch_sizes: {err}") from None
        try:
            check_precision_mode(self.precision_mode, self.atc_model)
        except ValueError as err:
            raise ValueError(f"build.precision_mode: {err}") from None
        return self

    @field_validator("atc_model")
    @classmethod
    def _atc_model(cls, v):
        if v == "int8sim":
            raise ValueError("'int8sim' (the fake-quant MindSpore network of the earlier integer scheme) is no "
                             "longer built: the Ascend INT8 deploy graph replaces it; use 'int8' (default) or 'fp32'")
        return v

    @field_validator("soc_version")
    @classmethod
    def _soc(cls, v):
        if not v.startswith("Ascend"):
            raise ValueError(f"must name an Ascend SoC such as Ascend310P3, got {v!r}")
        return v


class EngineSection(_Section):
    """Where the heavy evaluation runs; results are the same bit for bit whatever is chosen."""
    workers: int = Field(default=1, ge=1, description="local worker processes for the gate, the automatic fallback "
                                                      "and the per-layer sensitivity sweep")
    ray_address: Optional[str] = Field(
        default=None, description="shard over a Ray cluster instead: 'auto' (the cluster this machine joined), "
                                  "'local' (a Ray runtime started here) or 'ray://head:10001'")


class CacheSection(_Section):
    """The shared artifact cache (quantflow.pipeline.cache): where keyed stages' artifact folders are pulled from
    before they would run and pushed to once done.  Not part of any artifact key: the same build finds the same
    entries from any machine.  ``quantflow build --cache URL`` and $QUANTFLOW_CACHE override ``url``;
    ``--no-cache`` turns it off."""
    url: Optional[str] = Field(
        default=None, description="a folder (a shared mount) or an fsspec URL such as 's3://bucket/prefix' (the "
                                  "s3 extra; endpoint and keys from the standard AWS environment variables)")


class TrainSection(_Section):
    entry: str = Field(description="'module:callable(config, checkpoint_path) -> metrics dict' that trains the model")
    epochs: int = Field(default=12, gt=0)
    steps: Optional[int] = Field(default=None, gt=0,
                                 description="stop after this many optimizer steps (a deliberately brief training)")
    seed: int = Field(default=0, ge=0)
    min_accuracy: float = Field(default=0.9, ge=0.0, le=1.0, description="fail training below this held-out accuracy")

    @field_validator("entry")
    @classmethod
    def _entry(cls, v):
        return _check_entry(v)


class RetrainSection(_Section):
    """``[retrain]``: quantization-aware fine-tuning of the INT8 parameters in the device's arithmetic (the
    ``retrain`` stage, ``quantflow.quantization.qat``)."""
    mode: Literal["distill", "labels"] = Field(
        default="distill", description="distill: no labels, the FP32 network is the teacher on the calibration images "
                                       "(loss on its outputs, or on each part of evaluation.parts); labels: the loss of "
                                       "retrain.entry")
    entry: Optional[str] = Field(
        default=None, description="mode = 'labels': 'module:callable(config, network) -> loss(step)', loss(step) the "
                                  "network's loss (a MindSpore scalar) on your labelled batch of that step")
    steps: int = Field(default=200, gt=0, description="optimizer steps (Adam)")
    lr: float = Field(default=0.03, gt=0.0, description="learning rate in units of each output channel's INT8 weight "
                                                         "step (Adam moves a weight by about lr steps at a time; "
                                                         "cosine decay to a tenth over the steps). 0.03: over the "
                                                         "200 default steps a weight can move a few grid steps, as "
                                                         "far as rounding and clipping errors reach, each step a "
                                                         "small part of one; at 1e-3 it moves a tenth of a step in "
                                                         "all and the training changes next to nothing")
    batch_size: int = Field(default=32, gt=0, description="distill: calibration images per step")
    variants: int = Field(default=4, ge=0, description="distill: seeded label-free variants of each calibration image "
                                                       "(shifted, contrast changed) added to the images it learns from, "
                                                       "the teacher labelling each: 5x the images against learning "
                                                       "the calibration images' outputs instead of the network's "
                                                       "function. Left unset, fewer where the variants and the "
                                                       "teacher's outputs of them would take more than 1 GiB "
                                                       "(large inputs or outputs); 0: none")
    seed: int = Field(default=0, ge=0, description="the order of the images and MindSpore's seed")
    validation: float = Field(
        default=0.2, ge=0.0, lt=1.0, description="distill: the fraction of the calibration images held out of the "
                                                 "training (seeded by retrain.seed); the equalized start, then the "
                                                 "retrained parameters at the best checkpoint, replace what it "
                                                 "started from only where they lower the INT8 (emulated) loss on "
                                                 "them beyond their sampling spread; 0: judged on the images it "
                                                 "learns from")
    checkpoints: int = Field(default=5, gt=0, description="times during training (evenly spaced, the last step one of "
                                                           "them) the retrained parameters are measured on the "
                                                           "validation images, so an overfitting run keeps its best "
                                                           "point")
    learn_ranges: bool = Field(default=True, description="learn the activation ranges (AscendQuant's scale and "
                                                         "offset) too, as LSQ and PACT learn the clipping: the range "
                                                         "a calibration method chose (a clip, or a range too wide for "
                                                         "the narrow channels) is what the weights then adapt to; "
                                                         "false: frozen at the calibrated ones")
    learn_scales: bool = Field(default=True, description="learn a scale per channel between two INT8 convolutions "
                                                         "(the first's output channel times s, the second's input "
                                                         "channel divided by it): moves range between the channels "
                                                         "of a tensor INT8 quantizes with one scale, which the "
                                                         "straight-through gradient of the weights alone does not "
                                                         "see; exact on the float network, kept only where it lowers "
                                                         "the loss on the validation images, so on by default; "
                                                         "networks without such pairs are unchanged")
    scales_init: Literal["equalize", "one"] = Field(
        default="equalize", description="learn_scales: where the channel scales start: 'equalize', cross-layer "
                                         "equalization's closed form on the calibration images where it is exact (the "
                                         "ranges calibrated again on the rescaled network); 'one', every scale 1")
    scales_lr: float = Field(default=0.03, gt=0.0, description="learn_scales: the learning rate of the channel scales' "
                                                               "logarithms (cosine decay to a tenth, as lr)")
    device_target: Literal["CPU", "GPU", "Ascend"] = Field(
        default="CPU", description="where MindSpore trains: CPU here; GPU or Ascend on a training host")

    @field_validator("entry")
    @classmethod
    def _entry(cls, v):
        return None if v is None else _check_entry(v)

    @model_validator(mode="after")
    def _mode(self):
        if self.mode == "labels" and self.entry is None:
            raise ValueError("retrain.entry is required with retrain.mode = \"labels\" (your loss on labelled batches)")
        if self.mode == "distill" and self.entry is not None:
            raise ValueError("retrain.entry is read only with retrain.mode = \"labels\"; distill needs no entry")
        return self


class QuantflowConfig(_Section):
    model: ModelSection
    normalization: NormalizationSection
    calibration: CalibrationSection
    evaluation: EvaluationSection
    quantization: QuantizationSection = QuantizationSection()
    aipp: AippSection
    build: BuildSection = BuildSection()
    engine: EngineSection = EngineSection()
    cache: CacheSection = CacheSection()
    train: Optional[TrainSection] = None
    retrain: Optional[RetrainSection] = None

    # directory the configuration file lives in; relative paths are resolved against it
    root: Path = Field(default=Path("."), exclude=True)

    @model_validator(mode="after")
    def _consistent(self):
        if self.train is not None and self.model.entry is None:
            raise ValueError("[train] needs model.entry (the network to train)")
        if self.model.inputs and self.retrain is not None:
            raise ValueError(f"[retrain] with model.inputs ({', '.join(self.model.inputs)}): retraining runs "
                             f"single-input networks only; remove [retrain]")
        c = self.model.input_shape[1]
        n = len(self.normalization.mean)
        if c != n:
            raise ValueError(
                f"model.input_shape {list(self.model.input_shape)} has {c} channel(s) but normalization.mean has "
                f"{n} value(s)")
        if (c == 1) != (self.aipp.input_channel_order == "GRAY"):
            raise ValueError(f"aipp.input_channel_order = {self.aipp.input_channel_order!r} does not fit model.input_shape "
                             f"{list(self.model.input_shape)}: GRAY exactly when the model has one input channel")
        if self.evaluation.metric == "top1" and self.model.num_classes is None:
            raise ValueError('model.num_classes is required with evaluation.metric = "top1" (the default)')
        if self.evaluation.metric == "top1" and self.calibration.per_class_min * self.model.num_classes > self.calibration.count:
            raise ValueError(
                f"calibration.count = {self.calibration.count} cannot hold calibration.per_class_min = "
                f"{self.calibration.per_class_min} images of each of the {self.model.num_classes} classes "
                f"(model.num_classes)")
        return self

    @property
    def labelled_classes(self) -> int | None:
        """The class count the image folders are labelled with (per-class folders): ``model.num_classes`` for
        the top-1 gate; None for ``evaluation.metric = "outputs"``, whose image folders carry no labels."""
        return self.model.num_classes if self.evaluation.metric == "top1" else None

    def path(self, p: Path) -> Path:
        """Resolve a configured path against the configuration's directory."""
        p = Path(p)
        return p if p.is_absolute() else (self.root / p)

    @property
    def aipp_template(self) -> Path:
        """``aipp.template`` as a file: the path as configured when it exists, else the template of that name
        shipped with quantflow (a bare name, or the ``aipp_templates/<name>`` of older configs); a path that is
        neither is returned as configured, for the aipp stage to report as missing."""
        p = self.path(self.aipp.template)
        bare = Path(self.aipp.template).parent in (Path("."), Path("aipp_templates"))
        shipped = aipp_templates.path(Path(self.aipp.template).name) if bare and not p.is_file() else None
        return shipped or p

    @property
    def out(self) -> Path:
        return self.path(self.build.output_dir)

    def canonical_json(self) -> str:
        """A stable text of every setting (paths as written), for content hashing."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))


_SHOWN_VALUE_CHARS = 60  # a value quoted in a message is cut to this length
_MISSING = object()


def _value_at(data, loc):
    """The value at ``loc`` in the configuration as written (``_MISSING`` when it is not there)."""
    for part in loc:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return _MISSING
    return data


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN_VALUE_CHARS else text[:_SHOWN_VALUE_CHARS - 5] + " ...)"


def _section_fields(section: str) -> list[str]:
    """The keys a top-level section takes (for a close match to an unknown one)."""
    field = QuantflowConfig.model_fields.get(section)
    annotation = getattr(field, "annotation", None)
    for cls in (annotation, *getattr(annotation, "__args__", ())):
        if isinstance(cls, type) and issubclass(cls, BaseModel):
            return list(cls.model_fields)
    return []


def _error_line(e: dict, data: dict) -> str:
    """One line per problem: the field and the value as written, never a whole section."""
    loc = list(e["loc"])
    # an element of a list field (model.input_shape.3) is reported as the field with the list as written
    while loc and isinstance(loc[-1], int):
        loc.pop()
    field = ".".join(str(p) for p in loc)
    msg = e["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
    written = _value_at(data, loc)
    if e["type"] == "extra_forbidden":
        known = [k for k in (_section_fields(str(loc[0])) if len(loc) == 2 else list(QuantflowConfig.model_fields))
                 if k != "root"]
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        return f"{field}: unknown key" + (f" (did you mean {close[0]!r}?)" if close else "")
    if e["type"] == "missing" and len(loc) == len(e["loc"]):
        return f"{field}: required but missing"
    if len(loc) != len(e["loc"]) and written is not _MISSING:  # an element of a list: too few, or a bad element
        what = "too few values" if e["type"] == "missing" else f"element {e['loc'][-1]}: {msg}"
        return f"{field}: {what} (got {_show(written)})"
    if isinstance(e.get("input"), dict) and e["type"] == "value_error":
        # a check across a section's fields (or across sections): the message names them, the input is the
        # whole section
        return f"{field}: {msg}" if field and not msg.startswith(f"{field}.") else msg
    if e["type"] == "path_type":
        msg = "must be a path (a string)"
    if e["type"] in ("model_type", "dict_type"):
        msg = f"must be a table ([{field}] or {{ key = value, ... }})" if len(loc) == 1 else "must be a table"
    shown = _show(e.get("input"))
    return f"{field or '(top level)'}: {msg}" + ("" if f"got {shown}" in msg else f" (got {shown})")


def _format_errors(err: ValidationError, source: str, data: dict | None = None) -> str:
    lines = [f"invalid configuration in {source}:"]
    for e in err.errors():
        line = "  " + _error_line(e, data or {})
        if line not in lines:
            lines.append(line)
    return "\n".join(lines)


def config_from_dict(data: dict, root: Path | str = ".", source: str = "<dict>") -> QuantflowConfig:
    try:
        return QuantflowConfig.model_validate({**data, "root": Path(root)})
    except ValidationError as err:
        raise ConfigError(_format_errors(err, source, data)) from None


BASELINE_ENV = "QUANTFLOW_BASELINE"   # `quantflow build --baseline PATH` sets it: evaluation.baseline for the build


def load_config(path: Path | str = DEFAULT_CONFIG_NAME) -> QuantflowConfig:
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path} is a folder; give the configuration file (e.g. {path / DEFAULT_CONFIG_NAME})")
    if not path.is_file():
        raise ConfigError(f"configuration file not found: {path}")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigError(f"cannot read the configuration file {path}: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path} is not a text (UTF-8) file: byte {err.start} cannot be decoded") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path} is not valid TOML: {err}") from None
    if "root" in data:
        raise ConfigError(f"invalid configuration in {path}:\n  root: unknown key")
    baseline = os.environ.get(BASELINE_ENV)
    if baseline and isinstance(data.get("evaluation"), dict):
        data["evaluation"] = {**data["evaluation"], "baseline": str(Path(baseline).resolve())}
    return config_from_dict(data, root=path.resolve().parent, source=str(path))
