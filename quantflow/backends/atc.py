"""The ``atc`` offline-model conversion for an Ascend SoC (default Ascend310P3).

``atc`` is looked up on PATH, then under $ASCEND_TOOLKIT_HOME.  The command line is built
exactly (--model, --framework (1 AIR, 5 ONNX), --output, --soc_version, --insert_op_conf,
--precision_mode, --input_shape; --dynamic_batch_size for ``build.batch_sizes``); a failure raises
``AtcError`` carrying atc's own error text.  Without atc the stage reports a skip and writes no .om.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from ..errors import AtcError

TOOLKIT_CANDIDATES = ("bin/atc", "compiler/bin/atc", "atc/bin/atc")


def find_atc(env: dict | None = None) -> Path | None:
    env = os.environ if env is None else env
    found = shutil.which("atc", path=env.get("PATH", ""))
    if found:
        return Path(found)
    home = env.get("ASCEND_TOOLKIT_HOME")
    if home:
        for rel in TOOLKIT_CANDIDATES:
            p = Path(home) / rel
            if p.is_file() and os.access(p, os.X_OK):
                return p
    return None


def not_found_reason(env: dict | None = None) -> str:
    env = os.environ if env is None else env
    home = env.get("ASCEND_TOOLKIT_HOME")
    where = (f"not on PATH, nor at $ASCEND_TOOLKIT_HOME/{{{','.join(TOOLKIT_CANDIDATES)}}} ({home})" if home
             else "not on PATH and $ASCEND_TOOLKIT_HOME is not set")
    return f"atc (CANN toolkit) not found: {where}; install CANN and source its set_env.sh to build the .om"


# atc's command-line options (CANN ATC instructions, "Command-Line Options" overview, hiascend.com
# atctool_0040); quantflow sets the first group itself from the configuration
SET_BY_QUANTFLOW = {"--model": "the stage's model", "--framework": "the model type", "--output": "the artifact folder",
                    "--soc_version": "build.soc_version", "--insert_op_conf": "the verified AIPP config",
                    "--precision_mode": "build.precision_mode", "--input_shape": "model.input_shape"}
KNOWN_OPTIONS = set(SET_BY_QUANTFLOW) | {
    "--mode", "--weight", "--om", "--json", "--singleop", "--input_format", "--input_shape_range",
    "--dynamic_batch_size", "--dynamic_image_size", "--dynamic_dims", "--output_type", "--check_report",
    "--core_type", "--aicore_num", "--virtual_type", "--out_nodes", "--input_fp16_nodes", "--external_weight",
    "--op_name_map", "--is_input_adjust_hw_layout", "--is_output_adjust_hw_layout", "--disable_reuse_memory",
    "--fusion_switch_file", "--enable_scope_fusion_passes", "--enable_single_stream", "--enable_small_channel",
    "--enable_compress_weight", "--compress_weight_conf", "--compression_optimize_conf", "--sparsity",
    "--buffer_optimize", "--mdl_bank_path", "--precision_mode_v2", "--allow_hf32", "--keep_dtype",
    "--modify_mixlist", "--op_precision_mode", "--op_select_implmode", "--optypelist_for_implmode",
    "--customize_dtypes", "--op_bank_path", "--op_debug_level", "--op_compiler_cache_mode",
    "--op_compiler_cache_dir", "--debug_dir", "--log", "--dump_mode", "--host_env_os", "--host_env_cpu",
    "--status_check", "--atomic_clean_policy", "--deterministic", "--shape_generalized_build_mode",
    "--oo_level", "--display_model_info"}
# "the input data cannot be of the DT_INT8 type in the dynamic shape scenario": atc refuses these options for
# a quantized deploy model (same page, General Restrictions)
DYNAMIC_SHAPE = {"--dynamic_batch_size", "--dynamic_image_size", "--dynamic_dims", "--input_shape_range"}


# ATC's constraint for quantized models: "the high-precision feature cannot be used. For example, force_fp32 or
# must_keep_origin_dtype (source image fp32 input) cannot be configured by --precision_mode, origin cannot be
# configured by --precision_mode_v2, and high_precision cannot be configured by --op_precision_mode. When
# quantization parameters are set in high-precision mode, neither the performance benefits of quantization nor
# the precision benefits of the high-precision mode can be obtained" (CANN 8.5 ATC, --compression_optimize_conf,
# atlasatcparam_16_0059; stated there for atc's own calibration, and as true of a deploy graph quantized
# beforehand).  quantflow's emulation models float16 between the INT8 layers (atc's default force_fp16), so the
# INT8 deploy graph refuses these.
HIGH_PRECISION_MODES = ("force_fp32", "must_keep_origin_dtype")
FLOAT16_MODELLED = "force_fp16"


def check_precision_mode(mode: str, atc_model: str) -> None:
    if atc_model == "int8" and mode in HIGH_PRECISION_MODES:
        raise ValueError(f"precision_mode {mode!r} keeps float32 where the INT8 deploy graph's emulation models "
                         f"float16, and atc's constraints for quantized models exclude it: use "
                         f"{FLOAT16_MODELLED!r} (atc's default) or 'allow_fp32_to_fp16'")


def precision_note(mode: str) -> str | None:
    """What the gate says of a precision mode the emulation does not model exactly (None for force_fp16)."""
    if mode == FLOAT16_MODELLED:
        return None
    return (f"atc --precision_mode={mode} may keep float ops in float32 on the device; the gate modelled them "
            f"in float16 (as {FLOAT16_MODELLED}, atc's default)")


def check_atc_args(args, atc_model: str) -> None:
    """Each of ``args`` is ``--option`` or ``--option=value``, a known atc option quantflow does not set itself;
    raises ValueError naming the offending one."""
    for a in args:
        name = a.split("=", 1)[0]
        if not a.startswith("--") or name == "--":
            raise ValueError(f"{a!r} is not an atc option (expected --name=value)")
        if name in SET_BY_QUANTFLOW:
            raise ValueError(f"{name} is set by quantflow from {SET_BY_QUANTFLOW[name]}; leave it out of build.atc_args")
        if name not in KNOWN_OPTIONS:
            close = sorted(o for o in KNOWN_OPTIONS if o[2:6] == name[2:6])
            raise ValueError(f"unknown atc option {name}" + (f" (did you mean {', '.join(close)}?)" if close else ""))
        if name in DYNAMIC_SHAPE and atc_model == "int8":
            raise ValueError(f"{name}: atc does not accept dynamic shapes for a quantized (int8) deploy model "
                             f"(CANN ATC restrictions); use it with build.atc_model = \"fp32\" or drop it "
                             f"(build.batch_sizes builds one INT8 .om per batch size)")
        value = a.split("=", 1)[1] if "=" in a else ""
        if atc_model == "int8" and (name == "--op_precision_mode" or (name == "--precision_mode_v2"
                                                                      and value == "origin")):
            raise ValueError(f"{a}: a high-precision mode, which atc's constraints for quantized models exclude and "
                             f"the INT8 emulation (float16 between the INT8 layers) does not model; drop it")


# atc's batch-size profiles (CANN ATC, --dynamic_batch_size, atlasatcparam_16_0018 in CANN 8.0 and 8.5; atctool_000054
# in 6.2): "The batch size profile range is (1,100]. At least two profiles must be set and a maximum of 100 profiles
# are supported. The recommended value range for each profile is [1-2048]"; used with --input_shape whose first
# dimension is -1 ("Only the scenario where N is in the first place of the shape is supported"); exclusive with the
# other dynamic-shape options; "cannot be used together with --framework = 1. The *.air model does not support
# dynamic shape profiles" (8.0).  And for a quantized deploy model the General Restrictions (DYNAMIC_SHAPE above)
# exclude it altogether, so the INT8 deploy graph is converted once per batch size instead (tasks/atc.py).
MIN_PROFILES, MAX_PROFILES, MAX_BATCH = 2, 100, 2048


def check_batch_sizes(sizes, atc_args=()) -> None:
    """``sizes`` (build.batch_sizes): empty, or 2 to 100 batch sizes in increasing order, each in 1..2048, and no
    dynamic-shape option of atc's in ``atc_args`` beside them; raises ValueError saying which rule is broken."""
    sizes = list(sizes)
    if not sizes:
        return
    if not MIN_PROFILES <= len(sizes) <= MAX_PROFILES:
        raise ValueError(f"{len(sizes)} batch size(s): atc takes {MIN_PROFILES} to {MAX_PROFILES} batch-size profiles "
                         f"(leave it empty for one static batch, model.input_shape's)")
    out = [s for s in sizes if not 1 <= s <= MAX_BATCH]
    if out:
        raise ValueError(f"batch size(s) {out} outside atc's range 1..{MAX_BATCH}")
    if any(b <= a for a, b in zip(sizes, sizes[1:])):
        raise ValueError(f"{sizes}: list each batch size once, in increasing order")
    given = sorted({a.split("=", 1)[0] for a in atc_args} & DYNAMIC_SHAPE)
    if given:
        raise ValueError(f"{', '.join(given)} in build.atc_args: quantflow passes the batch sizes to atc itself "
                         f"(atc takes one dynamic-shape option); drop it from build.atc_args")


def atc_command(atc: Path, model: Path, framework: int, output_prefix: Path, soc_version: str,
                insert_op_conf: Path | None, precision_mode: str, input_name: str, input_shape,
                extra_args=(), batch_sizes=(), other_inputs: dict | None = None) -> list[str]:
    """``framework``: 1 for an AIR (MindSpore), 5 for ONNX; ``extra_args``: build.atc_args, checked;
    ``batch_sizes``: atc's batch-size profiles (``check_batch_sizes``): the input's batch becomes -1 and the
    profiles go to --dynamic_batch_size (no shell between: the list is one argument, unquoted).
    ``other_inputs``: the model's inputs other than the image (``model.inputs``), name -> shape, each named in
    --input_shape after the image ("image:1,3,224,224;scale_factor:1,2", CANN ATC's --input_shape: one
    "name:dims" per input, separated by ";"); the AIPP config applies to the image input alone, the model's
    first (``related_input_rank : 0``)."""
    cmd = [str(atc), f"--model={model}", f"--framework={framework}", f"--output={output_prefix}",
           f"--soc_version={soc_version}"]
    if insert_op_conf is not None:
        cmd.append(f"--insert_op_conf={insert_op_conf}")
    dims = [-1 if batch_sizes else int(input_shape[0])] + [int(d) for d in input_shape[1:]]
    shapes = [(input_name, dims)] + [(k, [int(d) for d in v]) for k, v in (other_inputs or {}).items()]
    cmd += [f"--precision_mode={precision_mode}",
            "--input_shape=" + ";".join(f"{k}:{','.join(map(str, d))}" for k, d in shapes)]
    if batch_sizes:
        cmd.append(f"--dynamic_batch_size={','.join(str(int(b)) for b in batch_sizes)}")
    return cmd + list(extra_args)


def _env_for(atc: Path, env: dict | None = None) -> dict:
    env = dict(os.environ if env is None else env)
    home = env.get("ASCEND_TOOLKIT_HOME")
    if home:
        libs = [str(Path(home) / d) for d in ("lib64", "compiler/lib64") if (Path(home) / d).is_dir()]
        if libs:
            env["LD_LIBRARY_PATH"] = os.pathsep.join(libs + [env.get("LD_LIBRARY_PATH", "")]).rstrip(os.pathsep)
    return env


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run_atc(cmd: list[str], output_prefix: Path, timeout_s: int, env: dict | None = None) -> dict:
    """Run atc; returns {"om", "log"}; raises AtcError with atc's own text on failure."""
    output_prefix = Path(output_prefix)
    output_prefix.parent.mkdir(parents=True, exist_ok=True)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=_env_for(Path(cmd[0]), env),
                              cwd=output_prefix.parent)
    except subprocess.TimeoutExpired:
        raise AtcError(f"atc did not finish within {timeout_s} s (build.atc_timeout_s): {' '.join(cmd)}") from None
    except OSError as err:
        raise AtcError(f"cannot run {cmd[0]}: {err}") from None
    log = (proc.stdout or "") + (proc.stderr or "")
    if proc.returncode != 0:
        raise AtcError(f"atc failed (exit code {proc.returncode}):\n{_tail(log)}\ncommand: {' '.join(cmd)}")
    om = output_prefix.with_name(output_prefix.name + ".om")
    if not om.is_file():
        found = sorted(output_prefix.parent.glob(output_prefix.name + "*.om"))
        if not found:
            raise AtcError(f"atc exited 0 but wrote no {om}:\n{_tail(log)}")
        om = found[0]
    return {"om": om.name, "log": _tail(log, 200)}
