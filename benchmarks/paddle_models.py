"""Does a PaddleDetection detector, converted by paddle2onnx as it writes it, build to a decisive verdict?

    python -m benchmarks.paddle_models --make-converter --workdir /tmp/paddle_models
    python -m benchmarks.paddle_models --converter-python /path/to/paddlevenv/bin/python --calib 264 --evals 400

Issue 44's done-when for a network with several inputs: PicoDet-S (416 x 416, COCO's 80 classes), the inference
model (``model.pdmodel``, ``model.pdiparams``, ``infer_cfg.yml``) that the ``paddlelabel-ml`` 1.0.0 wheel ships
under ``paddlelabel_ml/model/PicoDet/ckpt/`` for PaddleLabel's automatic labelling.  Its inputs are ``image`` and
``scale_factor`` (the resize from the original image, which the boxes are divided by), and it ends in
PaddleDetection's ``multiclass_nms3``.  In ``--workdir`` (default: a temporary folder):

- the wheel is fetched with this interpreter's ``pip download --no-deps`` (kept in ``WORKDIR/wheels``) and the
  inference model read out of it;
- it is converted by paddle2onnx in another interpreter (``--converter-python``: Paddle is never imported here)
  as paddle2onnx writes it: ``paddle2onnx --model_dir ... --model_filename model.pdmodel --params_filename
  model.pdiparams --save_file WORKDIR/onnx/picodet_s_416_coco.onnx --opset_version 11`` (paddle2onnx raises the
  opset to 14 for ``hard_swish`` by itself); ``--make-converter`` first makes that interpreter's venv where it
  is missing, with ``CONVERTER``'s pins;
- images: ``benchmarks.synth`` kind ``scenes`` at 416 x 416 (``--calib`` calibration images, seed ``--seed``) and
  ``scenes_held_out`` (``--evals`` held-out images, the next seed): scikit-image's photographs of a person, a cat, a
  motorcycle, a cup, a clock ... pasted on shapes, the two kinds sharing no photograph.  At the network's own size,
  so ``scale_factor`` is [1, 1], what ``quantflow init`` writes;
- as a new user: ``quantflow init --onnx picodet_s_416_coco.onnx --calib calib --eval eval`` in the project
  folder, the ``[normalization]`` lines (marked EDIT) set from ``infer_cfg.yml``'s ``NormalizeImage`` (mean, std,
  ``is_scale``; RGB, as PaddleDetection's reader decodes), nothing else edited, then ``nice -n 10 quantflow
  build``.  A refusal of init or of the build is a result: its message is recorded and the case stops.

The row: what init recognised and wrote (``model.outputs``, ``[model.inputs]``, the metric), the build's exit code,
verdict and gated figures with their 95% intervals, the float16 floor line, the build's wall time.  A markdown table
is printed and written to ``--out`` (default ``paddle_models.md``), everything to ``--json``.  Needs quantflow's venv
(with ``pip install --no-deps scikit-image`` for the photographs) and, for the converter, PyPI.
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
from pathlib import Path

from benchmarks import new_user

ROOT = Path(__file__).resolve().parent.parent
WHEEL = "paddlelabel-ml==1.0.0"
MEMBER = "paddlelabel_ml/model/PicoDet/ckpt/"          # the inference model inside the wheel
FILES = ("model.pdmodel", "model.pdiparams", "infer_cfg.yml")
CONVERTER = ("paddlepaddle==2.6.2", "paddle2onnx==1.3.1")   # paddle2onnx 1.3 reads .pdmodel files of Paddle 2.x
ONNX_NAME = "picodet_s_416_coco.onnx"
SIZE = 416


def make_converter(python: Path) -> None:
    """A venv for paddle2onnx at ``python``'s prefix (``.../bin/python``), with ``CONVERTER``'s pins, unless there."""
    if python.exists():
        return
    venv = python.parent.parent
    subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *CONVERTER], check=True)


def inference_model(workdir: Path) -> Path:
    """The PicoDet inference model's folder, read out of the wheel (downloaded into ``WORKDIR/wheels`` unless there)."""
    wheels, dest = workdir / "wheels", workdir / "paddle" / "picodet"
    wheels.mkdir(parents=True, exist_ok=True)
    found = sorted(wheels.glob("paddlelabel_ml-1.0.0-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", WHEEL,
                        "-d", str(wheels)], check=True, capture_output=True, text=True)
        found = sorted(wheels.glob("paddlelabel_ml-1.0.0-*.whl"))
    if not found:
        raise SystemExit(f"no {WHEEL} wheel in {wheels}")
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(found[0]) as z:
        for f in FILES:
            (dest / f).write_bytes(z.read(MEMBER + f))
    return dest


def convert(python: Path, model_dir: Path, onnx: Path) -> dict:
    """paddle2onnx on the inference model in the converter's interpreter: exit code, seconds, what it printed."""
    onnx.parent.mkdir(parents=True, exist_ok=True)
    cmd = [str(python.parent / "paddle2onnx"), "--model_dir", str(model_dir), "--model_filename", "model.pdmodel",
           "--params_filename", "model.pdiparams", "--save_file", str(onnx), "--opset_version", "11"]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", ln) for ln in (r.stdout + r.stderr).splitlines()]
    return {"command": " ".join(["paddle2onnx", *cmd[1:]]), "exit": r.returncode,
            "seconds": time.perf_counter() - t0, "notes": [ln for ln in lines if "[Paddle2ONNX]" in ln],
            "tail": lines[-new_user.TAIL:] if r.returncode else []}


def normalization(model_dir: Path) -> dict:
    """``infer_cfg.yml``'s NormalizeImage as quantflow's [normalization] lines (PaddleDetection decodes RGB)."""
    import yaml

    cfg = yaml.safe_load((model_dir / "infer_cfg.yml").read_text())
    norm = next(p for p in cfg["Preprocess"] if p["type"] == "NormalizeImage")
    return {"mean": norm["mean"], "std": norm["std"], "scale": "0-1" if norm.get("is_scale", True) else "0-255",
            "channel_order": "RGB"}


def set_normalization(toml: Path, values: dict) -> list[str]:
    """The [normalization] lines marked EDIT set to ``values``; returns what was set and whether init had it so."""
    text = toml.read_text()
    done = []
    for key, value in values.items():
        shown = json.dumps(value)
        old = re.search(rf"(?m)^{key} = ([^#\n]*?)\s*(#.*)?$", text)
        if old is None:
            raise SystemExit(f"{toml}: no line '{key} = ...' to edit")
        same = json.loads(old.group(1)) == value
        text = text[:old.start(1)] + shown + text[old.end(1):]
        done.append(f"{key} = {shown}" + (" (as init wrote it)" if same else ""))
    toml.write_text(text)
    return done


def images(workdir: Path, calib: int, evals: int, seed: int) -> tuple[Path, Path]:
    """calib/ and eval/ of ``benchmarks.synth`` scenes at 416 x 416, made once per count and seed."""
    from benchmarks.synth import held_out, write_images

    base = workdir / "images" / f"scenes-{SIZE}-{calib}-{evals}-{seed}"
    if not (base / "done").is_file():
        shutil.rmtree(base, ignore_errors=True)
        write_images(base / "calib", "scenes", SIZE, SIZE, calib, seed)
        write_images(base / "eval", held_out("scenes"), SIZE, SIZE, evals, seed + 1)
        (base / "done").write_text("")
    return base / "calib", base / "eval"


def run(a, workdir: Path) -> dict:
    model_dir = inference_model(workdir)
    onnx = workdir / "onnx" / ONNX_NAME
    row = {"case": "picodet_s_416_coco", "kind": "object detector, 80 COCO classes (PicoDet-S, GFL head)",
           "file": f"{WHEEL}: {MEMBER}"}
    row["convert"] = conv = convert(a.converter_python, model_dir, onnx)
    print(f"paddle2onnx exit {conv['exit']}", flush=True)
    if conv["exit"]:
        row["stopped"] = {"at": "paddle2onnx", "message": conv["tail"]}
        return row
    folder = workdir / "projects" / row["case"]
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    shutil.copy(onnx, folder / ONNX_NAME)
    calib, evals = images(workdir, a.calib, a.evals, a.seed)
    if not new_user.init(folder, ONNX_NAME, calib, evals, row, ""):
        return row
    toml = folder / "quantflow.toml"
    conf = tomllib.loads(toml.read_text())
    row["recognised"] = new_user.head_comment(toml)
    row["written"] = {"outputs": conf["model"].get("outputs"), "inputs": conf["model"].get("inputs"),
                      "metric": conf["evaluation"].get("metric"), "options": conf["evaluation"].get("options")}
    row["edited"] = set_normalization(toml, normalization(model_dir))
    new_user.build(folder, row, "")
    return row


def format_table(rows: list[dict]) -> str:
    lines = ["| model | what init wrote | what the user did | verdict: gated figures [95% interval] "
             "| float16 floor (accuracy_report.txt) | s |", "|---|---|---|---|---|---|"]
    for r in rows:
        w = r.get("written") or {}
        wrote = (f"model.outputs = {w.get('outputs')}, [model.inputs] {w.get('inputs')}, `{w.get('metric')}`"
                 if w else "-")
        did = "; ".join(["paddle2onnx --opset_version 11", "init", *(r.get("edited") or []), "build"])
        verdict, floor, secs = new_user.verdict_cell(r)
        lines.append(f"| {r['case']} | {wrote} | {did} | {verdict} | {floor} | {secs} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", type=Path, default=None, help="default: a temporary folder, removed after")
    ap.add_argument("--converter-python", type=Path, default=Path("/tmp/paddlevenv/bin/python"),
                    help="the interpreter with paddlepaddle and paddle2onnx (default /tmp/paddlevenv/bin/python)")
    ap.add_argument("--make-converter", action="store_true",
                    help=f"make --converter-python's venv where it is missing: {' '.join(CONVERTER)}")
    ap.add_argument("--calib", type=int, default=264, help="calibration images (default 264: init samples half)")
    ap.add_argument("--evals", type=int, default=400, help="held-out images (default 400)")
    ap.add_argument("--seed", type=int, default=0, help="the calibration images' seed; held-out: seed + 1")
    ap.add_argument("--out", type=Path, default=Path("paddle_models.md"))
    ap.add_argument("--json", type=Path, default=Path("paddle_models.json"))
    a = ap.parse_args(argv)
    if a.make_converter:
        make_converter(a.converter_python)
    if not a.converter_python.exists():
        raise SystemExit(f"--converter-python {a.converter_python} does not exist: give the interpreter of a venv "
                         f"with {' '.join(CONVERTER)}, or add --make-converter")
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory() as tmp:
        rows = [run(a, (a.workdir or Path(tmp)).resolve())]
        a.json.write_text(json.dumps(rows, indent=1, default=str))
    a.out.write_text(format_table(rows) + "\n")
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
