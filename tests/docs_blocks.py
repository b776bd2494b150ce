"""The fenced code blocks of README.md and docs/, for the tests that check or run them (tests/test_docs.py, and the
trainers' tests for the snippets that need a trainer's package).

A block may be preceded by an HTML comment that says what it is (invisible on the site and on GitHub):

- `<!-- illustration -->`: shown, not run (an output, a tree of files, a sketch of another tool's config);
- `<!-- run by tests/test_x.py -->`: run there, where its packages are (the test reads it with `page_blocks`);
- `<!-- the file examples/x.yaml -->`: a YAML block that must say what that file says;
- `<!-- another tool's config -->`: a YAML block for another tool, which must parse.

Every other block is checked by tests/test_docs.py by its language."""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(\s*)(```|~~~)\s*([\w+-]*)\s*$")
MARKER = re.compile(r"^\s*<!--\s*(.*?)\s*-->\s*$")


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence, from 1
    lang: str  # "" where the fence names none
    code: str  # dedented as the page indents it
    marker: str | None  # the comment just above the fence, if any

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line} ({self.lang or 'no language'})"


def blocks(page: Path) -> list[Block]:
    found, lines, i = [], page.read_text().splitlines(), 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence, lang = opening.groups()
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == fence)
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = MARKER.match(before)
        code = textwrap.dedent("\n".join(lines[i + 1 : end])) + "\n"
        found.append(Block(page, i + 1, lang.lower(), code, marker.group(1) if marker else None))
        i = end + 1
    return found


def all_blocks() -> list[Block]:
    return [block for page in PAGES for block in blocks(page)]


def page_blocks(page: str, lang: str = "python") -> list[Block]:
    """A page's blocks of a language (`page` relative to the repository, e.g. "docs/chat.md")."""
    return [block for block in blocks(ROOT / page) if block.lang == lang]


def run_python(block: Block, replacements: dict[str, str], namespace: dict | None = None) -> dict:
    """Run a Python block, each key of `replacements` in its text replaced first (the placeholders and example
    paths of a page, by the real paths of a test's dataset); every key must occur. Return its namespace."""
    code = block.code
    for placeholder in replacements:
        assert placeholder in code, f"{block}: no {placeholder!r} to replace in\n{code}"
    for placeholder in sorted(replacements, key=len, reverse=True):
        code = code.replace(placeholder, replacements[placeholder])
    namespace = {"__name__": "__docs__"} if namespace is None else namespace
    exec(compile(code, str(block), "exec"), namespace)  # noqa: S102 (the repository's own docs)
    return namespace
