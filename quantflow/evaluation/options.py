"""``evaluation.options`` of a shipped task metric, read into its pydantic model: a ConfigError naming the
option at fault (``evaluation.options.<name>``) and the options the metric takes."""
from __future__ import annotations

from pydantic import BaseModel, ValidationError

from ..errors import ConfigError


def read_options(model: type[BaseModel], options: dict, metric: str):
    """``model(**options)``, its validation error as one ConfigError naming the field."""
    try:
        return model(**options)
    except ValidationError as err:
        e = err.errors()[0]
        field = ".".join(str(p) for p in e["loc"])
        said = "unknown key" if e["type"] == "extra_forbidden" else e["msg"]
        raise ConfigError(f"evaluation.options.{field}: {said} (the {metric} metric's options: "
                          f"{', '.join(model.model_fields)})") from None
