"""Evaluation: the INT8 emulation against FP32 on held-out images, and the metrics the gate and the automatic
fallback judge by.

- ``runs``: what is run -- the held-out set (``HeldOut``) and its split into the fallback's tuning images and
  the gate's, FP32 (the graph IR on the training preprocessing) and INT8 (each uint8 image through AIPP into
  the emulation of the deploy graph), sharded over ``[engine]`` with the single process's numbers bit for bit;
- ``parts``: parts of network outputs (``evaluation.parts``) and the parts proposed for the usual detector heads;
- ``metrics``: the metric protocol (``protocol``) and its registry (``evaluation.metric``): ``top1``,
  ``outputs``, and the task metrics (``task``: the user's own ``module:callable``, or ``detection``).
"""
