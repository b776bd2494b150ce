"""The docs cannot drift: the site builds strictly, the configuration reference is the model's, the README's
links resolve. Seconds, no servers."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tokenmill.config_reference import COMMAND, reference

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def test_the_docs_site_builds_strictly(tmp_path):
    """`mkdocs build --strict`: a link to a missing page or anchor, or a page left out of the nav, fails."""
    pytest.importorskip("mkdocs", reason="mkdocs is in the test extra: pip install -e '.[test]'")
    pytest.importorskip("material", reason="mkdocs-material is in the test extra: pip install -e '.[test]'")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=120,
    )
    problems = [line for line in built.stderr.splitlines() if "WARNING" in line or "ERROR" in line]
    assert built.returncode == 0, "mkdocs build --strict failed:\n" + "\n".join(problems or [built.stderr[-3000:]])
    assert (tmp_path / "configuration" / "index.html").is_file()


def test_the_configuration_reference_is_the_models():
    committed = (ROOT / "docs" / "configuration.md").read_text()
    assert committed == reference(), f"docs/configuration.md is out of date with tokenmill/config.py: run `{COMMAND}`"


def test_every_relative_link_in_the_readme_resolves():
    """Files exist, and anchors name a heading of the file (as GitHub makes them), the README's own included."""
    broken = []
    for target in _links(README.read_text()):
        path, _, anchor = target.partition("#")
        file = (README.parent / path).resolve() if path else README
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file.read_text()):
            broken.append(f"{target}: {file.relative_to(ROOT)} has no heading with anchor #{anchor}")
    assert not broken, "README.md links that do not resolve:\n" + "\n".join(broken)


def test_the_readme_stays_a_newcomers_page():
    text = README.read_text()
    assert "make demo" in text and "make test" in text
    lines = len(text.splitlines())
    assert lines <= 330, f"README.md has {lines} lines: move reference material and measurements to docs/"


def _without_code(markdown: str) -> str:
    """The text outside fenced code blocks and code spans, where a `[x](y)` is not a link."""
    return re.sub(r"`[^`\n]*`", "", _without_fences(markdown))


def _links(markdown: str) -> list[str]:
    targets = re.findall(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", _without_code(markdown))
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.I)]  # not http:, mailto:, ...


def _anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown file: lowercased, punctuation dropped, each space a
    hyphen, a repeated one suffixed -1, -2, ..."""
    seen: dict[str, int] = {}
    anchors = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", _without_fences(markdown), flags=re.M):
        text = re.sub(r"[`*]|<[^>]+>", "", re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading))
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def _without_fences(markdown: str) -> str:
    """The text outside fenced code blocks (where a `# comment` is no heading)."""
    return re.sub(r"^(```|~~~).*?^\1", "", markdown, flags=re.M | re.S)
