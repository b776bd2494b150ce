"""Input handling end to end through the CLI: bad records under both policies, and the global shuffle."""

from __future__ import annotations

import hashlib
import json
import re
import shutil

import pyarrow.parquet as pq

from .conftest import EXAMPLES, dataset_files, read_jsonl
from .test_bad_input import truncated_gzip

BAD_LINES = [
    b'{"id": "broken", "text": \n',
    b'{"id": "latin1", "text": "caf\xe9"}\n',
    b'{"id": "no-text", "body": "x"}\n',
]


def corpus_with_bad_lines(tmp_path):
    data = tmp_path / "data"
    shutil.copytree(EXAMPLES / "data", data)
    with open(data / "wikitext2_raw_test.jsonl", "ab") as f:
        f.writelines(BAD_LINES)
    return data


def test_quarantine_counts_and_keeps_every_bad_record(run_cli, tmp_path):
    data = corpus_with_bad_lines(tmp_path)
    out = tmp_path / "out"
    run_cli("run", "examples/gpt2.yaml", "--set", f"input.paths=[{data}/*.jsonl*]", "--set", f"output.path={out}")
    manifest = json.loads((out / "manifest.json").read_text())
    good = sum(len(read_jsonl(p)) for p in (EXAMPLES / "data").glob("*.jsonl*"))
    assert manifest["counts"]["documents_in"] == good + 3
    assert (manifest["counts"]["documents_out"], manifest["counts"]["documents_rejected"]) == (good, 3)
    rejects = [
        json.loads(line) for p in sorted((out / "rejects").glob("*.jsonl")) for line in p.read_text().splitlines()
    ]
    assert [(r["file"], r["line"]) for r in rejects] == [("wikitext2_raw_test.jsonl", n) for n in (63, 64, 65)]
    assert [r["reason"].split(":")[0] for r in rejects] == [
        "malformed JSON",
        "invalid UTF-8 at byte 29",
        "text field 'text' missing or null",
    ]
    assert {"rejects"} <= {f["kind"] for f in manifest["files"]}


def test_a_truncated_compressed_file_is_quarantined_and_named_in_the_summary(run_cli, tmp_path):
    """Under the default policy (quarantine), a .jsonl.gz cut short keeps the documents before the cut, the rest
    of it is one reject of the whole file (line 0), and the run's summary names the file, what was wrong and where
    its reject is, beside the count."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "cut.jsonl.gz").write_bytes(truncated_gzip())
    out = tmp_path / "out"
    result = run_cli("run", "examples/gpt2.yaml", "--set", f"input.paths=[{data}/*]", "--set", f"output.path={out}")
    counts = json.loads((out / "manifest.json").read_text())["counts"]
    kept = counts["documents_out"]
    assert kept > 0 and counts["documents_rejected"] == 1
    (reject,) = [json.loads(line) for p in (out / "rejects").glob("*.jsonl") for line in p.read_text().splitlines()]
    assert (reject["file"], reject["line"]) == ("cut.jsonl.gz", 0)
    said = re.search(
        r"quarantined: cut\.jsonl\.gz: cannot be read after (\d+) records \((.*)\) \((.*)\)", result.stdout
    )
    assert said, result.stdout
    assert int(said[1]) == kept and said[2].startswith("EOFError") and said[3] == "rejects/shard-00000.jsonl"


def test_fail_policy_stops_the_run_naming_file_and_line(run_cli, tmp_path):
    data = corpus_with_bad_lines(tmp_path)
    out = tmp_path / "out"
    result = run_cli(
        "run", "examples/gpt2.yaml", "--set", f"input.paths=[{data}/*.jsonl*]", "--set", f"output.path={out}",
        "--set", "input.on_invalid=fail", check=False,
    )  # fmt: skip
    assert result.returncode == 1
    assert "wikitext2_raw_test.jsonl, line 63: malformed JSON" in result.stdout
    assert not (out / "manifest.json").exists()


def test_rejects_in_a_cut_file_are_numbered_by_their_line_in_the_file(run_cli, tmp_path):
    """With one split and no ids to hash, the partition does not count a cut file's lines: each piece's rejects
    and documents are written with lines (and ids `<file>:<line>`) counted from the piece's start, then numbered by
    their line in the file once every piece is read, and each shard's marker commits the numbered files. Under `fail`
    the message says where the count starts. Two splits hash ids `<file>:<line>`: the plan is made again, counted,
    and the rejects and documents are the same."""
    good = (EXAMPLES / "data" / "wikitext2_raw_test.jsonl").read_bytes().splitlines(keepends=True)
    lines = [*good[:30], BAD_LINES[0], *good[30:45], BAD_LINES[1], *good[45:], BAD_LINES[2]]
    bad_at = [lines.index(bad) + 1 for bad in BAD_LINES]
    data = tmp_path / "data"
    data.mkdir()
    (data / "big.jsonl").write_bytes(b"".join(lines))
    out = tmp_path / "out"
    args = ["run", "examples/gpt2.yaml", "--set", f"input.paths=[{data}/*]", "--set", f"output.path={out}",
            "--set", "partition.shard_size=200KB", "--set", "input.id_field=null"]  # fmt: skip

    def rejects() -> list[dict]:
        return [
            json.loads(line) for p in sorted((out / "rejects").glob("*.jsonl")) for line in p.read_text().splitlines()
        ]

    def documents() -> list[tuple[int, str]]:  # (line, id) of every document
        tables = (out / "megatron").glob("*/shard-*.docs.parquet")
        return sorted(
            (row["line"], row["id"]) for p in tables for row in pq.read_table(p, columns=["id", "line"]).to_pylist()
        )

    kept = [(n, f"big.jsonl:{n}") for n in range(1, len(lines) + 1) if n not in bad_at]
    run_cli(*args, "--set", "split={train: 1.0}")
    assert documents() == kept  # each id once, its file's line

    def first_lines() -> list:
        return [shard["pieces"][0]["first_line"] for shard in json.loads((out / "plan.json").read_text())["shards"]]

    assert len(first_lines()) > 4 and first_lines()[0] == 1 and set(first_lines()[1:]) == {None}
    assert [(r["file"], r["line"]) for r in rejects()] == [("big.jsonl", n) for n in bad_at]
    assert [r["record"].encode() for r in rejects()] == [
        bad.rstrip(b"\n").decode("utf-8", "replace").encode() for bad in BAD_LINES
    ]
    for marker in (out / "_commits" / "tokenize").glob("*.json"):
        recorded = json.loads(marker.read_text())["files"]
        for rel, file in recorded.items():
            assert hashlib.sha256((out / rel).read_bytes()).hexdigest() == file["sha256"], rel

    run_cli(*args)  # examples/gpt2.yaml's two splits
    assert None not in first_lines()
    assert [(r["file"], r["line"]) for r in rejects()] == [("big.jsonl", n) for n in bad_at]
    assert documents() == kept

    failed = run_cli(*args, "--set", f"output.path={tmp_path / 'failed'}", "--set", "input.on_invalid=fail",
                     "--set", "split={train: 1.0}", check=False)  # fmt: skip
    said = re.findall(r"big\.jsonl, line (\d+): .*? \(lines counted from byte (\d+), where this shard", failed.stdout)
    assert failed.returncode == 1 and said, failed.stdout
    text = b"".join(lines)
    for line, start in said:
        assert text[int(start) :].splitlines(keepends=True)[int(line) - 1] in BAD_LINES


def test_a_text_file_split_by_a_separator_is_cut_and_gives_the_jsonl_runs_tokens(run_cli, gpt2_run, tmp_path):
    """The bundled corpus's documents as one text file of documents between `<|endoftext|>` lines (TinyStories'
    layout), larger than a shard: the plan cuts it just after separator lines, each piece numbered by its first
    line; every document is read once (the same count and tokens as the JSONL run of the same texts), and validate's
    reference check, drawn from the blocks tokenize read, finds them equal to the reference's."""
    texts = [r["text"] for p in sorted((EXAMPLES / "data").glob("*.jsonl*")) for r in read_jsonl(p)]
    data = tmp_path / "stories.txt"
    data.write_text("".join(text + "\n<|endoftext|>\n" for text in texts))
    out = tmp_path / "out"
    sets = [f"input.paths=[{data}]", "input.id_field=null", "input.separator=<|endoftext|>", f"output.path={out}"]
    run_cli("run", "examples/gpt2.yaml", "--set", "partition.shard_size=1MB", *(f"--set={s}" for s in sets))
    manifest, jsonl = (json.loads((root / "manifest.json").read_text()) for root in (out, gpt2_run))
    assert manifest["counts"] == jsonl["counts"] and manifest["counts"]["documents_in"] == len(texts)
    pieces = [piece for shard in json.loads((out / "plan.json").read_text())["shards"] for piece in shard["pieces"]]
    whole = data.read_bytes()
    assert len(pieces) == 4 and pieces[0]["start"] == 0
    for piece in pieces[1:]:
        assert whole[: piece["start"]].endswith(b"\n<|endoftext|>\n")
        assert piece["first_line"] == whole.count(b"\n", 0, piece["start"]) + 1
    markers = [json.loads(p.read_text()) for p in sorted((out / "_commits" / "tokenize").glob("shard-*.json"))]
    assert len(markers) == 4 and all(marker["result"]["blocks"] for marker in markers)  # where validate re-reads
    check = manifest["encoder"]["reference_check"]
    assert check["documents"] > 50 and check["mismatches"] == 0


def test_a_tree_of_files_named_alike_gives_the_jsonl_runs_tokens(run_cli, gpt2_run, tmp_path):
    """The bundled corpus's documents as a source tree: each a file called README in a directory of its own (as a
    checkout has a Makefile in every directory), read as text. Every document is tokenized once (the same count and
    tokens as the JSONL run of the same texts; before, a shard kept the first README and rejected the others as
    duplicate ids), its id its path under the tree, and validate's reference check, drawn from runs of files that
    tokenize read as one batch, finds them equal to the reference's."""
    texts = [r["text"] for p in sorted((EXAMPLES / "data").glob("*.jsonl*")) for r in read_jsonl(p)]
    tree = tmp_path / "tree"
    for i, text in enumerate(texts):
        (tree / f"d{i % 4}" / f"{i:04d}").mkdir(parents=True)
        (tree / f"d{i % 4}" / f"{i:04d}" / "README").write_text(text)
    out = tmp_path / "out"
    sets = [f"input.paths=[{tree}/**/*]", "input.format=text", "input.id_field=null", f"output.path={out}"]
    run_cli("run", "examples/gpt2.yaml", "--set", "partition.shard_size=1MB", *(f"--set={s}" for s in sets))
    manifest, jsonl = (json.loads((root / "manifest.json").read_text()) for root in (out, gpt2_run))
    assert manifest["counts"] == jsonl["counts"] and manifest["counts"]["documents_in"] == len(texts)
    assert not list((out / "rejects").glob("*"))
    ids = pq.read_table(sorted((out / "megatron" / "train").glob("*.docs.parquet"))[0]).column("id").to_pylist()
    assert ids[0] == "d0/0000/README" and len(set(ids)) == len(ids) > 100
    markers = [json.loads(p.read_text()) for p in sorted((out / "_commits" / "tokenize").glob("shard-*.json"))]
    assert all(marker["result"]["blocks"] for marker in markers)  # runs of files, where validate re-reads
    check = manifest["encoder"]["reference_check"]
    assert check["documents"] > 20 and check["mismatches"] == 0


def test_shuffled_run_has_the_same_documents_in_another_order(run_cli, gpt2_run, tmp_path):
    plain, shuffled = gpt2_run, tmp_path / "shuffled"
    result = run_cli(
        "run", "examples/gpt2.yaml", "--set", f"output.path={shuffled}", "--set", "partition.shard_size=1MB",
        "--set", "partition.shuffle=true",
    )  # fmt: skip
    a, b = (json.loads((d / "manifest.json").read_text()) for d in (plain, shuffled))
    assert a["counts"] == b["counts"]
    documents_and_tokens = lambda m: {s: (v["documents"], v["tokens"]) for s, v in m["splits"].items()}  # noqa: E731
    assert documents_and_tokens(a) == documents_and_tokens(b)  # packing differs: rows follow document order
    bins = lambda files: {k: v for k, v in files.items() if k.startswith("megatron/")}  # noqa: E731
    assert bins(dataset_files(plain)) != bins(dataset_files(shuffled))
    assert "shuffle" in result.stdout
    # The documents tables still name each document's input file and line (the shuffle carries them along)
    origins = lambda root: sorted(  # noqa: E731
        (row["id"], row["file"], row["line"])
        for table in root.glob("megatron/*/*.docs.parquet")
        for row in pq.read_table(table, columns=["id", "file", "line"]).to_pylist()
    )
    assert origins(shuffled) == origins(plain) and len(origins(plain)) == a["counts"]["documents_out"]
