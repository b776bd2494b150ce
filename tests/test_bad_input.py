"""Bad input as a newcomer makes it: each case is a `tokenmill run` (against the session's Prefect server and Dask
cluster) that must exit non-zero with one clear message naming the file, field, source or key that is wrong, show
no traceback on the terminal, and publish nothing."""

from __future__ import annotations

import copy
import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from .conftest import EXAMPLES, TOKENIZERS

PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00\x1f\x15\xc4\x89"
GOOD = b"".join(json.dumps({"id": i, "text": f"document number {i}"}).encode() + b"\n" for i in range(20))


def truncated_gzip() -> bytes:
    whole = (EXAMPLES / "data" / "web_scrapinghub_aeb.jsonl.gz").read_bytes()
    return whole[: len(whole) // 2]


def parquet(table: pa.Table) -> bytes:
    out = io.BytesIO()
    pq.write_table(table, out)
    return out.getvalue()


@dataclass
class Case:
    files: dict[str, bytes] = field(default_factory=dict)  # under the test's directory
    config: dict = field(default_factory=dict)  # merged into the base config, a section at a time
    said: str = ""  # a regex the terminal must show
    code: int = 1  # 2: the config itself is invalid
    raw_config: str | None = None  # the config file's text as is
    local_cluster: bool = False  # the run's own LocalCluster, whose workers print on the run's terminal
    links: dict[str, str] = field(default_factory=dict)  # symbolic links under the test's directory: where each points


CASES = {
    "records without the text field": Case(
        files={"in/a.jsonl": b'{"id": 1, "body": "x"}\n{"id": 2, "body": "y"}\n'},
        said=r"all 2 records were rejected, the first at a\.jsonl line 1: text field 'text' missing or null \(its "
        r"fields: id, body\)",
    ),
    "a PNG named .jsonl": Case(files={"in/picture.jsonl": PNG}, said=r"picture\.jsonl line 1: "),
    "a JSON array in a file named for lines": Case(  # Alpaca's and LLaMA-Factory's datasets, renamed .jsonl
        files={
            "in/alpaca.jsonl": b'[\n  {"instruction": "a", "output": "b"},\n  {"instruction": "c", "output": "d"}\n]\n'
        },
        said=r"alpaca\.jsonl line 1: malformed JSON: .* \(a file of one JSON array is read as such where its name ends "
        r"in \.json, not \.jsonl\)",
    ),
    "a JSON array cut short, on_invalid: fail": Case(
        files={"in/cut.json": b'[\n  {"text": "a"},\n  {"text": "b'},
        config={"input": {"on_invalid": "fail"}},
        said=r"cut\.json: cannot be read after 1 records \(JSONArrayError: record 2: Unterminated string starting at "
        r"byte 30\)",
    ),
    "a source tree with a link to nothing": Case(
        files={"linux/init/main.c": b"int main;\n"},
        links={"linux/init/gone.c": "/nonexistent/gone.c"},
        config={"input": {"paths": ["{tmp}/linux/**/*"], "format": "text", "id_field": None}},
        said=r"input file .*/linux/init/gone\.c is a symbolic link to '/nonexistent/gone\.c', which does not exist: "
        r"remove the link",
    ),
    "paths that match nothing": Case(
        config={"input": {"paths": ["{tmp}/nowhere/*.jsonl"]}},
        said=r"input path '.*/nowhere/\*\.jsonl' matches no file",
    ),
    # with the default on_invalid (quarantine) the readable part is tokenized and the rest is one reject naming it
    "a truncated .jsonl.gz, on_invalid: fail": Case(
        files={"in/cut.jsonl.gz": truncated_gzip()},
        config={"input": {"on_invalid": "fail"}},
        said=r"cut\.jsonl\.gz: cannot be read after \d+ records \(EOFError",
    ),
    "an empty input file": Case(files={"in/empty.jsonl": b""}, said=r"empty\.jsonl"),
    "blank lines only": Case(files={"in/blank.jsonl": b"\n\n  \n"}, said=r"blank\.jsonl"),
    "a bad record with on_invalid: fail": Case(
        files={"in/a.jsonl": GOOD + b"{not json\n"},
        config={"input": {"on_invalid": "fail"}},
        said=r"a\.jsonl, line 21",
    ),
    "a Parquet file without the text column": Case(
        files={"in/t.parquet": parquet(pa.table({"body": ["x", "y"]}))},
        said=r"t\.parquet: no column 'text' in the Parquet schema \(its columns: body\): set input\.text_field to the "
        r"column that holds it",
        local_cluster=True,
    ),
    "a missing tokenizer file": Case(
        config={"tokenizer": {"path": "{tmp}/none/tokenizer.json"}}, said=r"none/tokenizer\.json"
    ),
    "an EOD token not in the vocabulary": Case(config={"tokenizer": {"eod": "<|nope|>"}}, said=r"<\|nope\|>"),
    "an output path under a regular file": Case(
        files={"afile": b"not a directory"}, config={"output": {"path": "{tmp}/afile/out"}}, said=r"afile"
    ),
    "a config that is not YAML": Case(raw_config="name: [unclosed\n", said=r"config\.yaml", code=2),
    "a shard size of 0": Case(
        config={"partition": {"shard_size": 0}}, said=r"partition\.shard_size: .*at least one byte", code=2
    ),
    "an unknown config key": Case(config={"pakc": {"mode": "concat"}}, said=r"pakc", code=2),
    "split fractions that do not sum to 1": Case(
        config={"split": {"train": 0.5, "val": 0.1}}, said=r"split fractions must be >= 0 and sum to 1", code=2
    ),
    "a mixture source that matches nothing": Case(
        config={
            "input": None,
            "sources": [
                {"name": "good", "input": {"paths": ["{tmp}/in/*.jsonl"]}, "weight": 1},
                {"name": "code", "input": {"paths": ["{tmp}/code/*.jsonl"]}, "weight": 1},
            ],
        },
        files={"in/a.jsonl": GOOD},
        said=r"source 'code': input path '.*/code/\*\.jsonl' matches no file",
    ),
    "a mixture source repeated past max_epochs": Case(
        config={
            "input": None,
            "sources": [
                {"name": "big", "input": {"paths": ["{tmp}/big/*.jsonl"]}, "weight": 0.5},
                {"name": "tiny", "input": {"paths": ["{tmp}/tiny/*.jsonl"]}, "weight": 0.5},
            ],
            "mix": {"total_tokens": 4_000},
        },
        files={"big/a.jsonl": GOOD * 100, "tiny/a.jsonl": GOOD[:100]},
        said=r"source 'tiny' would be drawn [\d.]+ times .* over mix.max_epochs 4",
    ),
    "a mixture source whose records are all invalid": Case(
        config={
            "input": None,
            "sources": [
                {"name": "good", "input": {"paths": ["{tmp}/in/*.jsonl"]}, "weight": 1},
                {"name": "broken", "input": {"paths": ["{tmp}/broken/*.jsonl"]}, "weight": 1},
            ],
        },
        files={"in/a.jsonl": GOOD, "broken/b.jsonl": b'{"id": 1, "body": "x"}\n'},
        said=r"source 'broken' made no train tokens: all 1 records were rejected, the first at b\.jsonl line 1",
    ),
}


def base_config(tmp: Path) -> dict:
    return {
        "name": "bad",
        "input": {"paths": [f"{tmp}/in/*"]},
        "split": {"train": 1.0},
        "tokenizer": {"path": str(TOKENIZERS / "gpt2" / "tokenizer.json")},
        "output": {"path": f"{tmp}/out"},
    }


def with_tmp(value, tmp: Path):
    """`value` with every "{tmp}" in its strings made the test's directory."""
    if isinstance(value, dict):
        return {k: with_tmp(v, tmp) for k, v in value.items()}
    if isinstance(value, list):
        return [with_tmp(v, tmp) for v in value]
    return value.replace("{tmp}", str(tmp)) if isinstance(value, str) else value


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_gets_one_clear_message_no_traceback_and_nothing_published(name, run_cli, tmp_path):
    case = CASES[name]
    for rel, data in case.files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(data)
    for rel, target in case.links.items():
        (tmp_path / rel).symlink_to(target)
    config = base_config(tmp_path)
    for section, value in with_tmp(case.config, tmp_path).items():
        if isinstance(value, dict) and isinstance(config.get(section), dict):
            config[section] = {**config[section], **value}
        elif value is None:
            config.pop(section, None)
        else:
            config[section] = copy.deepcopy(value)
    path = tmp_path / "config.yaml"
    path.write_text(case.raw_config if case.raw_config is not None else yaml.safe_dump(config))

    result = run_cli("run", str(path), check=False, local_cluster=case.local_cluster)
    terminal = result.stdout + result.stderr
    assert result.returncode == case.code, terminal[-3000:]
    error = terminal[terminal.rindex("error:") :]  # the run's last word, and what follows it
    assert re.search(case.said, error), terminal[-3000:]
    assert "Traceback" not in terminal, terminal[-5000:]
    published = tmp_path / "out" / "bad"
    assert not published.exists() or not any(published.glob("*/manifest.json")), list(published.iterdir())
