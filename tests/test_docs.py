"""The docs cannot drift: the site builds strictly, the configuration reference is the model's, the README's
links resolve; every example on a page is checked or run (YAML configs by the config model, command lines against
the command line's own options, the Python snippets against a dataset made by running the flow from Python as
docs/index.md shows), every message troubleshooting.md quotes is in the code, every table of figures names its
command, machine and date, every benchmark command a page quotes has the options it gives, and tests/data is as
its README says. Under a minute."""

from __future__ import annotations

import functools
import itertools
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from tokenmill.commands.config_reference import COMMAND, reference

from .docs_blocks import PAGES, all_blocks, page_blocks, run_python

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


# Every example on a page is checked or run (tests/docs_blocks.py says how a block that is not says so).


def test_every_block_is_checked_run_or_marked():
    """Each fenced block of README.md and docs/ is one this module checks (YAML, shell, a command list) or runs
    (Python), or is marked: an illustration, another tool's config, run by a named test."""
    unchecked = []
    for block in all_blocks():
        if block.marker is not None:
            assert _known_marker(block), f"{block}: unknown marker <!-- {block.marker} -->"
        elif block.lang not in ("yaml", "bash", "sh", "python") and not _is_command_list(block):
            unchecked.append(str(block))
    assert not unchecked, "blocks neither checked nor marked (<!-- illustration --> for one that is not run):\n" + (
        "\n".join(unchecked)
    )


def test_every_yaml_block_is_a_config_the_model_loads_or_the_file_it_names():
    """A YAML block is a tokenmill config (or a part of one: its sections are checked inside a minimal config),
    `<!-- the file examples/x.yaml -->` says what that file says, and another tool's config at least parses."""
    from tokenmill.config import TokenmillConfig

    for block in (b for b in all_blocks() if b.lang == "yaml"):
        data = yaml.safe_load(block.code)
        if block.marker and block.marker.startswith("the file "):
            named = ROOT / block.marker.removeprefix("the file ")
            assert data == yaml.safe_load(named.read_text()), f"{block} is not {named.relative_to(ROOT)}"
        if block.marker == ANOTHER_TOOL:
            assert isinstance(data, dict), block
            continue
        if block.marker and block.marker.startswith("run by "):
            continue
        whole = data if "name" in data else _inside_a_minimal_config(data)
        try:
            TokenmillConfig.model_validate(whole)
        except ValueError as e:
            pytest.fail(f"{block} is not a tokenmill config:\n{e}")


def test_every_example_config_is_valid():
    """examples/*.yaml: what `tokenmill check` accepts, and each a page names."""
    from tokenmill.config import load_config

    pages = "".join(page.read_text() for page in PAGES)
    for example in sorted((ROOT / "examples").glob("*.yaml")):
        load_config(example)
        assert f"examples/{example.name}" in pages, f"examples/{example.name} is on no page"


def test_every_command_line_names_a_command_and_options_that_exist():
    """Shell blocks: `tokenmill` lines parse against the command line's own commands and options; `make` names a
    target of the Makefile; `pip install` names extras pyproject.toml has; a benchmark's options are its own."""
    wrong = []
    for block in all_blocks():
        if block.marker or block.lang not in ("bash", "sh"):
            continue
        for line in _shell_lines(block.code):
            if problem := _command_problem(line):
                wrong.append(f"{block}: {' '.join(line)}: {problem}")
    assert not wrong, "\n".join(wrong)


def test_every_tokenmill_command_quoted_in_the_text_exists_with_its_options():
    """`tokenmill ...` in a code span of a page's text: a command and options the command line has (a group named
    alone, `tokenmill server`, is a name)."""
    wrong = []
    for page in PAGES:
        for span in re.findall(r"`(tokenmill [^`]+)`", _without_fences(page.read_text())):
            args = shlex.split(span)[1:]
            if _command(args) is None or not getattr(_command(args), "commands", None):
                if problem := _tokenmill_problem(args):
                    wrong.append(f"{page.relative_to(ROOT)}: `{span}`: {problem}")
    assert not wrong, "\n".join(wrong)


def test_every_benchmark_command_quoted_in_the_text_exists_with_its_options():
    """`bench/x.py --option ...` in a code span of a page's text (how a figure says what produced it): a script of
    bench/ and options it has (`[...]` marks an optional part)."""
    wrong = []
    for page in PAGES:
        spans = re.findall(r"`(?:(?:\.venv/bin/)?python )?(bench/\w+\.py[^`]*)`", _without_fences(page.read_text()))
        for span in spans:
            if problem := _command_problem(["python", *shlex.split(span.replace("[", "").replace("]", ""))]):
                wrong.append(f"{page.relative_to(ROOT)}: `{span}`: {problem}")
    assert not wrong, "\n".join(wrong)


def test_the_command_lists_name_every_command_and_each_of_its_options():
    """The lists of commands in README.md and docs/index.md: every command of `tokenmill`, each with all of its
    options, and none it does not have."""
    wrong = []
    lists = [block for block in all_blocks() if _is_command_list(block)]
    assert {block.page.name for block in lists} >= {"README.md", "index.md"}
    for block in lists:
        listed = set()
        for line in block.code.splitlines():
            if not line.startswith("tokenmill "):
                continue
            usage = re.split(r"\s{2,}", line)[0].split()[1:]
            words = list(itertools.takewhile(lambda w: re.fullmatch(r"[a-z][a-z|]*", w), usage))
            names = [[]]
            for word in words:  # `server start|stop|status`: three commands
                names = [[*n, part] for n in names for part in word.split("|")]
            options = set(re.findall(r"--[a-z][a-z-]*", " ".join(usage)))
            for name in names:
                command = _command(name)
                if command is None:
                    wrong.append(f"{block}: tokenmill {' '.join(name)}: no such command")
                    continue
                listed.add(tuple(name))
                have = _options(command) - {"--help"}
                if name == []:
                    continue  # the group's own options, each on a line of its own
                if missing := have - options:
                    wrong.append(f"{block}: tokenmill {' '.join(name)} lacks {sorted(missing)}")
                if unknown := options - have:
                    wrong.append(f"{block}: tokenmill {' '.join(name)} has no {sorted(unknown)}")
        if missing := {name for name in _all_commands() if name not in listed}:
            wrong.append(f"{block}: no line for {sorted(' '.join(n) for n in missing)}")
    assert not wrong, "\n".join(wrong)


def test_every_message_the_pages_quote_is_one_the_code_prints():
    """The messages troubleshooting.md's tables quote (first column, with placeholders: `...`, FILE, N) and those
    guarantees.md's table of faults gives in italics (with real paths): each piece between the placeholders and paths
    is in tokenmill's source (tokenmill/, flows/, tasks/), where one of its words may be a value the code fills in
    (`tokenizer.eod` for `tokenizer.{key}`); the system's words for an error the code passes on are placeholders."""
    from tokenmill.io.storage import DISK_ERRORS

    source, system = _source_text(), "|".join(re.escape(os.strerror(code)) for code in DISK_ERRORS)
    docs = ROOT / "docs"
    messages = _quoted_messages(docs / "troubleshooting.md") + _italic_messages(docs / "guarantees.md")
    assert len(messages) > 20, messages
    absent = [
        f"{message!r}: {piece!r}"
        for message in messages
        for piece in (p.strip("'\"<>()/:,; ") for p in re.split(f"{PLACEHOLDER}|{system}", message))
        if len(piece) >= 6 and not _in_source(piece, source)
    ]
    assert not absent, "the pages quote messages the code does not print:\n" + "\n".join(absent)


def test_every_python_block_runs(docs_run, monkeypatch):
    """Each Python block of the pages runs against the dataset the flow made from Python (`docs_run`, the demo),
    from the directory it ran in, its placeholders (`<version>`) and the README's example path replaced; a block
    that needs a trainer's package is run by that trainer's test (`<!-- run by ... -->`)."""
    build, version = docs_run
    monkeypatch.chdir(build.parent.parent)
    replacements = {"README.md": {"out/wiki": "out/demo"}, "outputs.md": {"<version>": version}}
    ran = 0
    for block in all_blocks():
        if block.lang != "python" or block.marker is not None or "corpus_to_tokens" in block.code:
            continue
        run_python(block, {k: v for k, v in replacements.get(block.page.name, {}).items() if k in block.code})
        ran += 1
    assert ran >= 4


def test_every_command_that_reads_runs_as_the_page_gives_it(docs_run):
    """Each `tokenmill check`, `inspect` and `diff` line of a shell block runs as it is, from the directory the flow
    ran in from Python (the demo's `out/demo`), with the README's minimal config as the `wiki.yaml` the pages check."""
    build, _ = docs_run
    where = build.parent.parent
    (readme_config,) = [b.code for b in all_blocks() if b.page == README and b.lang == "yaml"]
    (where / "wiki.yaml").write_text(readme_config)
    ran = []
    for block in all_blocks():
        if block.marker or block.lang not in ("bash", "sh"):
            continue
        for words in _shell_lines(block.code):
            if Path(words[0]).name == "tokenmill" and words[1] in ("check", "inspect", "diff"):
                done = subprocess.run(
                    [str(Path(sys.executable).with_name("tokenmill")), *words[1:]],
                    cwd=where, capture_output=True, text=True, timeout=120,
                )  # fmt: skip
                assert done.returncode == 0, f"{block}: {' '.join(words)}:\n{done.stdout}\n{done.stderr}"
                ran.append(words[1])
    assert {"check", "inspect"} <= set(ran), ran


def test_every_block_run_by_another_test_is_read_by_it():
    """`<!-- run by tests/test_x.py -->`: that test reads the page's blocks (`page_blocks("docs/page.md")`)."""
    for block in all_blocks():
        if block.marker and block.marker.startswith("run by "):
            test = ROOT / block.marker.removeprefix("run by ").split("::")[0]
            page = str(block.page.relative_to(ROOT))
            assert f'page_blocks("{page}"' in test.read_text(), f"{block}: {test.name} does not run {page}'s blocks"


@pytest.fixture(scope="module")
def docs_run(prefect_api, dask_cluster, tmp_path_factory) -> tuple[Path, str]:
    """The flow run from Python as docs/index.md shows (the demo, on the session's Prefect server and Dask cluster),
    in a directory of its own that sees the repository's examples/: the build it made there, and its version."""
    (block,) = [b for b in page_blocks("docs/index.md") if "corpus_to_tokens" in b.code]
    where = tmp_path_factory.mktemp("docs-run")
    (where / "examples").symlink_to(ROOT / "examples")
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "TOKENMILL_DASK_ADDRESS": dask_cluster}
    ran = subprocess.run(
        [sys.executable, "-c", block.code], cwd=where, env=env, capture_output=True, text=True, timeout=300
    )
    assert ran.returncode == 0, f"{block} failed:\n{ran.stdout}\n{ran.stderr[-5000:]}"
    build = where / "out" / "demo"
    version = (build / "demo" / "LATEST").read_text().strip()
    assert f"{build}/demo/{version}" in ran.stdout, ran.stdout  # what the snippet prints: where it published
    return build, version


ANOTHER_TOOL = "another tool's config"
# `...`, FILE, N, CONFIG.yaml, a path: what the message fills in
PLACEHOLDER = r"\.\.\.|\b[A-Z][A-Z_]*\b(?:\.yaml)?|/[\w./-]+"


def _known_marker(block) -> bool:
    marker = block.marker
    if marker == "illustration" or marker.startswith("run by tests/"):
        return True
    return block.lang == "yaml" and (marker == ANOTHER_TOOL or marker.startswith("the file examples/"))


def _inside_a_minimal_config(section: dict) -> dict:
    base = {"name": "docs", "tokenizer": {"path": "tokenizer.json"}, "output": {"path": "out/docs"}}
    return base | ({} if "sources" in section else {"input": {"paths": ["docs.jsonl"]}}) | section


def _is_command_list(block) -> bool:
    lines = [line for line in block.code.splitlines() if line.strip()]
    return block.lang == "" and block.marker is None and bool(lines) and lines[0].startswith("tokenmill ")


def _shell_lines(code: str) -> list[list[str]]:
    """The shell commands of a block: continuations joined, comments and `VAR=value` prefixes dropped."""
    lines = []
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        while words and re.match(r"[A-Z_]+=", words[0]):  # a quoted value is one word: VAR="$(mktemp -d)"
            words.pop(0)
        if words:
            lines.append(words)
    return lines


@functools.cache
def _bench_options(script: str) -> set[str]:
    """The options a bench/ script declares, in its own text or in the bench/ modules it takes its parser from
    (bench/dpo.py takes bench/chat.py's). Read, not run: most scripts stop at once without ../shared."""
    text = (ROOT / script).read_text()
    helpers = [ROOT / "bench" / f"{name}.py" for name in re.findall(r"^from (\w+) import", text, flags=re.M)]
    text += "".join(helper.read_text() for helper in helpers if helper.is_file())
    declared = re.findall(r"add_argument\(\s*\"(--[a-z][a-z0-9-]*)\"", text)
    # and the flags of bench/chat.py's `arguments(..., flag="help")`
    calls = re.findall(r"\barguments\((.*?)\)\s*$", text, flags=re.S | re.M)
    flags = [flag for call in calls for flag in re.findall(r"\b(\w+)=\"", call)]
    return set(declared) | {f"--{flag.replace('_', '-')}" for flag in flags}


def _command_problem(words: list[str]) -> str | None:
    program = Path(words[0]).name
    if program == "tokenmill":
        return _tokenmill_problem(words[1:])
    if program == "make":
        targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), flags=re.M))
        return next((f"no target {t}" for t in words[1:] if t not in targets), None)
    if program in ("python", "python3") and words[1:] and words[1].startswith("bench/"):
        if not (ROOT / words[1]).is_file():
            return f"no {words[1]}"
        options = _bench_options(words[1])
        return next((f"{words[1]} has no {w}" for w in words[2:] if w.startswith("--") and w not in options), None)
    if program == "dask":
        return _dask_problem(words[1:])
    if re.fullmatch(r"python3(\.\d+)?", program) and words[1:3] == ["-m", "venv"]:
        return None
    if program == "pip" and words[1:2] == ["install"]:
        extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
        named = {e for w in words for e in re.findall(r"\[([\w,-]+)\]", w) for e in e.split(",")}
        return f"no extras {sorted(named - extras)}" if named - extras else None
    if program == "prefect" and "--pool" in words:
        pool = words[words.index("--pool") + 1]
        return None if pool in (ROOT / "deployments" / "prefect.yaml").read_text() else f"no work pool {pool}"
    if program in ("export", "kill", "cd"):
        return None
    return "a command this test does not know: mark the block <!-- illustration --> or teach the test"


def _dask_problem(args: list[str]) -> str | None:
    """`dask worker|scheduler ...`: options the command has, preloads that are modules of the repository."""
    from distributed.cli import dask_scheduler, dask_worker

    command = {"worker": dask_worker.main, "scheduler": dask_scheduler.main}.get(args[0] if args else "")
    if command is None:
        return "not dask worker or dask scheduler"
    unknown = {a.split("=")[0] for a in args if a.startswith("--")} - _options(command)
    preloads = [args[i + 1] for i, a in enumerate(args[:-1]) if a in ("--preload", "--preload-nanny")]
    missing = [p for p in preloads if not (ROOT / (p.replace(".", "/") + ".py")).is_file()]
    return f"no option {sorted(unknown)}" if unknown else f"no module {missing}" if missing else None


def _tokenmill_problem(args: list[str]) -> str | None:
    name = []
    for arg in args:  # the command's words, then its arguments
        if arg.startswith("-") or _command([*name, arg]) is None:
            break
        name.append(arg)
    command = _command(name)
    if getattr(command, "commands", None) and not any(a in ("--help", "--version") for a in args):
        return "no such command"
    unknown = {a.split("=")[0] for a in args if a.startswith("--")} - _options(command)
    return f"no option {sorted(unknown)}" if unknown else None


def _command(name: list[str]):
    """The click command of `tokenmill NAME...`, None where there is none."""
    import typer.main

    from flows.cli import app

    command = typer.main.get_command(app)
    for word in name:
        command = getattr(command, "commands", {}).get(word)
        if command is None:
            return None
    return command


def _options(command) -> set[str]:
    import click

    return {o for p in command.get_params(click.Context(command)) for o in p.opts if o.startswith("--")}


def _all_commands() -> list[tuple[str, ...]]:
    group = _command([])
    names = []
    for name, command in group.commands.items():
        sub = getattr(command, "commands", None)
        names += [(name, s) for s in sub] if sub else [(name,)]
    return names


def _source_text() -> str:
    """tokenmill's Python source, each implicit concatenation of string literals joined (a message cut across
    lines reads as one), and each f-string's replacement field a NUL."""
    text = "".join(p.read_text() for d in ("tokenmill", "flows", "tasks") for p in sorted((ROOT / d).rglob("*.py")))
    return re.sub(r"\{[^{}\n]*\}", "\0", re.sub(r"\"\s*\n\s*(?:rf|fr|f|r)?\"", "", text))


def _in_source(piece: str, source: str) -> bool:
    """`piece` is in `source` as it is, or with one of its words a replacement field; quotes optional (`!r`)."""
    tokens = re.findall(r"\w+|\W", piece)
    words = [i for i, t in enumerate(tokens) if t[0].isalnum()]
    for wild in [None, *words]:
        pattern = "".join("\0" if i == wild else "['\"]?" if t in "'\"" else re.escape(t) for i, t in enumerate(tokens))
        if re.search(pattern, source):
            return True
    return False


def _quoted_messages(page: Path) -> list[str]:
    """The message each row of a page's tables of messages quotes in its first cell (its first code span)."""
    messages, quoting = [], False
    for line in _without_fences(page.read_text()).splitlines():
        cells = line.split("|")
        if len(cells) < 3:
            quoting = False
        elif re.match(r"\s*(message|the shard's error)\s*$", cells[1]):
            quoting = True
        elif quoting and (quoted := re.search(r"`([^`]+)`", cells[1])):
            messages.append(quoted.group(1))
    return messages


def test_the_formats_table_is_how_the_readers_name_files():
    """inputs.md's table of formats: each file name ending it lists is read as that row says (`format_of`), those
    compressed decompressed, and every ending the readers know is in it."""
    from tokenmill.io.names import COMPRESSIONS, DATA_ENDINGS, compression_of, format_of

    rows = re.findall(r"^\| (.+?) \| (.+?) \|", (ROOT / "docs" / "inputs.md").read_text(), flags=re.M)
    formats = dict(rows[rows.index(("input", "read as")) + 1 :][:6])
    kinds = ["jsonl", "jsonl", "jsonl", "parquet", "arrow", "text"]  # the second: a .json file of one array
    for (names, _), kind in zip(formats.items(), kinds, strict=True):
        for ending in (e for e in re.findall(r"`(\.[\w.]+)`", names) if e not in COMPRESSIONS):
            assert format_of(f"x{ending}") == kind, f"inputs.md: x{ending} is read as {format_of(f'x{ending}')}"
            compressed = any(ending.endswith(c) for c in COMPRESSIONS)
            assert (compression_of(f"x{ending}") is not None) == compressed, ending
    listed = " ".join(formats)
    assert all(f"`{c}`" in listed for c in COMPRESSIONS), f"inputs.md lacks one of {list(COMPRESSIONS)}"
    assert all(f"`{e}`" in listed for e in DATA_ENDINGS), f"inputs.md lacks one of {DATA_ENDINGS}"


def test_the_readmes_layout_names_every_example_and_benchmark():
    (layout,) = [b.code for b in all_blocks() if b.page == README and b.code.startswith("tokenmill/ ")]
    named = set(re.findall(r"[\w-]+\.(?:yaml|py)", layout))
    files = {p.name for p in (ROOT / "examples").glob("*.yaml")} | {p.name for p in (ROOT / "bench").glob("*.py")}
    assert files <= named, f"README.md's layout lacks {sorted(files - named)}"


def test_cluster_md_gives_every_setting_tokenmill_hands_its_workers():
    """The settings tokenmill's own workers get (`WORKER_ENVIRONMENT`), each with its value, in docs/cluster.md's
    table of what to set on workers started by hand."""
    from flows.dask_settings import WORKER_ENVIRONMENT

    page = (ROOT / "docs" / "cluster.md").read_text()
    missing = [f"{k}={v}" for k, v in WORKER_ENVIRONMENT.items() if f"{k}={v}" not in page.replace('"', "")]
    assert not missing, f"docs/cluster.md lacks {missing}"


def _italic_messages(page: Path) -> list[str]:
    """The messages a page's table rows give in italics (`*...*`, at least a few words)."""
    rows = [line for line in _without_fences(page.read_text()).splitlines() if line.startswith("|")]
    return [m for row in rows for m in re.findall(r"(?<![*\w])\*([^*|]{20,}?)\*(?![*\w])", row)]


FIGURE_CELL = re.compile(r"^\**[\d.,]+(\s*-\s*[\d.,]+)?\s*(ms|s|min|h|MB/s|GB/s|KB|MB|GB|GiB|MiB|Mtokens/s|%|x)?\**$")
PROVENANCE = {
    "a date": re.compile(r"\b20\d\d-\d\d-\d\d\b"),
    "a command": re.compile(r"bench/\w+\.py|`tokenmill \w+|`make \w+`|by hand|no bench script"),
    "a machine": re.compile(r"\b2-core\b|\b2 cores\b|machine of \[Performance\]"),
}


def test_every_table_of_figures_names_its_command_machine_and_date():
    """A table with a cell that is a figure alone (`6.7 s`, `0.58`, `99.99%`, `330 MB/s`) is a measurement: its
    section (heading to heading) must give a date, the command (a bench/ script, a tokenmill or make command, or
    `by hand`/`no bench script` for a one-off) and the machine. Figures in prose are not checked here: the pages
    give theirs beside them. configuration.md, generated from the model, has defaults, not figures."""
    missing = []
    for page in (p for p in PAGES if p.name != "configuration.md"):
        for section in _sections(page.read_text()):
            rows = [row for row in section.splitlines() if row.startswith("|")]
            cells = [cell.strip() for row in rows for cell in row.strip("|").split("|")]
            if not any(FIGURE_CELL.match(c) and re.search(r"\d", c) for c in cells):
                continue
            lacks = [what for what, pattern in PROVENANCE.items() if not pattern.search(section)]
            if lacks:
                missing.append(f"{page.relative_to(ROOT)}, {section.splitlines()[0]!r}: lacks {', '.join(lacks)}")
    assert not missing, "tables of figures without their provenance:\n" + "\n".join(missing)


def _sections(markdown: str) -> list[str]:
    """The page cut at its headings (a `#` inside a fenced block is a shell comment, not a heading)."""
    sections, fenced = [[]], False
    for line in markdown.splitlines():
        fenced ^= line.lstrip().startswith(("```", "~~~"))
        if line.startswith("#") and not fenced:
            sections.append([])
        sections[-1].append(line)
    return ["\n".join(lines) for lines in sections if lines]


def test_the_tests_data_is_as_its_readme_says():
    """tests/data/README.md: every folder of data has its SOURCE.md, every file is under 5 MB, and the whole stays
    tens of MB (what a clone carries for its tests)."""
    data = ROOT / "tests" / "data"
    folders = [folder for kind in data.iterdir() if kind.is_dir() for folder in kind.iterdir() if folder.is_dir()]
    assert [f.relative_to(data) for f in folders if not (f / "SOURCE.md").is_file()] == []
    files = [f for f in data.rglob("*") if f.is_file()]
    assert [(f.relative_to(data), f.stat().st_size) for f in files if f.stat().st_size >= 5_000_000] == []
    assert sum(f.stat().st_size for f in files if not f.is_symlink()) < 100_000_000
