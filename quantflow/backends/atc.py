"""Stage 5: the ``atc`` offline-model conversion for an Ascend SoC (default Ascend310P3).

``atc`` is looked up on PATH, then under $ASCEND_TOOLKIT_HOME.  The command line is built
exactly (--model, --framework (1 AIR, 5 ONNX), --output, --soc_version, --insert_op_conf,
--precision_mode, --input_shape); a failure raises ``AtcError`` carrying atc's own error
text.  Without atc the stage reports a skip and writes no .om.
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


def atc_command(atc: Path, model: Path, framework: int, output_prefix: Path, soc_version: str,
                insert_op_conf: Path | None, precision_mode: str, input_name: str, input_shape) -> list[str]:
    """``framework``: 1 for an AIR (MindSpore), 5 for ONNX."""
    cmd = [str(atc), f"--model={model}", f"--framework={framework}", f"--output={output_prefix}",
           f"--soc_version={soc_version}"]
    if insert_op_conf is not None:
        cmd.append(f"--insert_op_conf={insert_op_conf}")
    cmd += [f"--precision_mode={precision_mode}",
            f"--input_shape={input_name}:{','.join(str(int(d)) for d in input_shape)}"]
    return cmd


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
