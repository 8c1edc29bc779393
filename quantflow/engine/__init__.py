"""Engines that run the graph IR: float (onnxruntime) and the Ascend INT8 emulation."""
