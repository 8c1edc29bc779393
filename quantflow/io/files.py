"""The names of the files a build writes that other parts read (the gate's reports, the build summary): one place,
for the stages, ``quantflow report`` / ``compare`` and a baseline's lookup."""
REPORT_JSON = "accuracy_report.json"     # the gate's report (every figure with its interval and verdict)
REPORT_TXT = "accuracy_report.txt"       # the same as text (the console's)
REPORT_HTML = "report.html"              # the build report
REPORT_DRAWS = "accuracy_draws.npz"      # each figure's bootstrap draws, so a later build can pair with them
JUNIT_XML = "gate_junit.xml"             # JUnit XML: one test case per gated figure
SUMMARY_MD = "gate_summary.md"           # Markdown for a CI job summary
LATEST_JSON = "latest.json"              # <build.output_dir>/latest.json: the current artifacts
TUNING_CHECK = "tuning_check.json"       # recover: its parameters' check on the tuning images (fallback step 0)
TUNING_CHECK_DRAWS = "tuning_check_draws.npz"  # ... and that check's bootstrap draws
