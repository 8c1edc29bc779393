"""quantflow's graph IR: the one representation every stage works on."""
from .graph import Graph, Node, TensorInfo

__all__ = ["Graph", "Node", "TensorInfo"]
