"""The README stays a five-minute read, the documentation site builds with --strict, every page under docs/ is in
its nav (and every nav entry is a page), the README's links lead somewhere, and the README's test command is what
CI runs."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml
from markdown.extensions.toc import slugify
from support.project import REPO

README = REPO / "README.md"
DOCS = REPO / "docs"
MAX_README_LINES = 250
# the test command as README.md writes it: one line of commands joined by " && "
TEST_COMMAND = re.compile(r"^\s*(python3 -m venv \.venv && .*)$", re.M)


def _nav_pages(entry) -> list[str]:
    if isinstance(entry, str):
        return [entry]
    if isinstance(entry, dict):
        return [p for v in entry.values() for p in _nav_pages(v)]
    if isinstance(entry, list):
        return [p for v in entry for p in _nav_pages(v)]
    return []


def _anchors(page: Path) -> set[str]:
    """The heading anchors mkdocs (Python-Markdown's toc) gives a page."""
    headings = re.findall(r"^#{1,6}\s+(.+?)\s*$", page.read_text(encoding="utf-8"), re.M)
    return {slugify(h.replace("`", ""), "-") for h in headings}


def test_the_readme_is_at_most_250_lines():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= MAX_README_LINES


def test_every_docs_page_is_in_the_nav_and_every_nav_entry_exists():
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    assert config["docs_dir"] == "docs"
    nav = _nav_pages(config["nav"])
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    assert sorted(set(nav)) == pages
    assert len(nav) == len(set(nav))   # each page once


def test_the_readme_test_command_is_what_ci_runs():
    """README.md and docs/getting-started.md give the command .ci/run runs, command for command."""
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    ci = ci[ci.index("python3 -m venv .venv"):]
    for page in (README, DOCS / "getting-started.md"):
        found = TEST_COMMAND.findall(page.read_text(encoding="utf-8"))
        assert len(found) == 1, page
        assert found[0].split(" && ") == ci, page


def test_the_readme_links_lead_to_pages_and_headings_that_exist():
    text = README.read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links
    broken = []
    for link in links:
        if re.match(r"[a-z]+://", link):
            continue
        target, _, anchor = link.partition("#")
        page = (README.parent / target) if target else README
        if not page.is_file() or (anchor and anchor not in _anchors(page)):
            broken.append(link)
    assert not broken


def test_the_site_builds_with_strict(tmp_path):
    """Broken links or anchors, a page left out of the nav, a docstring mkdocstrings cannot render: each fails it."""
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    site = tmp_path / "site"
    assert (site / "index.html").is_file()
    # the API reference is rendered from quantflow.api's docstrings
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    assert all(name in api for name in ("quantflow.api.build", "quantflow.api.quantize", "BuildResult"))
