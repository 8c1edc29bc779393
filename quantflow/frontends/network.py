"""The user's MindSpore network: built from ``model.entry`` with its checkpoint loaded."""
from __future__ import annotations

import inspect
from pathlib import Path

from ..entry import load_entry
from ..errors import ConfigError, QuantflowError


def build_network(cfg, load_weights: bool = True):
    """Instantiate ``model.entry`` (passing num_classes when it takes it) and load ``model.checkpoint``."""
    import mindspore as ms
    from mindspore import nn

    factory = load_entry(cfg.model.entry, "model.entry")
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        params = {}
    net = factory(num_classes=cfg.model.num_classes) if "num_classes" in params else factory()
    if not isinstance(net, nn.Cell):
        raise ConfigError(f"model.entry: {cfg.model.entry!r} returned {type(net).__name__}, not a mindspore.nn.Cell")
    if load_weights:
        ckpt = Path(cfg.path(cfg.model.checkpoint))
        if not ckpt.is_file():
            raise ConfigError(f"model.checkpoint: file not found: {ckpt}")
        try:
            param_dict = ms.load_checkpoint(str(ckpt))
        except Exception as err:  # MindSpore raises plain ValueError/RuntimeError on corrupt files
            raise QuantflowError(f"model.checkpoint: cannot read {ckpt}: {err}") from None
        own = {p.name: tuple(p.shape) for p in net.get_parameters()}
        wrong = [f"{name}: checkpoint {tuple(v.shape)}, network {own[name]}" for name, v in param_dict.items()
                 if name in own and tuple(v.shape) != own[name]]
        if wrong:
            raise QuantflowError(f"model.checkpoint {ckpt} does not match {cfg.model.entry} (num_classes="
                                 f"{cfg.model.num_classes}); parameter shapes differ:\n  " + "\n  ".join(wrong[:20]))
        not_loaded, _ = ms.load_param_into_net(net, param_dict, strict_load=False)
        missing = [p for p in not_loaded if not p.endswith(("moments", "global_step"))]
        if missing:
            raise QuantflowError(f"model.checkpoint {ckpt} does not match the network; missing: {', '.join(missing[:10])}")
    net.set_train(False)
    return net
