"""The ``quantflow`` command (``main``): build, init, list, report."""
from .main import main

__all__ = ["main"]
