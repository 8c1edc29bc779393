"""Engines that run the graph IR with onnxruntime: its lowering to ONNX (``lowering``), batched sessions
(``runner``), the Ascend INT8 emulation (``int8_emulator``), AIPP as the device computes it (``aipp``) and
sharded work (``shard``)."""
