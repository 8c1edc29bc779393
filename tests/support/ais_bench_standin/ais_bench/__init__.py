"""A stand-in for Ascend's ais_bench inference tool (tests only): the package layout and the part of the Python API
``quantflow verify`` uses, with deploy.onnx run by the deploy interpreter in place of an .om on an NPU."""
