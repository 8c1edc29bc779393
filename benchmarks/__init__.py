"""Measurements of quantflow from a source checkout (not installed with the package): the speed benchmark
against onnxruntime (``bench``), the range-method comparison (``methods``) and the model-zoo project writer
(``zoo``, with the YOLO configurations in ``yolo``).  Run them from the repository root, e.g.
``python -m benchmarks.bench``."""
