"""``python -m quantflow``: the ``quantflow`` command (quantflow.cli)."""
import sys

from quantflow.cli import main

sys.exit(main())
