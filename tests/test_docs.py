"""The documentation as a newcomer meets it: the README stays a short way in whose links land, and the
site under docs/ builds strictly (a broken page link or anchor, or a page left out of the nav, fails)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
README_MAX_LINES = 250
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_readme_is_a_short_way_in_that_starts_with_the_two_commands():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md is {len(lines)} lines; move detail to docs/"
    first_screen = "\n".join(lines[:10])
    assert "make serve" in first_screen and "make test" in first_screen


def test_every_readme_link_lands_on_a_file_and_an_anchor_that_exist():
    links = LINK.findall(README.read_text())
    assert any(link.startswith("docs/") for link in links)
    for link in links:
        if link.startswith(("http://", "https://")):
            continue
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.exists(), f"README links to {link}, which does not exist"
        if anchor:
            slugs = {_slug(h) for h in re.findall(r"^#+ (.+)$", target.read_text(), flags=re.MULTILINE)}
            assert anchor in slugs, f"README links to {link}: no such heading"


def test_every_docs_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f" {page.name}" in nav, f"docs/{page.name} is not in mkdocs.yml's nav"


def test_the_site_builds_strictly(tmp_path: Path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                            check=False, cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "WARNING" not in result.stderr, result.stderr
    assert (tmp_path / "site" / "architecture" / "index.html").exists()


def _slug(heading: str) -> str:
    """The anchor Python-Markdown's toc gives a heading (what mkdocs links to)."""
    text = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
    return re.sub(r"[-\s]+", "-", text)
