"""The build report: one self-contained HTML file with embedded PNG plots (``html``, ``plots``), and the
accuracy report as text (``text``)."""
