"""The pipeline: stage logic (stages), content-addressed artifacts (cache), the accuracy gate (gate)."""
