"""doit task definitions of the quantflow pipeline (loaded by dodo.py)."""
