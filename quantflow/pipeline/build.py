"""One build of one configuration: the stages it has (``quantflow.tasks.STAGES``, less those it does not use),
each keyed stage's artifact key and folder, and what several stages read.  Stage functions receive it."""
from __future__ import annotations

import sys
from pathlib import Path

from ..config import load_config
from ..errors import ConfigError
from ..io import atomic
from ..io.digest import file_sha256
from ..tasks import STAGES
from ..tasks.sample import calibration_paths, manifest_path
from ..tasks.stage import Stage, done_marker
from . import keys, lock


class Build:
    def __init__(self, cfg, config_file: Path | None = None):
        self.cfg = cfg
        self.config_file = config_file  # the file cfg was read from (named in messages), when there is one
        self._keys: dict[str, tuple[str, dict]] = {}
        self.failure: Exception | None = None   # the error a stage raised in this build (doit_graph), if any

    def stages(self) -> list[Stage]:
        """The configuration's stages, in build order."""
        return [s for s in STAGES.values() if s.used(self.cfg)]

    def needs(self, stage: Stage) -> list[str]:
        """The stages ``stage`` needs that this configuration has; an unused one stands for what it needs."""
        out = []
        for name in stage.needed(self.cfg):
            s = STAGES[name]
            out += [name] if s.used(self.cfg) else self.needs(s)
        return list(dict.fromkeys(out))

    # ------------------------------------------------------------------ keys
    def _key(self, name: str) -> tuple[str, dict]:
        if name not in self._keys:
            stage = STAGES[name]
            upstream = {u: self._key(u)[0] for u in self.needs(stage) if STAGES[u].keyed}
            inputs = keys.stage_key_inputs(name, stage.key_inputs(self), upstream)
            self._keys[name] = (keys.artifact_key(inputs), inputs)
        return self._keys[name]

    def key(self, name: str) -> str:
        """A keyed stage's artifact key (known once the checkpoint and the calibration manifest exist)."""
        return self._key(name)[0]

    def dir(self, name: str, create: bool = True) -> Path:
        """A keyed stage's artifact folder under its current key; created with the key's inputs in it
        (``key_inputs.json``) unless ``create`` is false."""
        key, inputs = self._key(name)
        folder = keys.artifact_dir(self.cfg.out, name, key)
        if create and not (folder / "key_inputs.json").is_file():
            folder.mkdir(parents=True, exist_ok=True)
            atomic.write_json(folder / "key_inputs.json", inputs)
        return folder

    def done(self, name: str) -> bool:
        """A keyed stage's outputs are complete under its current key (reads only)."""
        return done_marker(self.dir(name, create=False), name).is_file()

    def mark_done(self, name: str) -> None:
        atomic.write_text(done_marker(self.dir(name), name), "ok\n")

    # ------------------------------------------------------------------ what stages read
    def file_digest(self, path) -> str | None:
        return file_sha256(path) if path is not None and Path(path).is_file() else None

    def manifest_digest(self) -> str | None:
        return self.file_digest(manifest_path(self.cfg))

    def calibration_paths(self) -> list[Path]:
        return calibration_paths(self.cfg)


def open_build(path: Path) -> Build:
    """The build of the configuration at ``path``: its output folder's lock taken (one build at a time per
    build.output_dir; a second build of the same folder waits), what a killed build left there swept, and
    model.entry / train.entry modules beside the config importable.  A bad config, or an output folder that
    cannot be written, raises QuantflowError."""
    c = load_config(path)
    try:
        lock.acquire(c.out)
        atomic.sweep(c.out)
    except OSError as err:
        raise ConfigError(f"{path}: build.output_dir {str(c.build.output_dir)!r}: cannot write the build folder "
                          f"{c.out}: {err.strerror or err}") from None
    if str(c.root) not in sys.path:
        sys.path.insert(0, str(c.root))
    return Build(c, Path(path))
