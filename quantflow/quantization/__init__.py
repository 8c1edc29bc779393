"""Quantization: graph passes, observers and ranges, the Ascend INT8 scheme, and its parameters."""
