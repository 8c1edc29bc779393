"""The build report: one self-contained HTML file with embedded PNG plots."""
