"""One build of one configuration: the stages it has (``quantflow.tasks.STAGES``, less those it does not use),
each keyed stage's artifact key and folder, the artifact cache it pulls from and pushes to, and what several
stages read.  Stage functions receive it."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..config import QuantflowConfig, load_config
from ..errors import ConfigError
from ..io import atomic
from ..io.digest import file_sha256
from ..tasks import STAGES
from ..tasks.sample import calibration_paths, manifest_path
from ..tasks.stage import Stage, done_marker
from . import keys, lock
from .cache import ArtifactCache, open_cache


class Build:
    def __init__(self, cfg, config_file: Path | None = None, cache: ArtifactCache | None = None):
        self.cfg = cfg
        self.config_file = config_file  # the file cfg was read from (named in messages), when there is one
        self.cache = cache              # the shared artifact cache (quantflow.pipeline.cache), None without one
        self.rebuild: set[str] = set()  # keyed stages to run again, not pulled (quantflow build --always)
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

    # ------------------------------------------------------------------ the artifact cache
    def pull(self, stage: Stage) -> bool:
        """Before a keyed stage runs: its entry pulled from the cache into its folder, where the cache has a sound
        one (and the stage's own ``uptodate`` condition holds for it on this machine); True when pulled (the caller
        marks the stage done).  Not for a stage already done here or asked to run again (``rebuild``)."""
        if self.cache is None or not stage.keyed or stage.name in self.rebuild or self.done(stage.name):
            return False
        key, folder = self.key(stage.name), self.dir(stage.name)
        if not self.cache.pull(stage.name, key, folder):
            return False
        if stage.uptodate and not stage.uptodate(self):
            print(f"cache: {stage.name} {key} in {self.cache.url} does not stand on this machine (its own check "
                  f"fails here); running {stage.name}", flush=True)
            return False
        print(f"cache: {stage.name} {key} pulled from {self.cache.url}", flush=True)
        return True

    def push(self, stage: Stage) -> None:
        """After a keyed stage completed (its marker written): its folder pushed to the cache."""
        if self.cache is not None and stage.keyed and self.cache.push(stage.name, self.key(stage.name),
                                                                      self.dir(stage.name)):
            print(f"cache: {stage.name} {self.key(stage.name)} pushed to {self.cache.url}", flush=True)

    # ------------------------------------------------------------------ what stages read
    def file_digest(self, path) -> str | None:
        return file_sha256(path) if path is not None and Path(path).is_file() else None

    def manifest_digest(self) -> str | None:
        """The calibration manifest by content, its paths relative to the configuration's folder: the sampler
        records images outside that folder (``../../calib_data``) by absolute path, which differs from clone to
        clone; the images themselves are in it by SHA-256."""
        path = manifest_path(self.cfg)
        if not path.is_file():
            return None
        return keys.json_digest(keys.portable(json.loads(path.read_text()), self.cfg.root))

    def calibration_paths(self) -> list[Path]:
        return calibration_paths(self.cfg)


def open_build(path: Path | QuantflowConfig, cache=None) -> Build:
    """The build of the configuration at ``path`` (or of a configuration already loaded): its output folder's lock
    taken (one build at a time per build.output_dir; a second build of the same folder waits), what a killed build
    left there swept, model.entry / train.entry modules beside the config importable, and its artifact cache
    opened: ``cache`` a URL, False for none, None for $QUANTFLOW_CACHE, else ``[cache] url``
    (``quantflow.pipeline.cache.choose``).  A bad config or cache URL, or an output folder that cannot be written,
    raises QuantflowError."""
    if isinstance(path, QuantflowConfig):
        c, path = path, None
    else:
        c = load_config(path)
    shared = open_cache(cache, c, path)
    where = path if path is not None else c.root
    try:
        lock.acquire(c.out)
        atomic.sweep(c.out)
    except OSError as err:
        raise ConfigError(f"{where}: build.output_dir {str(c.build.output_dir)!r}: cannot write the build folder "
                          f"{c.out}: {err.strerror or err}") from None
    if str(c.root) not in sys.path:
        sys.path.insert(0, str(c.root))
    return Build(c, Path(path) if path is not None else None, shared)
