"""Back-ends: what the device needs: the deploy graphs (ONNX, MindSpore), the FP32 MindIR/AIR export, the AIPP
config file, the atc conversion."""
