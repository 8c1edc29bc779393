"""``python -m quantflow.cli``: the ``quantflow`` command."""
import sys

from quantflow.cli.main import main

sys.exit(main())
