import gzip
import json

import pytest

from tokenmill.config import TokenmillConfig
from tokenmill.partition import plan_shards, shard_pieces
from tokenmill.readers import InputError, Piece, read_documents


def make_config(paths, shard_size, tmp_path, id_field="id"):
    return TokenmillConfig.model_validate(
        {
            "name": "t",
            "input": {"paths": paths, "id_field": id_field},
            "partition": {"shard_size": shard_size},
            "tokenizer": {"path": "unused.json"},
            "output": {"path": str(tmp_path / "out")},
        }
    )


def read_all(plan, id_field="id"):
    docs, rejects = [], []
    for shard in plan["shards"]:
        for batch, bad in read_documents(shard_pieces(shard), "text", id_field):
            docs += list(zip(batch.ids, batch.texts, strict=True))
            rejects += bad
    return docs, rejects


def write_jsonl(path, n, width=97):
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"d{i}", "text": f"doc {i} " + "x" * (i * width % 500)}) + "\n")


def test_byte_range_shards_cover_every_line_exactly_once(tmp_path):
    path = tmp_path / "big.jsonl"
    write_jsonl(path, 5000)
    plan = plan_shards(make_config([str(path)], 40_000, tmp_path))
    assert len(plan["shards"]) > 20
    assert all(len(s["pieces"]) == 1 for s in plan["shards"])
    docs, rejects = read_all(plan)
    assert [d[0] for d in docs] == [f"d{i}" for i in range(5000)] and not rejects
    sizes = [s["bytes"] for s in plan["shards"]]
    assert max(sizes) - min(sizes) < 1000  # balanced to within a line or two


def test_line_numbers_at_cuts_are_exact(tmp_path):
    path = tmp_path / "big.jsonl"
    write_jsonl(path, 3000)
    plan = plan_shards(make_config([str(path)], 30_000, tmp_path, id_field=None))
    docs, _ = read_all(plan, id_field=None)
    assert [d[0] for d in docs] == [f"big.jsonl:{i + 1}" for i in range(3000)]


def test_small_and_compressed_files_are_grouped_whole_in_order(tmp_path):
    for name in ("a", "b", "c"):
        write_jsonl(tmp_path / f"{name}.jsonl", 50)
        with (
            open(tmp_path / f"{name}.jsonl", "rb") as src,
            gzip.open(tmp_path / f"{name}.jsonl.gz", "wb") as dst,
        ):
            dst.write(src.read())
        (tmp_path / f"{name}.jsonl").unlink()
    plan = plan_shards(make_config([str(tmp_path / "*.jsonl.gz")], 30_000, tmp_path))
    pieces = [p["path"].rsplit("/", 1)[-1] for s in plan["shards"] for p in s["pieces"]]
    assert pieces == ["a.jsonl.gz", "b.jsonl.gz", "c.jsonl.gz"]
    assert all(p["start"] == 0 and p["end"] is None for s in plan["shards"] for p in s["pieces"])
    assert len(read_all(plan)[0]) == 150


def test_plan_is_deterministic(tmp_path):
    write_jsonl(tmp_path / "x.jsonl", 2000)
    config = make_config([str(tmp_path / "x.jsonl")], 25_000, tmp_path)
    assert plan_shards(config) == plan_shards(config)


def test_bad_records_are_rejected_with_file_line_and_reason(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_text(
        '{"id": "ok1", "text": "fine"}\n'
        '{"id": "broken", "text": \n'
        '{"id": "no-text"}\n'
        "\n"
        '{"id": "num", "text": 42}\n'
        '{"id": "ok2", "text": ""}\n'
    )
    batches = list(read_documents([Piece(str(path))], "text", "id"))
    ids = [i for b, _ in batches for i in b.ids]
    rejects = [r.to_dict() for _, rs in batches for r in rs]
    assert ids == ["ok1", "ok2"]
    assert [(r["file"], r["line"]) for r in rejects] == [
        ("mixed.jsonl", 2),
        ("mixed.jsonl", 3),
        ("mixed.jsonl", 5),
    ]
    assert "malformed JSON" in rejects[0]["reason"]
    assert "'text' missing" in rejects[1]["reason"]
    assert "not a string (int)" in rejects[2]["reason"]


def test_nested_text_field(tmp_path):
    path = tmp_path / "nested.jsonl"
    path.write_text('{"meta": {"content": "deep"}}\n')
    ((batch, _),) = read_documents([Piece(str(path))], "meta.content", None)
    assert batch.texts == ["deep"] and batch.ids == ["nested.jsonl:1"]


def test_truncated_gzip_is_a_clear_input_error(tmp_path):
    path = tmp_path / "cut.jsonl.gz"
    with gzip.open(path, "wt") as f:
        for i in range(2000):
            f.write(json.dumps({"text": f"document number {i} " * 20}) + "\n")
    path.write_bytes(path.read_bytes()[:-300])
    with pytest.raises(InputError, match="cut.jsonl.gz: cannot be read"):
        list(read_documents([Piece(str(path))], "text", None))


def test_missing_input_path_names_the_pattern(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        plan_shards(make_config([str(tmp_path / "nothing-here*.jsonl")], 1000, tmp_path))
