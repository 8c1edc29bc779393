"""quantflow: INT8 post-training quantization and offline-model build pipeline for Ascend NPUs."""
import os as _os

# MindSpore logs a great deal at WARNING level on the CPU backend; keep its C++ log to errors
# unless the user asked for something else.
_os.environ.setdefault("GLOG_v", "3")

__version__ = "0.1.0"
