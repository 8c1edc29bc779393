"""quantflow: `doit` builds the INT8 model described by quantflow.toml (or `doit config=FILE`).

The task graph ships with the package (quantflow.pipeline.doit_graph, made from the stage table in tasks/);
`quantflow build` runs the same graph.
"""
from quantflow.pipeline.doit_graph import *  # noqa: F401,F403  (the task_* functions doit collects)
from quantflow.pipeline.doit_graph import doit_config

DOIT_CONFIG = doit_config()
