import bz2
import gzip
import io
import itertools
import json
import lzma
import os
from dataclasses import replace

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest
import zstandard

from tokenmill.config import TokenmillConfig
from tokenmill.core.plan import Shards
from tokenmill.io import arrays, direct, readers
from tokenmill.io.readers import InputError, Piece, ReadOptions, count_crlf, line_blocks, read_documents
from tokenmill.io.storage import list_files
from tokenmill.stages import partition
from tokenmill.stages.partition import auto_shard_size, load_or_plan, plan_shards

from .conftest import CORPUS


def make_config(paths, shard_size, tmp_path, **input_options):
    return TokenmillConfig.model_validate(
        {
            "name": "t",
            "input": {"paths": paths, "id_field": "id"} | input_options,
            "partition": {"shard_size": shard_size},
            "tokenizer": {"path": "unused.json"},
            "output": {"path": str(tmp_path / "out")},
        }
    )


def read_all(config, plan):
    docs, rejects = [], []
    for shard in plan.shards:
        for batch, bad in read_documents(shard.pieces, config.input.read_options()):
            docs += list(zip(batch.ids, batch.texts, strict=True))
            rejects += bad
    return docs, rejects


def write_jsonl(path, n, width=97, prefix="d"):
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"{prefix}{i}", "text": f"doc {i} " + "x" * (i * width % 500)}) + "\n")


def test_byte_range_shards_cover_every_line_exactly_once(tmp_path):
    path = tmp_path / "big.jsonl"
    write_jsonl(path, 5000)
    config = make_config([str(path)], 40_000, tmp_path)
    plan = plan_shards(config)
    assert len(plan.shards) > 20
    assert all(len(s.pieces) == 1 for s in plan.shards)
    docs, rejects = read_all(config, plan)
    assert [d[0] for d in docs] == [f"d{i}" for i in range(5000)] and not rejects
    sizes = [s.bytes for s in plan.shards]
    assert max(sizes) - min(sizes) < 1000  # balanced to within a line or two


def test_line_numbers_at_cuts_are_counted_where_ids_are_hashed(tmp_path):
    """Where the shards hash ids `<file>:<line>` (two splits, no id field), the partition counts the lines before
    each cut and every document's id names its line. With one split it does not read the file: the first piece
    starts at line 1, the others' first lines are unknown, and the line counts the fast path reports for each
    piece are what numbers the next one (`tokenize.number_lines`): the counted plan's first lines."""
    path = tmp_path / "big.jsonl"
    write_jsonl(path, 3000)
    one_split = make_config([str(path)], 30_000, tmp_path, id_field=None)
    hashed = one_split.model_copy(update={"split": {"train": 0.9, "valid": 0.1}})
    counted = plan_shards(hashed)
    docs, _ = read_all(hashed, counted)
    assert [d[0] for d in docs] == [f"big.jsonl:{i + 1}" for i in range(3000)]
    assert partition.counts_lines(hashed, hashed.input)

    plan = plan_shards(one_split)
    assert not partition.counts_lines(one_split, one_split.input)
    first_lines = [shard.pieces[0].first_line for shard in plan.shards]
    assert len(first_lines) > 5 and first_lines[0] == 1 and set(first_lines[1:]) == {None}
    options = one_split.input.read_options()
    lines = [sum(b.lines for b, _ in read_documents(s.pieces, options, columnar=True)) for s in plan.shards]
    assert sum(lines) == 3000
    assert [s.pieces[0].first_line for s in counted.shards] == [1 + sum(lines[:k]) for k in range(len(lines))]
    dotted = one_split.model_copy(update={"input": one_split.input.model_copy(update={"text_field": "meta.text"})})
    assert not partition.counts_lines(dotted, dotted.input)  # read by columns too, which count the lines they read


@pytest.mark.parametrize("codec", ["zst", "gz"])
def test_a_compressed_stream_of_two_threads_shares_is_cut_anywhere_and_each_piece_reads_the_lines_starting_in_it(
    tmp_path, codec
):
    """A compressed JSONL file cannot be cut at line starts without reading it: it is cut at offsets of its
    decompressed stream (a thread's share of an auto-sized run apart: 8 shards), each piece reading the lines that
    start in it, the last to the stream's end. Every record once, in order; each piece's line count numbers the next
    (`tokenize.number_lines`), as for a plain file's uncounted cuts. A rerun's plan takes the same pieces from the
    run's own plan.json. Where ids are hashed, it is read whole."""
    plain = tmp_path / "plain.jsonl"
    write_jsonl(plain, 3000)
    data = plain.read_bytes()
    path = tmp_path / f"big.jsonl.{codec}"
    path.write_bytes(zstandard.ZstdCompressor().compress(data) if codec == "zst" else gzip.compress(data))
    config = make_config([str(path)], len(data) // 32, tmp_path, id_field=None)  # a thread's share: 1/4 of the file
    plan = plan_shards(config)
    pieces = [shard.pieces[0] for shard in plan.shards]
    assert [(p.start, p.end) for p in pieces] == [(k * len(data) // 4, (k + 1) * len(data) // 4) for k in range(3)] + [
        (3 * len(data) // 4, None)
    ]
    assert [p.first_line for p in pieces] == [1, None, None, None]
    assert plan_shards(config, earlier=plan, own=True).shards == plan.shards  # the last piece too (it lost it)
    assert any(data[p.start - 1 : p.start] != b"\n" for p in pieces[1:])  # not at line starts
    options = config.input.read_options()
    read = [list(read_documents([p], options, columnar=True)) for p in pieces]
    texts = [t for batches in read for b, _ in batches for t in b.text_values().to_pylist()]
    assert texts == [json.loads(line)["text"] for line in data.splitlines()]
    lines = [sum(b.lines for b, _ in batches) for batches in read]
    assert sum(lines) == 3000 and [b.block.start for b, _ in read[1][:1]] == [
        data.index(b"\n", pieces[1].start - 1) + 1
    ]
    careful = [r.text for p in pieces for r in readers.records(p, options)]  # the careful path: the same lines
    assert careful == texts
    hashed = config.model_copy(update={"split": {"train": 0.9, "valid": 0.1}})
    assert [list(s.pieces) for s in plan_shards(hashed).shards] == [[Piece(str(path))]]


@pytest.mark.parametrize("long_line", [readers.LONG_LINE, 0])
def test_a_local_files_blocks_are_mapped_or_read_directly_and_read_as_a_stream_reads_them(
    tmp_path, monkeypatch, long_line
):
    """A local uncompressed file's line blocks are views of memory maps where its pages are in the page cache, else
    read with O_DIRECT (`readers._local_blocks`), which leaves them out of the cache; the same bytes in any other
    filesystem are read as a stream. All give the same blocks of whole lines with the same line numbers, for a
    piece at the file's start, one within it and one to its end without a last newline, with lines longer than a
    block and blank lines; also where the line that ends a block is too long to read directly (`long_line` 0:
    such blocks are mapped, the others read directly)."""
    monkeypatch.setattr(readers, "LONG_LINE", long_line)
    mapped = []  # the blocks mapped, not read directly
    map_block = direct.mapped
    monkeypatch.setattr(readers, "mapped", lambda f, start, stop: mapped.append(start) or map_block(f, start, stop))
    lines = [b'{"text": "%s"}' % (b"x" * (i * 7919 % 20000)) if i % 13 else b"" for i in range(400)]
    data = b"\n".join(lines)  # no newline at the end
    local = tmp_path / "x.jsonl"
    local.write_bytes(data)
    fsspec.filesystem("memory").pipe("/lines/x.jsonl", data)
    cut, later = data.index(b"\n", 100_000) + 1, data.index(b"\n", 900_000) + 1
    first = data[:cut].count(b"\n") + 1

    def read(path: str, start: int, end: int | None, line: int) -> list[tuple[bytes, int, int]]:
        """Each block as bytes, taken before the next is asked for (a directly read block is valid until then)."""
        blocks = line_blocks(Piece(path, start, end, line), ReadOptions(), batch_bytes=30_000)
        return [(bytes(block), first_line, newlines) for block, first_line, newlines, _ in blocks]

    with open(local, "rb") as f:

        def cached() -> bool:
            return readers.in_page_cache(f, 0, len(data))

        for start, end, line in ((0, cut, 1), (cut, later, first), (cut, None, first)):
            streamed = read("memory://lines/x.jsonl", start, end, line)
            assert cached() and read(str(local), start, end, line) == streamed  # mapped
            os.fsync(f.fileno())
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # out of the page cache
            mapped.clear()
            assert not cached() and read(str(local), start, end, line) == streamed
            if long_line:  # every block read directly: none mapped, and the file is still out of the page cache
                assert not mapped and not cached()
            else:  # a block whose last line runs past the buffer is mapped (and the kernel reads ahead of it)
                assert mapped
            local.read_bytes()  # back in the page cache
            assert len(streamed) > 2 and b"".join(block for block, _, _ in streamed) == data[start:end]
            assert all(block.endswith(b"\n") for block, _, _ in streamed[:-1])
            for (block, first_line, newlines), (_, next_line, _) in zip(streamed, streamed[1:], strict=False):
                assert newlines == block.count(b"\n") and next_line == first_line + newlines
    assert type(next(line_blocks(Piece(str(local)), ReadOptions()))[0]) is memoryview
    assert type(next(line_blocks(Piece("memory://lines/x.jsonl"), ReadOptions()))[0]) is bytes


def test_crlf_line_endings_are_counted_in_any_block_a_reader_hands_over(tmp_path):
    """A block's CRLF endings (its bytes exclude them) are looked for in place, in bytes, views of bytes and views
    of memory maps that start and end anywhere in the map: each view is searched, not its neighbours."""
    plain = b'{"text": "x"}\n' * 5000
    data = b'{"text": "y"}\r\n' + plain + b'{"text": "z"}\r\n' + plain
    path = tmp_path / "crlf.jsonl"
    path.write_bytes(data)
    middle = data.index(b"\r\n", 20)
    cuts = [(0, 20), (0, 14), (14, 16), (16, middle), (middle, middle + 2), (middle + 2, len(data)), (0, len(data))]
    with open(path, "rb") as f:
        for start, end in cuts:
            mapped = direct.mapped(f, start, end)  # as a local file's blocks are read
            for block in (data[start:end], memoryview(data)[start:end], mapped, mapped[:20], mapped[-20:]):
                assert count_crlf(block) == bytes(block).count(b"\r\n"), (start, end, type(block))


def test_small_and_compressed_files_are_grouped_whole_in_order(tmp_path):
    for name in ("a", "b", "c"):
        write_jsonl(tmp_path / f"{name}.jsonl", 50, prefix=name)
        with open(tmp_path / f"{name}.jsonl", "rb") as src, gzip.open(tmp_path / f"{name}.jsonl.gz", "wb") as dst:
            dst.write(src.read())
        (tmp_path / f"{name}.jsonl").unlink()
    config = make_config([str(tmp_path / "*.jsonl.gz")], 30_000, tmp_path)
    plan = plan_shards(config)
    pieces = [p.path.rsplit("/", 1)[-1] for s in plan.shards for p in s.pieces]
    assert pieces == ["a.jsonl.gz", "b.jsonl.gz", "c.jsonl.gz"]
    assert len(plan.shards) == 2
    assert all(p.start == 0 and p.end is None for s in plan.shards for p in s.pieces)
    assert len(read_all(config, plan)[0]) == 150


def test_a_small_files_piece_holds_its_listed_size_which_is_not_part_of_what_its_shard_is_made_of(tmp_path):
    """A small file's piece holds the size the listing gave (the reader takes it for an object store's file, not a
    HEAD), kept in plan.json; a shard's source leaves it out, as its file's fingerprint holds it: a plan made before
    pieces had sizes names each shard's source as one made now does, and reuses its outputs."""
    for name in ("a", "b", "c"):
        write_jsonl(tmp_path / f"{name}.jsonl", 50, prefix=name)
    config = make_config([str(tmp_path / "*.jsonl")], 30_000, tmp_path)
    plan = plan_shards(config)
    sizes = {str(tmp_path / f"{name}.jsonl"): (tmp_path / f"{name}.jsonl").stat().st_size for name in "abc"}
    files = {f["path"]: f for f in plan.files}
    for shard in Shards(plan.shards):  # as plan.json holds them
        assert {p.path: p.size for p in shard.pieces}.items() <= sizes.items() and shard.pieces
        unsized = [replace(p, size=None) for p in shard.pieces]
        assert partition._source_of(unsized, files) == partition._source_of(list(shard.pieces), files) == shard.source


def test_a_plan_json_not_signed_by_this_user_is_not_kept_even_where_its_shards_compare_equal(tmp_path):
    """Pieces compare without their sizes; a plan.json whose sizes were altered (so no longer signed) is not taken as
    the run's plan: the sizes are the listing's and plan.json is written again, signed."""
    from tokenmill.core import layout
    from tokenmill.core.signing import signed

    for name in ("a", "b", "c"):
        write_jsonl(tmp_path / f"{name}.jsonl", 50, prefix=name)
    config = make_config([str(tmp_path / "*.jsonl")], 30_000, tmp_path)
    plan, _ = load_or_plan(config)
    store = config.output.store()
    planted = json.loads(store.read_bytes(layout.PLAN))
    for shard in planted["shards"]:
        for piece in shard["pieces"]:
            piece["size"] = 1  # a file "too small" for any sampled block: the sample would pass over it
    store.write_bytes(layout.PLAN, json.dumps(planted).encode())
    again, _ = load_or_plan(config)
    assert [p.size for s in again.shards for p in s.pieces] == [p.size for s in plan.shards for p in s.pieces]
    assert all(p.size > 1 for s in again.shards for p in s.pieces)
    assert signed(store, layout.PLAN, store.read_bytes(layout.PLAN))


@pytest.mark.parametrize("layout", ["parquet", "arrow stream", "arrow file"])
def test_a_table_file_is_partitioned_by_its_groups_of_rows(tmp_path, layout):
    """A Parquet file by its row groups, an Arrow file (a stream, as save_to_disk writes one, or the file format) by
    its record batches, and a group of two ranges or more into ranges of its rows: every row read once, by its row
    number, on the columns or not; a block of a piece (its rows of a group) read again alone gives its rows again."""
    rows = [{"id": f"p{i}", "meta": {"content": f"table document {i} " * 20}} for i in range(3000)]
    path = tmp_path / ("t.parquet" if layout == "parquet" else "t.arrow")

    def write(table: pa.Table) -> None:  # a first group of 2,000 rows (16 shards), then groups of 100
        first, rest = table.slice(0, 2000), table.slice(2000)
        if layout == "parquet":
            with pq.ParquetWriter(path, table.schema) as writer:
                writer.write_table(first, row_group_size=2000)
                writer.write_table(rest, row_group_size=100)
            return
        with pa.OSFile(str(path), "wb") as sink:
            new = pa.ipc.new_stream if layout == "arrow stream" else pa.ipc.new_file
            with new(sink, table.schema) as writer:
                writer.write_table(first, max_chunksize=2000)
                writer.write_table(rest, max_chunksize=100)

    table = pa.Table.from_pylist(rows)
    write(table)
    config = make_config([str(path)], 50_000, tmp_path, text_field="meta.content")
    plan = plan_shards(config)
    pieces = [piece for shard in plan.shards for piece in shard.pieces]
    cut = [piece for piece in pieces if piece.row_groups == [0]]
    parts = 2 if layout == "parquet" else 16  # Parquet's: a thread's share of an auto-sized run (8 shards) each
    ends = [(k + 1) * 2000 // parts for k in range(parts - 1)] + [None]  # the last to the group's end
    assert [(p.start, p.end) for p in cut] == [(k * 2000 // parts, end) for k, end in enumerate(ends)]
    assert [g for p in pieces[parts:] for g in p.row_groups] == list(range(1, 11))
    docs, rejects = read_all(config, plan)
    assert [d[0] for d in docs] == [r["id"] for r in rows] and not rejects
    assert docs[7][1] == rows[7]["meta"]["content"]

    write(pa.table({"id": table.column("id"), "text": [r["meta"]["content"] for r in rows]}))  # the columnar path
    ids, blocks = [], {}  # the ids of each block's batches, by (its piece, its place, its first row)
    for k, piece in enumerate(pieces):
        for batch, _ in read_documents([piece], ReadOptions(), columnar=True, batch_bytes=10_000):
            ids += list(batch.ids)
            place = (k, *readers.block_place(batch.block), batch.block.first_line)
            blocks.setdefault(place, []).extend(batch.ids)
    assert ids == [f"{path.name}:{i}" for i in range(1, 3001)] and len(blocks) == parts + 10 < len(ids) // 10
    for (k, *place), block_ids in blocks.items():
        again = readers.block_pieces(pieces, k, *place, ReadOptions())
        assert [i for batch, _ in read_documents(again, ReadOptions(), columnar=True) for i in batch.ids] == block_ids


@pytest.mark.parametrize("ids", ["strings", "numbers"])
def test_parquet_is_read_on_its_columns_as_it_is_record_by_record(tmp_path, ids):
    """The columnar path reads a Parquet file a batch of rows at a time (several a row group here) and checks them on
    their columns; a batch with a bad row goes record by record. Either way the same documents, numbered by their
    row, and the same rejects as reading record by record (whole numbers as ids are their digits either way)."""
    rows = [
        {"id": f"p{i}" if ids == "strings" else i, "text": f"row {i} " * (i % 40 + 1), "lang": "en"}
        for i in range(3000)
    ]
    rows[1234]["text"] = None  # a row without its text
    rows[2345]["id"] = rows[2344]["id"]  # an id twice
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=1000)
    options = ReadOptions(id_field="id", fields=("lang",))
    read = {}
    for columnar in (False, True):
        for group in (None, [1, 2]):
            batches = list(read_documents([Piece(str(path), row_groups=group)], options, columnar, batch_bytes=20_000))
            documents = [
                (i, str(t), int(line), lang)
                for batch, _ in batches
                for i, t, line, lang in zip(
                    batch.ids, batch.text_values(), batch.doc_lines, batch.extra["lang"], strict=True
                )
            ]
            read[columnar, str(group)] = documents, [(r.line, r.reason) for _, rejects in batches for r in rejects]
            on_columns = sum(batch.text_array is not None for batch, _ in batches)
            assert on_columns >= (len(batches) - 2 if columnar else 0)
    assert len(batches) > 6  # several batches a row group
    documents, rejects = read[False, "None"]
    assert len(documents) == 2998 and documents[0] == (str(rows[0]["id"]), "row 0 ", 1, "en")
    assert rejects == [(1235, "text field 'text' missing or null"), (2346, "duplicate id in this shard")]
    assert read[True, "None"] == read[False, "None"] and read[True, "[1, 2]"] == read[False, "[1, 2]"]
    assert read[True, "[1, 2]"][0][0][2] == 1001


def test_json_lines_whose_ids_are_whole_numbers_are_read_on_their_columns(tmp_path):
    """Many datasets number their records (`"id": 17`): such a file is read by its columns, its ids their digits as
    record by record (not a Python object a record); a block whose ids mix numbers and strings, or holds a number that
    is not whole, goes record by record."""
    lines = [json.dumps({"id": i, "text": f"row {i} " * (i % 40 + 1)}) for i in range(3000)]
    lines[1500] = json.dumps({"id": "s1500", "text": "a string among numbers"})
    lines[2500] = json.dumps({"id": 2500.5, "text": "not a whole number"})
    path = tmp_path / "numbered.jsonl"
    path.write_text("\n".join(lines) + "\n")
    read = {c: list(read_documents([Piece(str(path))], ReadOptions(id_field="id"), c, 20_000)) for c in (False, True)}
    documents = {
        columnar: [(i, str(t)) for b, _ in batches for i, t in zip(b.ids, b.text_values(), strict=True)]
        for columnar, batches in read.items()
    }
    assert documents[True] == documents[False]
    assert documents[True][7] == ("7", "row 7 " * 8) and documents[True][1500][0] == "s1500"
    assert documents[True][2500][0] == "2500.5" and len(documents[True]) == 3000
    on_columns = [b.text_array is not None for b, _ in read[True]]
    assert len(on_columns) > 6 and sum(on_columns) == len(on_columns) - 2


# A metadata field's values, by kind: a kind of values that parses as one Arrow type exactly as orjson reads each
# value is read by columns; one where `2` and `2.0` both occur (orjson's int 2 and float 2.0, its text "2" and "2.0"),
# or strings among numbers, or objects, record by record.
FIELD_VALUES = {
    "fractions": (lambda i: [i / 7 + 0.5, -1.5e-300, 5e-324, 123456.789, 0.1][i % 5], True),
    "whole numbers": (lambda i: [i, -(2**63), 2**63 - 1][i % 3], True),
    "booleans": (lambda i: i % 3 == 0, True),
    "numbers or null": (lambda i: None if i % 4 else i / 3 + 0.5, True),
    "whole and fractional": (lambda i: i if i % 2 else i + 0.5, False),
    "whole written as floats": (lambda i: float(i), False),
    "past int64": (lambda i: 2**64 + i, False),
    "strings and numbers": (lambda i: str(i) if i % 2 else i, False),
    "objects": (lambda i: {"k": i}, False),
}


@pytest.mark.parametrize("kind", FIELD_VALUES)
def test_a_metadata_field_of_numbers_or_booleans_is_read_on_its_columns_as_orjson_reads_it(tmp_path, kind):
    """FineWeb's `language_score` (fractions) and `token_count` (whole numbers), DCLM's `dclm_label`: a block with such
    a metadata field is read by its columns, each value of the type and value orjson (the careful path) gives it, so
    its text in the documents table is the same ("17", "0.5", "true"); a field whose numbers a parse cannot tell
    apart so (`2` beside `2.0`), or of mixed or nested values, is read record by record, as before. The types a block
    took are the next block's first guess: also a file whose values change kind from block to block reads the same."""
    values, on_columns = FIELD_VALUES[kind]
    lines = [json.dumps({"id": f"d{i}", "text": f"doc {i}", "meta": {"x": values(i)}, "n": i}) for i in range(3000)]
    path = tmp_path / "fields.jsonl"
    path.write_text("\n".join(lines) + "\n")
    options = ReadOptions(id_field="id", fields=("meta.x", "n"))
    read = {c: list(read_documents([Piece(str(path))], options, c, 20_000)) for c in (False, True)}
    extra = {c: [(v, type(v)) for b, _ in batches for v in b.extra["meta.x"]] for c, batches in read.items()}
    assert extra[True] == extra[False] and len(extra[True]) == 3000
    assert [v for b, _ in read[True] for v in b.extra["n"]] == list(range(3000))
    columnar = [b.text_array is not None for b, _ in read[True]]
    assert len(columnar) > 6 and all(columnar) == on_columns and any(columnar) == on_columns


@pytest.mark.parametrize("kind", FIELD_VALUES)
def test_the_types_a_block_is_first_parsed_with_change_only_how_many_parses_it_takes(monkeypatch, kind):
    """Each block starts from the types the last block of the same fields parsed with (`readers._LAST_TYPES`, which
    another source's blocks may have left): whatever they are, a block gives the same columns, or none."""
    values, _ = FIELD_VALUES[kind]
    options = ReadOptions(id_field="id", fields=("x",))
    kinds = [pa.string(), pa.int64(), pa.float64(), pa.bool_(), None]
    for doc_id in (int, "d{}".format):
        rows = [{"id": doc_id(i), "text": f"doc {i}", "x": values(i)} for i in range(200)]
        block = "".join(json.dumps(row) + "\n" for row in rows).encode()
        outcomes = set()
        for x, id_type in itertools.product(kinds, kinds[:2] + [None]):
            guess = {name: t for name, t in (("x", x), ("id", id_type)) if t is not None}
            monkeypatch.setitem(readers._LAST_TYPES, ("text", "id", "x"), guess)
            table = readers._arrow_table(block, options)
            outcomes.add(None if table is None else json.dumps(table.to_pylist(), default=str))
        assert len(outcomes) == 1


def test_a_block_whose_fields_change_kind_reads_as_record_by_record(tmp_path):
    """One file whose metadata field holds strings, then whole numbers, then fractions, then booleans, a few blocks
    each, and whose ids are numbers, then strings: every block gives the careful path's ids and values, those of one
    kind on their columns (the types a block parsed with are only the next one's first guess)."""
    kinds = [str, int, lambda i: i + 0.25, lambda i: i % 2 == 0, str]
    lines = [
        json.dumps({"id": i if i < 2500 else f"s{i}", "text": f"doc {i}", "x": kinds[i // 1000](i)})
        for i in range(5000)
    ]
    path = tmp_path / "changing.jsonl"
    path.write_text("\n".join(lines) + "\n")
    options = ReadOptions(id_field="id", fields=("x",))
    read = {c: list(read_documents([Piece(str(path))], options, c, 10_000)) for c in (False, True)}
    extra = {c: [(v, type(v)) for b, _ in batches for v in b.extra["x"]] for c, batches in read.items()}
    assert extra[True] == extra[False] and extra[True][4500] == ("4500", str)
    ids = {c: [i for b, _ in batches for i in b.ids] for c, batches in read.items()}
    assert ids[True] == ids[False] and ids[True][7] == "7" and ids[True][4500] == "s4500"
    columnar = [b.text_array is not None for b, _ in read[True]]
    assert sum(columnar) >= len(columnar) - 5  # only a block where two kinds meet (5 places) goes record by record


def bad_among_good(count: int, seed: int) -> list[dict]:
    """Records of which a few are not documents, alone or at once: a text empty, missing, null, too short or too long
    (in characters, where the bytes alone do not tell), an id missing, null, or one an earlier record has."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(count):
        row = {"id": f"d{i}", "text": f"doc {i} \u00e9 " * int(rng.integers(1, 4))}  # 7 to 33 characters
        for fault in rng.choice(9, size=int(rng.integers(1, 3))) if rng.random() < 0.08 else []:
            if fault < 3:  # empty, null, missing
                row["text"] = ["", None, ...][fault]
            elif fault < 5:  # null, missing
                row["id"] = [None, ...][fault - 3]
            elif fault == 5 and i:
                row["id"] = f"d{int(rng.integers(i))}"  # in this block or an earlier one
            elif fault == 6:
                row["text"] = "\u00e9" * int(rng.choice([2, 3, 40, 41]))  # 4 to 82 bytes, 2 to 41 characters
            elif fault == 7:
                row["text"] = "x" * 41
        rows.append({k: v for k, v in row.items() if v is not ...})
    return rows


@pytest.mark.parametrize("layout", ["jsonl", "jsonl, CR LF and blank lines", "parquet", "small files"])
def test_a_few_bad_records_are_left_out_by_the_columns_with_the_rejects_record_by_record_gives(tmp_path, layout):
    """A block (or batch of rows) holding a few records that are not documents, or blank lines, is still read by its
    columns: the others are its documents, and each bad one is a reject with the reason, line and record that reading
    record by record gives it (and the bytes in alike), so a crawl with an empty text every thousand records does not
    go record by record. Under `on_invalid: fail` the read stops at the first, as record by record."""
    rows = bad_among_good(3000, seed=57)
    if layout == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), tmp_path / "rows.parquet", row_group_size=700)
    elif layout.startswith("jsonl,"):  # a blank line every 50 records, and two at the end
        lines = [json.dumps(row) + ("\r\n\r\n" if k % 50 == 49 else "\r\n") for k, row in enumerate(rows)]
        (tmp_path / "rows.jsonl").write_bytes(("".join(lines) + "\n\r\n").encode())
    else:
        for k in range(0, len(rows), 100 if layout == "small files" else len(rows)):
            with open(tmp_path / f"rows-{k:04d}.jsonl", "w") as f:
                f.writelines(json.dumps(row) + "\n" for row in rows[k : k + 100 if layout == "small files" else None])
    pieces = [Piece(str(path)) for path in sorted(tmp_path.iterdir())]
    options = ReadOptions(id_field="id", min_chars=3, max_chars=40)
    read = {}
    for columnar in (False, True):
        batches = list(read_documents(pieces, options, columnar, batch_bytes=10_000))
        documents = [
            (i, str(t), int(n)) for b, _ in batches for i, t, n in zip(b.ids, b.text_values(), b.doc_lines, strict=True)
        ]
        rejects = [r.to_dict() for _, rejects in batches for r in rejects]
        nbytes = sum(b.nbytes for b, _ in batches) if layout != "parquet" else None  # a table's is Arrow's
        read[columnar] = documents, rejects, nbytes
        on_columns = sum(b.text_array is not None for b, _ in batches)
        assert on_columns == (len(batches) if columnar else 0) and len(batches) > 8 * columnar
    documents, rejects, _ = read[False]
    assert read[True] == read[False]
    reasons = {r["reason"] for r in rejects}
    assert len(reasons) == 4 and len(rejects) > 150 and len(documents) + len(rejects) == 3000
    with pytest.raises(InputError) as careful:
        list(read_documents(pieces, replace(options, on_invalid="fail")))
    with pytest.raises(InputError) as columnar:
        list(read_documents(pieces, replace(options, on_invalid="fail"), True, batch_bytes=10_000))
    assert str(columnar.value) == str(careful.value)


@pytest.mark.parametrize("layout", ["jsonl", "parquet"])
def test_fields_inside_objects_are_read_by_their_columns_as_record_by_record(tmp_path, layout):
    """A text, id or metadata field at a path into a record's objects (`metadata.url`, as datatrove writes a crawl's
    records; a Parquet file's struct columns) is read by the columns, with the documents, extra values and rejects
    reading record by record gives: a field or its object missing or null alike; a block where an object is not one
    goes record by record."""
    rows = [
        {"doc": {"text": f"text {i} " * (i % 9 + 1), "id": i}, "metadata": {"url": f"https://x/{i}", "dump": "d"}}
        for i in range(2000)
    ]
    del rows[5]["metadata"]["url"]
    rows[6]["metadata"] = None
    del rows[7]["metadata"]
    rows[8]["doc"]["text"] = None  # a reject
    if layout == "jsonl":
        rows[1500]["metadata"] = "not an object"  # its block: record by record
        (tmp_path / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    else:
        pq.write_table(pa.Table.from_pylist(rows), tmp_path / "rows.parquet", row_group_size=500)
    (path,) = tmp_path.iterdir()
    options = ReadOptions(text_field="doc.text", id_field="doc.id", fields=("metadata.url",))
    read = {}
    for columnar in (False, True):
        batches = list(read_documents([Piece(str(path))], options, columnar, batch_bytes=10_000))
        documents = [
            (i, str(t), int(n), url)
            for b, _ in batches
            for i, t, n, url in zip(b.ids, b.text_values(), b.doc_lines, b.extra["metadata.url"], strict=True)
        ]
        read[columnar] = documents, [r.to_dict() for _, rejects in batches for r in rejects]
        on_columns = sum(b.text_array is not None for b, _ in batches)
        assert on_columns == (len(batches) - (layout == "jsonl") if columnar else 0) and len(batches) > 8 * columnar
    documents, rejects = read[False]
    assert read[True] == read[False] and [r["line"] for r in rejects] == [9]
    assert documents[3] == ("3", "text 3 " * 4, 4, "https://x/3") and [d[3] for d in documents[5:8]] == [None] * 3
    assert documents[1499][3] == (None if layout == "jsonl" else "https://x/1500")


def test_a_hugging_face_dataset_saved_to_disk_is_read_as_arrow_on_its_columns(tmp_path):
    """`Dataset.save_to_disk` writes Arrow IPC streams beside two JSON files that are not data: the directory stands
    for its `.arrow` files, read a slice of a record batch at a time, checked on the columns or record by record
    where a row is bad, with the same documents, row numbers and rejects either way; the random-access Arrow file
    format is read too, and a missing column is named."""
    import pyarrow.ipc

    datasets = pytest.importorskip("datasets")
    rows = {"text": [f"row {i} " * (i % 40 + 1) for i in range(3000)], "id": [f"r{i}" for i in range(3000)]}
    rows["text"][1234] = None
    rows["id"][2345] = rows["id"][2344]
    datasets.Dataset.from_dict(rows | {"lang": ["en"] * 3000}).save_to_disk(tmp_path / "saved")
    (path,) = [f["path"] for f in list_files([str(tmp_path / "saved")])]
    assert path.endswith("data-00000-of-00001.arrow")
    table = pa.Table.from_pydict(rows)
    with pa.OSFile(str(tmp_path / "file.arrow"), "wb") as sink, pyarrow.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=700)
    options = ReadOptions(id_field="id", fields=("lang",))
    read = {}
    for name, columnar in ((path, False), (path, True), (str(tmp_path / "file.arrow"), True)):
        fields = options if name == path else ReadOptions(id_field="id")
        batches = list(read_documents([Piece(name)], fields, columnar, batch_bytes=20_000))
        documents = [
            (i, str(t), int(n)) for b, _ in batches for i, t, n in zip(b.ids, b.text_values(), b.doc_lines, strict=True)
        ]
        read[name, columnar] = documents, [(r.line, r.reason) for _, rejects in batches for r in rejects]
        on_columns = sum(b.text_array is not None for b, _ in batches)
        assert len(batches) > 6 and on_columns >= (len(batches) - 2 if columnar else 0)
    documents, rejects = read[path, False]
    assert len(documents) == 2998 and documents[1] == ("r1", "row 1 row 1 ", 2)
    assert rejects == [(1235, "text field 'text' missing or null"), (2346, "duplicate id in this shard")]
    assert read[path, True] == read[path, False] == read[str(tmp_path / "file.arrow"), True]
    with pytest.raises(InputError, match="no column 'body' in the Arrow schema"):
        list(read_documents([Piece(path)], ReadOptions(text_field="body"), True))


def test_plain_text_one_document_per_file_or_split_by_a_separator(tmp_path):
    (tmp_path / "a.txt").write_text("first file\nsecond line\n")
    (tmp_path / "b.txt").write_text("doc one\n---\ndoc two\nmore\n---\n\n---\ndoc three")
    whole = make_config([str(tmp_path / "*.txt")], 1000, tmp_path, id_field=None)
    docs, _ = read_all(whole, plan_shards(whole))
    assert docs == [("a.txt", "first file\nsecond line\n"), ("b.txt", (tmp_path / "b.txt").read_text())]
    split = make_config([str(tmp_path / "b.txt")], 1000, tmp_path, id_field=None, separator="---")
    docs, _ = read_all(split, plan_shards(split))
    assert docs == [("b.txt:1", "doc one"), ("b.txt:3", "doc two\nmore"), ("b.txt:8", "doc three")]


def test_a_source_tree_is_read_a_batch_of_files_at_a_time_each_named_by_its_path_under_the_input(tmp_path):
    """A code corpus as it is checked out: 300 files of one document each under directories, a `Makefile` in three
    of them, one file not UTF-8 and one empty. Each document's id is its path under the input's directory (before,
    its name alone: the second and third `Makefile` of a shard were rejects, "duplicate id"), the same wherever the
    tree is copied; the files are read a batch of many at a time, checked on their columns, with the same documents
    and rejects as the careful reader file by file; each batch's block (its files), read again alone, gives its
    documents again."""
    tree = tmp_path / "linux"
    files = {f"drivers/d{i % 7}/f{i}.c": f"int f{i}(void) {{ return {i}; }} /* ü {'x' * (i * 37 % 400)} */\n"
             for i in range(300)}  # fmt: skip
    files |= {"Makefile": "all:\n", "usr/Makefile": "usr:\n", "scripts/kconfig/Makefile": "kconfig:\n"}
    for rel, text in files.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
    (tree / "drivers/latin1.c").write_bytes(b"caf\xe9\n")
    (tree / "drivers/empty.c").write_bytes(b"")
    for pattern in (f"{tree}/**/*", str(tree / "**")):
        config = make_config([pattern], "40KB", tmp_path, id_field=None, format="text")
        plan = plan_shards(config)
        options = config.input.read_options()
        assert len(plan.shards) > 1 and options.root == str(tree)
        read = {}
        for columnar in (False, True):
            documents, rejects, batches = {}, [], 0
            for shard in plan.shards:
                for batch, bad in read_documents(shard.pieces, options, columnar, batch_bytes=4_000):
                    batches += 1
                    documents |= dict(zip(batch.ids, map(str, batch.text_values()), strict=True))
                    rejects += [(r.file, r.line, r.reason) for r in bad]
                    assert list(batch.doc_files) == [str(tree / i) for i in batch.ids]
                    if columnar:
                        assert isinstance(batch.block, list) and len(batch.block) == len(batch) + len(bad)
                        again = readers.block_pieces(shard.pieces, shard.pieces.index(batch.block[0]),
                                                     *readers.block_place(batch.block), 1, options)  # fmt: skip
                        assert again == batch.block
                        (batch_again, bad_again), *more = read_documents(again, options, True, batch_bytes=4_000)
                        assert not more and list(batch_again.ids) == list(batch.ids) and bad_again == bad
            read[columnar] = documents, sorted(rejects)
            assert batches < len(files) / 5 if columnar else batches == len(files) + 2  # careful: a batch a file
        assert read[True] == read[False]
        documents, rejects = read[True]
        assert documents == files
        assert rejects == [
            ("drivers/empty.c", 1, "text length outside [1, no upper limit] characters"),
            ("drivers/latin1.c", 0, "invalid UTF-8 at byte 3"),
        ]
    moved = tmp_path / "elsewhere"
    tree.rename(moved)
    config = make_config([f"{moved}/**/*"], "40KB", tmp_path, id_field=None, format="text")
    assert {i for i, _ in read_all(config, plan_shards(config))[0]} == set(files)


def test_small_files_batches_are_joined_and_a_joined_block_reads_again_alone(tmp_path, monkeypatch):
    """A web crawl's small files: 150 JSONL files of 5 records (one with a record without text, one empty, two of
    one name in two directories, one without its last line ending, one with CRLF endings, one ending in a lone CR,
    one with a blank line, one larger than a batch, one .json of lines and one of an array) and a small Parquet
    file among them. Read on their columns, neighbouring files' bytes are joined and parsed at once (a parse a file
    cost pyarrow's call a file) and other files' batches joined into batches of about `batch_bytes` (a batch a file
    cost the encoder's call a file); the documents, their files and lines, and the rejects are the careful reader's,
    file by file. A joined batch's block is its files' pieces, and read again alone gives its documents again."""
    for f in range(150):
        lines = [{"text": f"file {f} record {r} " + "x" * (f * 31 % 300)} for r in range(40 if f == 70 else 5)]
        if f == 17:
            lines[2] = {"body": "no text"}
        directory = tmp_path / ("b" if f == 40 else "a")
        directory.mkdir(exist_ok=True)
        name = "same.jsonl" if f in (7, 40) else f"part-{f:03d}.json" if f in (60, 61) else f"part-{f:03d}.jsonl"
        data = "" if f == 23 else "".join(json.dumps(line) + "\n" for line in lines)
        data = {
            50: data[:-1],
            51: data.replace("\n", "\r\n"),
            52: data[:-1] + "\r",
            53: data.replace("\n", "\n\n", 1),
        }.get(f, json.dumps(lines, indent=1) if f == 60 else data)
        (directory / name).write_bytes(data.encode())
    pq.write_table(pa.table({"text": [f"row {i}" for i in range(9)]}), tmp_path / "a" / "part-030b.parquet")
    config = make_config([f"{tmp_path}/*/*"], "1GB", tmp_path, id_field=None)
    shards = plan_shards(config).shards
    options = config.input.read_options()
    read, parse = {}, readers._arrow_table
    parses = []
    monkeypatch.setattr(readers, "_arrow_table", lambda block, options: parses.append(block) or parse(block, options))
    for columnar in (False, True):
        parses.clear()
        batches = [(b, bad, s) for s in shards for b, bad in read_documents(s.pieces, options, columnar, 3_000)]
        parsed = len(parses)
        documents = [
            (i, str(text), path, int(line))
            for batch, _, _ in batches
            for i, text, path, line in zip(
                batch.ids, batch.text_values(), batch.doc_files, batch.doc_lines, strict=True
            )
        ]
        rejects = [(r.file, r.line, r.reason) for _, bad, _ in batches for r in bad]
        read[columnar] = documents, rejects
        if columnar:
            joined = [(batch, shard) for batch, _, shard in batches if isinstance(batch.block, list)]
            assert len(batches) < 100 and len(joined) > 10
            assert all(isinstance(batch.ids, readers.LineIds) for batch, _ in joined)  # no string a document
            for batch, shard in joined:
                index = shard.pieces.index(batch.block[0])
                again = readers.block_pieces(shard.pieces, index, *readers.block_place(batch.block), 1, options)
                assert again == batch.block == list(shard.pieces[index : index + len(again)])
                assert [i for b, _ in read_documents(again, options, True, 3_000) for i in b.ids] == list(batch.ids)
    assert read[True] == read[False] and parsed < 90  # 150 files of 1-2 KB, parsed a run of 3 KB at a time
    documents, rejects = read[True]
    assert (
        len(documents) == 149 * 5 + 35 - 1 + 9
        and ("a/same.jsonl:1", "file 7 record 0 " + "x" * 217, str(tmp_path / "a/same.jsonl"), 1) in documents
    )
    assert ("b/same.jsonl:5", "file 40 record 4 " + "x" * (40 * 31 % 300)) in [d[:2] for d in documents]
    assert rejects == [
        ("a/part-017.jsonl", 3, "text field 'text' missing or null"),
        ("a/part-023.jsonl", 0, "empty file: no records"),
    ]


def test_a_text_file_split_by_a_separator_is_read_a_document_at_a_time(tmp_path):
    """TinyStories' layout: a large .txt of stories between `<|endoftext|>` lines. The reader holds a document, not
    the file (the file was read whole, decoded and split: about four times its size); a document that is not
    UTF-8 is a reject naming its first line, and the others are read."""
    import tracemalloc

    story = "Once upon a time there was a little robot. " * 100 + "\nThe end.\n"
    path = tmp_path / "stories.txt"
    path.write_text("".join(story + "<|endoftext|>\n" for _ in range(8000)))
    options = ReadOptions(separator="<|endoftext|>")
    # A first read imports what the reader's checks use (pandera: 22 MB of code objects), which a process that ran
    # no careful read before counted as held
    list(read_documents([Piece(str(path), 0, len(story) + 15)], options))
    tracemalloc.start()
    count = sum(len(batch) for batch, _ in read_documents([Piece(str(path))], options, batch_bytes=1 << 20))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert count == 8000 and peak < path.stat().st_size / 4, f"{peak:,} bytes held reading {path.stat().st_size:,}"
    path.write_bytes(b"a story\n<|endoftext|>\ncaf\xe9 au lait\nmore\n<|endoftext|>\nthe last one\n")
    read = list(read_documents([Piece(str(path))], options))
    assert [t for batch, _ in read for t in batch.texts] == ["a story", "the last one\n"]
    assert [(r.line, r.reason) for _, rejects in read for r in rejects] == [(3, "invalid UTF-8 at byte 3")]


def test_a_large_text_file_is_cut_just_after_separator_lines(tmp_path):
    """A text file split by a separator and larger than a shard is cut like JSONL, but just after separator lines,
    so that every piece holds whole documents, each numbered by its first line (counted at the cuts, with one
    split too): the same documents as the file read whole. One long document spanning a cut moves it to the next
    separator; none after a cut leaves the file whole. A file read as text whatever its name (`input.format`)
    is cut by its separators, or not at all without one, never by its name's lines (each piece was the whole
    file: its document read once a piece)."""
    stories = [f"story {i}\n" + "and then more words.\n" * (i * 37 % 90) for i in range(3000)]
    stories[1500] = "a long one\n" + "line\n" * 60_000  # 300 KB: across several cuts
    path = tmp_path / "stories.txt"
    path.write_text("".join(story + "<|endoftext|>\n" for story in stories))
    config = make_config([str(path)], 100_000, tmp_path, id_field=None, separator="<|endoftext|>")
    plan = plan_shards(config)
    whole = read_all(config, replace(plan, shards=Shards([replace(plan.shards[0], pieces=(Piece(str(path)),))])))
    assert len(whole[0]) == 3000 and not whole[1]
    assert len(plan.shards) > 10 and read_all(config, plan) == whole
    data = path.read_bytes()
    for shard in plan.shards[1:]:
        (piece,) = shard.pieces
        assert (
            data[: piece.start].endswith(b"\n<|endoftext|>\n")
            and piece.first_line == data.count(b"\n", 0, piece.start) + 1
        )
    assert max(s.bytes for s in plan.shards) > 300_000  # the long story's shard

    windows = tmp_path / "windows.txt"  # the same with \r\n line endings: cut at its separator lines too
    windows.write_bytes(data.replace(b"\n", b"\r\n"))
    crlf = make_config([str(windows)], 100_000, tmp_path, id_field=None, separator="<|endoftext|>")
    cut = plan_shards(crlf)
    assert len(cut.shards) > 10 and [t for _, t in read_all(crlf, cut)[0]] == [
        t.replace("\n", "\r\n") for _, t in whole[0]
    ]

    once = make_config([str(path)], 100_000, tmp_path, id_field=None, separator="no such line")
    assert [s.pieces for s in plan_shards(once).shards] == [(Piece(str(path)),)]
    named = tmp_path / "stories.jsonl"
    named.write_bytes(data)
    as_text = make_config([str(named)], 100_000, tmp_path, id_field=None, format="text")
    assert [s.pieces for s in plan_shards(as_text).shards] == [(Piece(str(named)),)]
    docs, _ = read_all(as_text, plan_shards(as_text))
    assert len(docs) == 1 and docs[0][1] == path.read_text()
    separated = as_text.model_copy(update={"input": as_text.input.model_copy(update={"separator": "<|endoftext|>"})})
    assert read_all(separated, plan_shards(separated))[0] == [(i.replace(".txt", ".jsonl"), t) for i, t in whole[0]]


SEPARATED = {  # text files split by "<|endoftext|>" lines, each awkward in its own way
    "clean": "".join(f"story {i}\n" + "words " * (i % 30) + "\n<|endoftext|>\n" for i in range(400)),
    "blank and spaces": "a\n<|endoftext|>\n\n<|endoftext|>\n \t\n<|endoftext|>\n\x1c\u3000\xa0\n<|endoftext|>\nb",
    "not ascii": "\n<|endoftext|>\n".join(["雪が降る", "Ünïcödé", "\u2003", "мир"] * 50),
    "ends at a separator": "one\ntwo\n<|endoftext|>\nthree\n<|endoftext|>",
    "starts at one": "<|endoftext|>\nfirst\n<|endoftext|>\n<|endoftext|>\nlast\n",
    "crlf": "a\r\n<|endoftext|>\r\nb\r\n<|endoftext|>\nc\r\n<|endoftext|>x\r\nd\r\n<|endoftext|>\r",
    "crlf no end": "e\r\n<|endoftext|>\r\nf\r",
    "a bad byte": "good\n<|endoftext|>\n",  # the bad document is appended below
    "too short and long": "\n<|endoftext|>\n".join(["ok text", "x", "y" * 300, "fine again"] * 30),
    "empty": "",
}


@pytest.mark.parametrize("compressed", [False, True])
def test_separated_text_is_read_on_its_columns_as_it_is_record_by_record(tmp_path, compressed):
    """The columnar path reads a text file split by a separator a run of documents at a time and checks them on
    their columns (UTF-8, blank, the length limits); a run with a bad document goes record by record. Either way the
    same documents, lines, bytes and rejects as the careful reader, in batches of 7 bytes and of 1 MB, for the whole
    file and for a piece of it; each batch's block, read alone, gives its documents again."""
    options = ReadOptions(separator="<|endoftext|>", min_chars=2, max_chars=200)
    pieces = []
    for name, text in SEPARATED.items():
        data = text.encode() + (b"caf\xe9\n<|endoftext|>\nafter it\n" if name == "a bad byte" else b"")
        path = tmp_path / (name.replace(" ", "-") + (".txt.gz" if compressed else ".txt"))
        path.write_bytes(gzip.compress(data) if compressed else data)
        pieces.append(Piece(str(path)))
    clean = SEPARATED["clean"].encode()
    if not compressed:  # a piece as the partition cuts it, from its 101st story
        start = [i for i in range(len(clean)) if clean[i - 14 : i] == b"<|endoftext|>\n"][100]
        pieces.append(Piece(pieces[0].path, start, len(clean) - 30, clean.count(b"\n", 0, start) + 1))
    for piece in pieces:
        read = {}
        for columnar, batch_bytes in ((False, 1 << 20), (True, 7), (True, 1 << 20)):
            batches = list(read_documents([piece], options, columnar, batch_bytes))
            documents = [
                (i, str(t), int(line), file)
                for batch, _ in batches
                for i, t, line, file in zip(
                    batch.ids, batch.text_values(), batch.doc_lines, batch.doc_files, strict=True
                )
            ]
            rejects = [(r.file, r.line, r.reason) for _, rejects in batches for r in rejects]
            read[columnar, batch_bytes] = documents, rejects, sum(batch.nbytes for batch, _ in batches)
            if columnar:  # a compressed file's blocks lie in its decompressed stream
                for batch, bad in batches:
                    if batch.block is None:  # an empty file's reject, read by the careful reader
                        assert "empty.txt" in piece.path and [r.reason for r in bad] == ["empty file: no records"]
                        continue
                    again = list(read_documents([batch.block], options, True, batch.block.end - batch.block.start))
                    assert len(again) == 1 and list(again[0][0].ids) == list(batch.ids) and again[0][1] == bad
            if columnar and piece.path.endswith(("clean.txt", "clean.txt.gz")):
                assert all(batch.text_array is not None for batch, _ in batches), piece
        assert read[True, 7] == read[False, 1 << 20] == read[True, 1 << 20], piece
    reads = {
        os.path.basename(p.path).split(".")[0]: read_documents([p], replace(options, min_chars=1, max_chars=None))
        for p in pieces[: -1 if not compressed else None]
    }
    texts = {name: [t for batch, _ in batches for t in batch.texts] for name, batches in reads.items()}
    assert texts["blank-and-spaces"] == ["a", "b"] and texts["ends-at-a-separator"] == ["one\ntwo", "three"]
    assert texts["starts-at-one"] == ["first", "last\n"] and len(texts["not-ascii"]) == 150
    # Windows line endings: a separator line ends with \r\n, and the line break before it is \r\n
    assert texts["crlf"] == ["a", "b", "c\r\n<|endoftext|>x\r\nd"] and texts["crlf-no-end"] == ["e", "f\r"]


def test_plan_is_deterministic_and_reused_while_the_input_is_unchanged(tmp_path):
    write_jsonl(tmp_path / "x.jsonl", 2000)
    config = make_config([str(tmp_path / "*.jsonl")], 25_000, tmp_path)
    assert plan_shards(config) == plan_shards(config)
    first, change = load_or_plan(config)
    assert change == {} and [f["path"] for f in first.files] == [str(tmp_path / "x.jsonl")]
    again, change = load_or_plan(config)
    assert change is None and again == first


def test_a_plan_made_ahead_is_the_partition_stages_result(tmp_path):
    """`tokenmill run` plans while it imports Prefect: the stage's call then returns that plan and what changed
    (a first plan: {}, where planning again would find it recorded: None); a plan that failed ahead fails again in
    the stage's own call; a call with other threads plans for itself."""
    from tokenmill.stages.partition import PlanAhead

    write_jsonl(tmp_path / "x.jsonl", 2000)
    config = make_config([str(tmp_path / "*.jsonl")], 25_000, tmp_path)
    first, change = load_or_plan(config, 2, PlanAhead.start(config, 2))
    assert change == {} and first == plan_shards(config, 2)
    assert load_or_plan(config, 2) == (first, None)  # no plan ahead this time: the recorded one

    missing = make_config([str(tmp_path / "none-*.jsonl")], 25_000, tmp_path / "other")
    with pytest.raises(FileNotFoundError, match="matches no file"):
        load_or_plan(missing, 2, PlanAhead.start(missing, 2))
    with pytest.raises(FileNotFoundError, match="matches no file"):
        load_or_plan(missing, 4, PlanAhead.start(missing, 2))


def test_a_changed_input_gets_a_plan_that_keeps_the_unchanged_shards(tmp_path):
    import os

    from tokenmill.core.commits import commit
    from tokenmill.core.layout import marker

    for name in "abc":
        write_jsonl(tmp_path / f"{name}.jsonl", 300, prefix=name)
    config = make_config([str(tmp_path / "*.jsonl")], 100_000, tmp_path)  # 80 KB files: a shard each
    store = config.output.store()

    def tokenized(plan):  # as if tokenized: a file (its shard's source) and its marker per shard
        for shard in plan.shards:
            rel, data = f"megatron/train/shard-{shard.shard_id:05d}.bin", shard.source.encode()
            store.write_bytes(rel, data)
            result = {"shard_id": shard.shard_id, "source": shard.source}
            commit(store, "tokenize", shard.shard_id, shard.source, result, {rel: store.digest(rel)})

    first, _ = load_or_plan(config)
    ids = {s.pieces[0].path.rsplit("/", 1)[-1]: s.shard_id for s in first.shards}
    assert ids == {"a.jsonl": 0, "b.jsonl": 1, "c.jsonl": 2}
    tokenized(first)

    # b is removed, c replaced with other content, d lands
    (tmp_path / "b.jsonl").unlink()
    write_jsonl(tmp_path / "c.jsonl", 310, prefix="c2")
    os.utime(tmp_path / "c.jsonl", ns=(1, 1))  # a new mtime, as a replaced file has
    write_jsonl(tmp_path / "d.jsonl", 300, prefix="d")
    second, change = load_or_plan(config)
    assert change == {
        "files_added": 1, "files_changed": 1, "files_removed": 1,
        "shards_kept": 1, "shards_renumbered": 0, "shards_new": 2,
    }  # fmt: skip
    by_file = {s.pieces[0].path.rsplit("/", 1)[-1]: s for s in second.shards}
    assert by_file["a.jsonl"] == first.shards[0]  # kept: same id, same source, so its output is reused
    assert (by_file["c.jsonl"].shard_id, by_file["d.jsonl"].shard_id) == (1, 2)  # ids in input order
    assert by_file["c.jsonl"].source != first.shards[2].source
    # the dropped and changed shards' committed outputs are gone, the kept one's stay
    assert store.exists(marker("tokenize", 0)) and store.exists("megatron/train/shard-00000.bin")
    assert not any(store.exists(marker("tokenize", i)) for i in (1, 2))
    assert not store.exists("megatron/train/shard-00001.bin") and not store.exists("megatron/train/shard-00002.bin")
    docs, _ = read_all(config, second)
    assert len(docs) == 300 + 310 + 300 and not any(i.startswith("b") for i, _ in docs)
    tokenized(second)

    # c removed: d's shard moves up to id 1 with its committed file and marker, as a plan of a and d alone has it
    (tmp_path / "c.jsonl").unlink()
    third, change = load_or_plan(config)
    assert [s.shard_id for s in third.shards] == [0, 1]
    assert change == {
        "files_added": 0, "files_changed": 0, "files_removed": 1,
        "shards_kept": 1, "shards_renumbered": 1, "shards_new": 0,
    }  # fmt: skip
    d = by_file["d.jsonl"]
    assert third.shards[1] == replace(d, shard_id=1)
    assert store.read_bytes("megatron/train/shard-00001.bin") == d.source.encode()
    assert store.read_json(marker("tokenize", 1))["result"] == {"shard_id": 1, "source": d.source}
    assert not store.exists("megatron/train/shard-00002.bin") and not store.exists(marker("tokenize", 2))
    fresh = make_config([str(tmp_path / "*.jsonl")], 100_000, tmp_path / "fresh")
    assert plan_shards(fresh).shards == third.shards


def test_small_files_group_by_their_names_so_one_file_landing_changes_one_group(tmp_path):
    """Grouped small files end their groups where hashes of their names say, not where a shard filled up: a
    file landing in the middle of the input changes its own group, and the plan is the one a first run over
    the grown input makes (the same shards, the same ids), whatever came before. The files after the last
    group's end are shards of their own, so a file landing after them is one new shard."""
    names = [f"part-{i:03d}.jsonl" for i in range(0, 200, 2)]
    for name in names:
        write_jsonl(tmp_path / name, 20, prefix=name)  # ~5 KB files, ~20 to a 100 KB shard
    config = make_config([str(tmp_path / "*.jsonl")], 100_000, tmp_path)
    before, _ = load_or_plan(config)
    layout = [(len(s.pieces), s.bytes) for s in before.shards]
    assert [n for n, _ in layout[:6]] == [18, 12, 9, 15, 16, 22]  # half a shard to two: 52 KB to 128 KB
    assert layout[6:] == [(1, 5830)] * 8  # the 8 files after the last group's end stand alone

    write_jsonl(tmp_path / "part-101.jsonl", 20, prefix="new")
    after, change = load_or_plan(config)
    assert change["shards_new"] == 1  # the group the file landed in, made anew; the others kept
    assert change["shards_kept"] + change["shards_renumbered"] == len(after.shards) - 1
    fresh = make_config([str(tmp_path / "*.jsonl")], 100_000, tmp_path / "fresh")
    assert plan_shards(fresh).shards == after.shards

    write_jsonl(tmp_path / "part-200.jsonl", 1, prefix="last")  # 10 bytes: too small to end the files' group
    last, change = load_or_plan(config)
    assert change["shards_new"] == 1 and change["shards_kept"] == len(after.shards)
    assert last.shards[-1].pieces == (Piece(str(tmp_path / "part-200.jsonl")),)


def test_many_tiny_files_make_few_shards(tmp_path):
    """2,000 files of ~110 bytes and 1 MB shards: the files after the last group's end are grouped again at an
    eighth of the size, and again, until at most LOOSE_FILES stand alone; not 2,000 shards of one file."""
    for i in range(2000):
        (tmp_path / f"doc-{i:05d}.jsonl").write_text(json.dumps({"id": str(i), "text": "x" * 90}) + "\n")
    config = make_config([str(tmp_path / "*.jsonl")], 1_000_000, tmp_path)
    shards = plan_shards(config).shards
    loose = [s for s in shards if len(s.pieces) == 1]
    assert len(shards) < 100 and len(loose) <= partition.LOOSE_FILES
    assert sum(len(s.pieces) for s in shards) == 2000


def test_auto_shard_size_follows_corpus_and_cluster_within_its_bounds():
    assert auto_shard_size(1_180_000_000, 2) == 73_750_000  # 8 shards per thread
    assert auto_shard_size(100 * 10**12, 1000) == 10**9  # not 1.6 million shards of 64 MB
    assert auto_shard_size(64_000_000, 64) == 16_000_000  # not below the floor
    assert auto_shard_size(0, 4) == 16_000_000


def test_auto_shard_size_is_kept_by_later_plans_of_the_same_output(tmp_path, monkeypatch):
    monkeypatch.setattr(partition, "MIN_AUTO_SHARD", 1_000)  # small files, as if large
    write_jsonl(tmp_path / "x.jsonl", 2000)
    size = (tmp_path / "x.jsonl").stat().st_size
    config = make_config([str(tmp_path / "*.jsonl")], "auto", tmp_path)
    first, _ = load_or_plan(config, cluster_threads=2)
    assert first.shard_size == -(-size // 16) and len(first.shards) == 16
    # the partition config changes (a new plan), and the run has 4 threads now: the size stays
    changed = config.model_copy(update={"partition": config.partition.model_copy(update={"seed": 1})})
    second, change = load_or_plan(changed, cluster_threads=4)
    assert change is not None and second.shard_size == first.shard_size and second.shards == first.shards
    # an explicit size is used as given
    explicit = config.model_copy(update={"partition": config.partition.model_copy(update={"shard_size": 50_000})})
    third, _ = load_or_plan(explicit, cluster_threads=4)
    assert third.shard_size == 50_000


def test_same_corpus_as_jsonl_compressed_and_parquet_gives_identical_tokens(tmp_path, gpt2_info):
    from tokenmill.stages.tokenize import Tokenizing, tokenize_shard

    rows = [json.loads(line) for line in gzip.open(CORPUS, "rt")]
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    (tmp_path / "c.jsonl").write_bytes(data)
    (tmp_path / "c.jsonl.gz").write_bytes(gzip.compress(data))
    for suffix, compress in COMPRESS.items():
        (tmp_path / f"c.jsonl{suffix}").write_bytes(compress(data))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "c.parquet", row_group_size=64)
    feather.write_feather(pa.Table.from_pylist(rows), tmp_path / "c.arrow", compression="uncompressed")
    outputs = {}
    for name in ("c.jsonl", *(f"c.jsonl{suffix}" for suffix in COMPRESS), "c.parquet", "c.arrow"):
        config = make_config([str(tmp_path / name)], "100MB", tmp_path)
        config.output.path = str(tmp_path / f"out-{name}")
        info = gpt2_info(config)
        (shard,) = plan_shards(config).shards
        result = tokenize_shard(Tokenizing.of(config, info), shard)
        assert result.documents_in == len(rows) == 181 and result.rejected == 0
        outputs[name] = (tmp_path / f"out-{name}/megatron/train/shard-00000.bin").read_bytes()
    assert len(set(outputs.values())) == 1 and len(outputs["c.parquet"]) > 1000


def test_tables_polars_writes_are_read_by_their_columns_and_give_identical_tokens(tmp_path, gpt2_info):
    """polars writes a Parquet file's strings as large strings and an Arrow file's as string views: each is read by its
    columns, ids included (not record by record, a Python string a document: 3.5 times the CPU), as pyarrow's are."""
    import polars as pl

    from tokenmill.stages.tokenize import Tokenizing, tokenize_shard

    rows = [json.loads(line) for line in gzip.open(CORPUS, "rt")]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pl.DataFrame(rows).write_parquet(tmp_path / "c.parquet")
    pl.DataFrame(rows).write_ipc(tmp_path / "c.arrow")
    assert pq.read_schema(tmp_path / "c.parquet").field("id").type == pa.large_string()
    assert feather.read_table(tmp_path / "c.arrow").schema.field("text").type == pa.string_view()
    outputs = {}
    for name in ("c.jsonl", "c.parquet", "c.arrow"):
        config = make_config([str(tmp_path / name)], "100MB", tmp_path)
        config.output.path = str(tmp_path / f"out-{name}")
        (shard,) = plan_shards(config).shards
        batches = [batch for batch, _ in read_documents(shard.pieces, config.input.read_options(), True)]
        assert all(batch.text_array is not None for batch in batches)
        assert [i for batch in batches for i in batch.ids] == [r["id"] for r in rows]
        result = tokenize_shard(Tokenizing.of(config, gpt2_info(config)), shard)
        assert result.documents_in == len(rows) == 181 and result.rejected == 0
        outputs[name] = (tmp_path / f"out-{name}/megatron/train/shard-00000.bin").read_bytes()
    assert len(set(outputs.values())) == 1 and len(outputs["c.arrow"]) > 1000


# Bad input: one test per kind, under both policies.

BAD_LINES = {
    "malformed JSON": (b'{"id": "x", "text": \n', "malformed JSON"),
    "invalid UTF-8": (b'{"id": "x", "text": "caf\xe9"}\n', "invalid UTF-8 at byte"),
    "missing field": (b'{"id": "x", "body": "no text here"}\n', "text field 'text' missing or null"),
    "null text": (b'{"id": "x", "text": null}\n', "text field 'text' missing or null"),
    "text not a string": (b'{"id": "x", "text": 42}\n', "text field 'text' not a string"),
    "missing id": (b'{"text": "no id"}\n', "id field 'id' missing or null"),
    "duplicate id": (b'{"id": "ok1", "text": "again"}\n', "duplicate id in this shard"),
    "empty text": (b'{"id": "x", "text": ""}\n', "text length outside [1,"),
}


def _with_bad_line(tmp_path, bad: bytes):
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b'{"id": "ok1", "text": "fine"}\n' + bad + b'{"id": "ok2", "text": "also fine"}\n')
    return path


@pytest.mark.parametrize("columnar", [False, True], ids=["careful", "fast"])
@pytest.mark.parametrize("kind", BAD_LINES)
def test_bad_record_is_quarantined_with_file_line_and_reason(tmp_path, kind, columnar):
    """Each kind of bad record, read record by record or by the columnar fast path (which must notice it: pyarrow's
    JSON reader, for one, takes invalid UTF-8 into its strings as it is)."""
    bad, reason = BAD_LINES[kind]
    path = _with_bad_line(tmp_path, bad)
    results = list(read_documents([Piece(str(path))], ReadOptions(id_field="id"), columnar))
    ids = [i for batch, _ in results for i in batch.ids]
    rejects = [r.to_dict() for _, rs in results for r in rs]
    assert ids == ["ok1", "ok2"]
    assert [(r["file"], r["line"]) for r in rejects] == [("mixed.jsonl", 2)]
    assert reason in rejects[0]["reason"]


@pytest.mark.parametrize("columnar", [False, True], ids=["careful", "fast"])
@pytest.mark.parametrize("kind", BAD_LINES)
def test_bad_record_fails_the_read_naming_file_line_and_reason(tmp_path, kind, columnar):
    bad, reason = BAD_LINES[kind]
    path = _with_bad_line(tmp_path, bad)
    with pytest.raises(InputError, match=f"mixed.jsonl, line 2: .*{reason[:12]}"):
        list(read_documents([Piece(str(path))], ReadOptions(id_field="id", on_invalid="fail"), columnar))


EDGE_LINES = {
    "NaN in another field": b'{"id": "n", "text": "nan beside", "score": NaN}',
    "-Infinity in another field": b'{"id": "n", "text": "inf beside", "score": [1, -Infinity]}',
    "nested past 1,024 levels": b'{"id": "n", "text": "deep", "x": ' + b"[" * 1100 + b"]" * 1100 + b"}",
    "invalid UTF-8": b'{"id": "n", "text": "caf\xe9"}',
    "a key twice": b'{"id": "n", "text": "first", "text": "last"}',
    "an escaped NUL": b'{"id": "n", "text": "a\\u0000b"}',
    "NaN as the text": b'{"id": "n", "text": NaN}',
    "trailing garbage": b'{"id": "n", "text": "a"} x',
}


@pytest.mark.parametrize("line", EDGE_LINES.values(), ids=EDGE_LINES)
def test_a_records_fate_does_not_depend_on_its_block(tmp_path, line):
    """Where pyarrow's parser (the fast path) and orjson (the careful path) could differ, a record is read the same
    record by record, by the fast path, and by the fast path in a block that a malformed line sends the careful
    way: the same text, or the same reason to reject it."""
    path = tmp_path / "edge.jsonl"
    outcomes = set()
    for neighbour in (b'{"id": "ok", "text": "fine"}', b'{"id": "bad", "text": '):
        path.write_bytes(b"\n".join([neighbour, line, b'{"id": "ok2", "text": "also fine"}']) + b"\n")
        for columnar in (False, True):
            read = list(read_documents([Piece(str(path))], ReadOptions(id_field="id"), columnar))
            texts = {i: str(t) for batch, _ in read for i, t in zip(batch.ids, batch.text_values(), strict=True)}
            reasons = [r.reason.split(":")[0] for _, rejects in read for r in rejects if r.line == 2]
            outcomes.add(texts.get("n", "") + "|".join(reasons))
    assert len(outcomes) == 1, outcomes


def test_ids_from_line_numbers_are_unique_in_a_shard_even_when_two_files_share_a_name(tmp_path):
    """Without an id field a document's id is `<file name>:<line>`: a shard holding two files of the same name
    quarantines the second one's documents as duplicates (the fast path, which skips the check for a file with a
    name of its own, must notice), and reads a file with a name of its own whole, its ids line by line."""
    lines = b"".join(b'{"text": "document %d"}\n' % i for i in range(3))
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    for path in (tmp_path / "a/data.jsonl", tmp_path / "b/data.jsonl", tmp_path / "other.jsonl"):
        path.write_bytes(lines)
    pieces = [Piece(str(tmp_path / p)) for p in ("a/data.jsonl", "other.jsonl", "b/data.jsonl")]
    results = list(read_documents(pieces, ReadOptions(), columnar=True))
    ids = [i for batch, _ in results for i in batch.ids]
    rejects = [(r.file, r.line, r.reason) for _, rs in results for r in rs]
    names = ("data.jsonl", "other.jsonl")
    assert ids == [f"{name}:{n}" for name in names for n in (1, 2, 3)]
    assert rejects == [("data.jsonl", n, "duplicate id in this shard") for n in (1, 2, 3)]


COMPRESS = {".gz": gzip.compress, ".zst": zstandard.compress, ".xz": lzma.compress, ".bz2": bz2.compress}


def _truncated(tmp_path, suffix=".gz", damage=False):
    """A compressed JSONL file cut short (`damage`: with bytes in its middle zeroed, as a bad copy leaves it)."""
    # 1.5 MB that compresses about 2:1, so that zstd's reads (64 KB) and bz2's blocks (900 KB) come before the damage
    words = (" ".join(f"{(i * 2654435761 + k * 40503) % 1000003:x}" for k in range(60)) for i in range(4000))
    lines = "".join(json.dumps({"text": text}) + "\n" for text in words).encode()
    path = tmp_path / f"cut.jsonl{suffix}"
    packed = bytearray(COMPRESS[suffix](lines))
    if damage:
        packed[len(packed) * 2 // 3 : len(packed) * 2 // 3 + 64] = bytes(64)
    path.write_bytes(bytes(packed) if damage else packed[:-300])
    return path


@pytest.mark.parametrize("columnar", [False, True], ids=["careful", "fast"])
def test_truncated_gzip_fails_naming_the_file(tmp_path, columnar):
    with pytest.raises(InputError, match=r"cut.jsonl.gz: cannot be read after \d+ records"):
        list(read_documents([Piece(str(_truncated(tmp_path)))], ReadOptions(on_invalid="fail"), columnar))


@pytest.mark.parametrize(
    "suffix, damage",
    [(s, False) for s in (".gz", ".zst", ".xz", ".bz2")] + [(s, True) for s in (".zst", ".xz", ".bz2")],
)  # gzip decodes a damaged middle into garbage until the CRC at its end: those lines are rejects of their own
def test_a_truncated_compressed_file_is_quarantined_keeping_what_was_readable(tmp_path, suffix, damage):
    """Read record by record or by the columnar path (whose block, read where the stream broke, is lost with it:
    it reads on record by record from the last record it gave), the same records are kept and one reject says where
    reading stopped, and why: for a file cut short or damaged in its middle (bz2's bare OSError named as such)."""
    path = _truncated(tmp_path, suffix, damage)
    read = {}
    for columnar in (False, True):
        results = list(read_documents([Piece(str(path))], ReadOptions(), columnar, batch_bytes=20_000))
        texts = [str(t) for batch, _ in results for t in batch.text_values()]
        rejects = [(r.line, r.reason) for _, rs in results for r in rs]
        assert 500 < len(texts) < 4000 and len(rejects) == 1 and rejects[0][0] == 0, (len(texts), rejects)
        assert rejects[0][1].startswith(f"cannot be read after {len(texts)} records"), rejects
        read[columnar] = texts, rejects
    assert read[True] == read[False]


def test_a_gzip_file_with_data_that_does_not_inflate_is_quarantined_keeping_what_was_readable(tmp_path):
    """gzip is read by ISA-L, whose error for a deflate block that cannot be decoded is not zlib's: a file whose second
    member holds one (a reserved block type) is a reject saying where reading stopped, as a file cut short is."""
    lines = b"".join(b'{"text": "line %d"}\n' % i for i in range(4000))
    path = tmp_path / "bad.jsonl.gz"
    path.write_bytes(gzip.compress(lines) + bytes.fromhex("1f8b0800000000000003") + b"\x07" + bytes(range(256)))
    for columnar in (False, True):
        results = list(read_documents([Piece(str(path))], ReadOptions(), columnar, batch_bytes=20_000))
        texts = [str(t) for batch, _ in results for t in batch.text_values()]
        rejects = [r.reason for _, rs in results for r in rs]
        assert texts == [f"line {i}" for i in range(len(texts))] and 3000 < len(texts) <= 4000, len(texts)
        assert len(rejects) == 1 and rejects[0].startswith(f"cannot be read after {len(texts)} records"), rejects
        assert "Invalid deflate block" in rejects[0], rejects
    with pytest.raises(InputError, match=r"bad.jsonl.gz: cannot be read after \d+ records"):
        list(read_documents([Piece(str(path))], ReadOptions(on_invalid="fail"), True))


def test_empty_file_is_a_clear_error_or_a_reject(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"")
    with pytest.raises(InputError, match="empty.jsonl.*empty file"):
        list(read_documents([Piece(str(path))], ReadOptions(on_invalid="fail")))
    ((batch, rejects),) = read_documents([Piece(str(path))], ReadOptions())
    assert len(batch) == 0 and [r.reason for r in rejects] == ["empty file: no records"]


def test_missing_input_path_names_the_pattern(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        plan_shards(make_config([str(tmp_path / "nothing-here*.jsonl")], 1000, tmp_path))


def test_file_deleted_after_planning_names_the_file(tmp_path):
    path = tmp_path / "gone.jsonl"
    write_jsonl(path, 3)
    piece = Piece(str(path))
    path.unlink()
    with pytest.raises(InputError, match="gone.jsonl: no such file"):
        list(read_documents([piece], ReadOptions()))


def test_missing_parquet_column_names_it(tmp_path):
    pq.write_table(pa.Table.from_pylist([{"body": "x"}]), tmp_path / "t.parquet")
    with pytest.raises(InputError, match="t.parquet: no column 'text'"):
        list(read_documents([Piece(str(tmp_path / "t.parquet"))], ReadOptions()))


def test_size_limit(tmp_path):
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({"text": "a" * 50}) + "\n" + json.dumps({"text": "b" * 5}) + "\n")
    ((batch, rejects),) = read_documents([Piece(str(path))], ReadOptions(max_chars=10))
    assert batch.texts == ["b" * 5] and "at most 10" in rejects[0].reason


def test_the_flows_columnar_shards_read_as_the_plans_list(tmp_path):
    """The flow holds the plan's shards as columns (`Shards`, ~100 bytes a shard, not an object each): every way
    the flow reads them gives what the list of shards gives, and plan.json's form of them goes both ways."""
    data = tmp_path / "x.jsonl"
    data.write_text("".join(f'{{"text": "document {i} {"x" * (i % 50)}"}}\n' for i in range(3000)))
    listed = list(plan_shards(make_config([str(data)], 1000, tmp_path)).shards)
    shards = Shards(listed)
    assert Shards(shards.to_json()) == shards and shards.to_json() == [s.to_json() for s in listed]
    assert len(listed) > 100 and len(shards) == len(listed) and shards == listed and list(shards) == listed
    assert shards[0] == listed[0] and shards[-1] == listed[-1] and shards[57] == listed[57]
    for part in (slice(10, 20), slice(None, None, 7), slice(5, 2), slice(-3, None)):
        assert list(shards[part]) == listed[part]
    with pytest.raises(IndexError):
        shards[len(listed)]
    assert shards.table.nbytes < 200 * len(listed)


def test_an_input_file_that_is_a_link_is_listed_by_a_glob_and_by_its_name(tmp_path):
    """A corpus kept elsewhere and linked into the input directory: a glob's listing describes the link itself, which
    is not a regular file; the input is the file it names, with that file's size."""
    from tokenmill.io.storage import list_files

    elsewhere = tmp_path / "elsewhere" / "real.jsonl"
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(b'{"text": "linked"}\n' * 3)
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "linked.jsonl").symlink_to(elsewhere)
    for pattern in (str(tmp_path / "corpus" / "*.jsonl"), str(tmp_path / "corpus" / "linked.jsonl")):
        (listed,) = list_files([pattern])
        assert listed["path"].endswith("linked.jsonl") and listed["size"] == elsewhere.stat().st_size


def test_a_directory_names_the_data_files_under_it(tmp_path, monkeypatch):
    """A corpus's directory (or an S3 prefix: test_s3) stands for the files under it, at any depth, whose name gives
    their format, compressed or not; not its README, nor anything hidden on the way; a link to a file as that file, a
    link to a directory not followed. One with none is named. The listing (by `os.scandir`) is fsspec's."""
    from tokenmill.io import storage
    from tokenmill.io.storage import list_files

    corpus = tmp_path / "corpus"
    data = ["a.jsonl", "sub/b.jsonl.gz", "sub/deeper/c.parquet", "d.txt", "e.JSON.zst", "f.ndjson", "g.jsonl.xz",
            "h.json.bz2", "sub/linked.jsonl"]  # fmt: skip
    other = ["README.md", "LICENSE", "_SUCCESS", ".hidden.jsonl", ".cache/g.jsonl", "_tmp/h.jsonl", "sub/notes.md",
             "dataset_info.json", "sub/state.json"]  # fmt: skip
    for name in data[:-1] + other:
        (corpus / name).parent.mkdir(parents=True, exist_ok=True)
        (corpus / name).write_bytes(b'{"text": "x"}\n')
    (tmp_path / "elsewhere.jsonl").write_bytes(b'{"text": "linked"}\n')
    (corpus / "sub" / "linked.jsonl").symlink_to(tmp_path / "elsewhere.jsonl")
    (corpus / "sub" / "again").symlink_to(corpus / "sub" / "deeper")
    for directory in (corpus, f"{corpus}/"):
        assert [f["path"] for f in list_files([str(directory)])] == sorted(str(corpus / name) for name in data)
    listed = list_files([str(corpus)])
    assert listed[-1]["size"] == len(b'{"text": "linked"}\n')
    monkeypatch.setattr(storage, "_local_find", lambda root: fsspec.filesystem("file").find(root, detail=True))
    assert list_files([str(corpus)]) == listed  # sizes and modification times as fsspec lists them
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# docs\n")
    said = r"a directory with no \.jsonl, .*\(compressed or not, hidden ones aside; 1 other files\): name other files "
    with pytest.raises(FileNotFoundError, match=said + r"with a glob, e\.g\. '.*/docs/\*\*/\*\.md'"):
        list_files([str(tmp_path / "docs")])


ALPACA = [  # escapes, multi-byte characters and lengths that put a chunk's end anywhere in a record
    {"instruction": f"Say {i} twice.", "input": "", "output": f'{i} {i}\n"twice" \\ é 漢字 ' + "x" * (i * 37 % 300)}
    for i in range(400)
]


@pytest.mark.parametrize("chunk", [1 << 20, 7], ids=["in MB reads", "in 7-byte reads"])
@pytest.mark.parametrize("layout", ["indented", "compact", "gzip", "byte order mark"])
def test_a_json_file_of_one_array_is_read_as_its_records(tmp_path, monkeypatch, layout, chunk):
    """Alpaca's layout: one JSON array in a .json file, pretty-printed or not, compressed or not, after a byte order
    mark or not. Its records are json.load's, numbered by their place in the array, whether read record by record
    or by the fast path's entry, and read a chunk at a time (a record, a character or an escape cut by a chunk's
    end). A small shard size cuts an uncompressed one at records, as it cuts the same records as JSON Lines at
    lines: each piece, read alone, holds the records that start in it, numbered by their place in the array."""
    monkeypatch.setattr(arrays, "CHUNK", chunk)
    data = json.dumps(ALPACA, indent=None if layout == "compact" else 2, ensure_ascii=False).encode()
    data = b"\xef\xbb\xbf" + data if layout == "byte order mark" else data  # as Windows tools write JSON
    path = tmp_path / ("alpaca.json.gz" if layout == "gzip" else "alpaca.json")
    path.write_bytes(gzip.compress(data) if layout == "gzip" else data)
    options = ReadOptions(text_field="output")
    assert readers.holds_array(Piece(str(path)), options)
    for columnar in (False, True):
        read = list(read_documents([Piece(str(path))], options, columnar))
        texts = [t for batch, _ in read for t in batch.text_values()]
        assert [str(t) for t in texts] == [r["output"] for r in ALPACA]
        assert [i for batch, _ in read for i in batch.ids] == [f"{path.name}:{n}" for n in range(1, 401)]
        assert not any(rejects for _, rejects in read)
    lines = tmp_path / "alpaca.jsonl"
    lines.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in ALPACA))
    config = make_config([str(lines)], 10_000, tmp_path, id_field=None, text_field="output")
    assert len(plan_shards(config).shards) > 5
    config = make_config([str(path)], 10_000, tmp_path, id_field=None, text_field="output")
    shards = plan_shards(config).shards
    if layout == "gzip":  # a compressed array is read whole: its records' places are found by reading it
        assert [[(p.start, p.end) for p in s.pieces] for s in shards] == [[(0, None)]]
        return
    assert len(shards) > 5 and all(data[s.pieces[0].start - 1 : s.pieces[0].start] == b"," for s in shards[1:])
    for columnar in (False, True):
        read = [list(read_documents(s.pieces, options, columnar)) for s in shards]
        assert all(read) and not any(rejects for pieces in read for _, rejects in pieces)
        texts = [str(t) for pieces in read for batch, _ in pieces for t in batch.text_values()]
        assert texts == [r["output"] for r in ALPACA]
        ids = [i for pieces in read for batch, _ in pieces for i in batch.ids]
        assert ids == [f"{path.name}:{n}" for n in range(1, 401)]


TRICKY = [  # what the scan must not take for the array's structure
    {"text": 'a "quoted" text, with [brackets] and {braces}, }, {', "n": [1, {"x": "]"}, -2.5e3, None, True]},
    {"text": 'backslashes \\ before quotes \\" and \\\\\\" and at the end \\'},
    {"text": "line\nbreaks\r\n and\ttabs", "nested": {"a": [[], {}], "b": ",", "c": {"d": [{"e": "]"}]}}},
    {"text": "é 漢字 \U0001f600 \u2028", "empty": "", "list": []},
]


@pytest.mark.parametrize("indent", [None, 2, "\t"], ids=["one line", "indented", "tabs"])
def test_the_scan_places_every_record_itself_and_a_piece_from_any_record_reads_alone(tmp_path, monkeypatch, indent):
    """Records whose strings hold brackets, commas, escaped quotes after runs of backslashes, line breaks and
    multi-byte characters, in chunks that cut them anywhere: the vectorized scan places each one itself (json is
    never asked), its line is the record, and the lines keep the file's offsets. The partition's record starts
    (at every 97th byte) each follow a comma, and the stream from one to the next holds exactly those records."""
    records = [dict(r, i=i) for i in range(60) for r in TRICKY[i % 4 : i % 4 + 1]]
    data = json.dumps(records, indent=indent, ensure_ascii=False).encode()
    path = tmp_path / "tricky.json"
    path.write_bytes(data)
    monkeypatch.setattr(arrays, "CHUNK", 173)  # a prime: every record cut somewhere, its pieces scanned again
    monkeypatch.setattr(arrays.ArrayRecords, "_exact", None)  # never called
    with open(path, "rb") as f:
        lines = io.BufferedReader(arrays.ArrayStream(f)).read()
    assert len(lines) <= len(data) and [json.loads(line) for line in lines.splitlines()] == records
    with open(path, "rb") as f:
        starts = arrays.record_starts(f, list(range(97, len(data), 97)))
    assert len(set(starts)) > 30 and all(data[start - 1 : start] == b"," for start, _ in starts)
    bounds = sorted(set(starts))
    for (start, number), (end, following) in zip(bounds, [*bounds[1:], (None, len(records) + 1)], strict=True):
        with open(path, "rb") as f:
            f.seek(start)
            stream = io.BufferedReader(arrays.ArrayStream(f, start, end, number))
            assert stream.read(1) == b"\n"  # the comma before the first record, as the line break it stands for
            read = [json.loads(line) for line in stream.read().splitlines() if line.strip()]
        assert read == records[number - 1 : following - 1]


def test_records_json_parses_and_a_piece_that_does_not_end_at_a_record(tmp_path):
    """Records the scan cannot place (numbers, strings, null) are json's, and the scan takes the ones after them
    again; one that is not JSON is its line (a reject) whichever parser met it first. A piece whose end is not a
    record's start (its file changed since it was cut) is an error saying so."""
    records = [{"text": "a"}, 5, "a string, with [a bracket]", None, {"text": "b"}, [1, 2], {"text": "c"}]
    data = json.dumps(records).encode()
    lines = io.BufferedReader(arrays.ArrayStream(io.BytesIO(data))).read()
    assert [json.loads(line) for line in lines.splitlines() if line.strip()] == records
    lines = io.BufferedReader(arrays.ArrayStream(io.BytesIO(b'[5, 6, {"a" 1}, {"text": "x"}]'))).read()
    assert lines.splitlines()[2:] == [b' {"a" 1}', b' {"text": "x"}']  # json met the third (after two of its own)
    start = data.index(b'{"text": "b"}') - 1  # just after the comma before it
    f = io.BytesIO(data)
    f.seek(start)
    stream = arrays.ArrayStream(f, start, start + 5, 5)
    assert io.BufferedReader(stream).read() == b"\n"
    assert "where this piece of the file ends, is not between two records" in str(stream.error)


BAD_ARRAYS = {  # the file (after `[{"text": "a"}, `): the reject of its one bad record, or the array's error
    "a record that is no object": (b'5, {"text": "c"}]', 2, "not a JSON object (int)"),
    "a raw line break in a string": (b'{"text": "b\nb"}, {"text": "c"}]', 2, "malformed JSON: "),
    "a record that is not JSON": (b'{"text": "b" "x"}, {"text": "c"}]', 2, "malformed JSON: "),
    "a trailing comma": (b'{"text": "b"},]', 0, "JSONArrayError: record 3: Expecting value at byte 30"),
    "no comma": (b'{"text": "b"} {"text": "c"}]', 0, "JSONArrayError: after record 2, at byte 30: expected"),
    "cut short": (b'{"text": "b"}, {"te', 0, "JSONArrayError: record 3: Unterminated string starting at byte 32"),
    "data after it": (b'{"text": "b"}] {"text": "c"}', 0, "JSONArrayError: more than blanks after the array's end"),
}


@pytest.mark.parametrize("rest", BAD_ARRAYS.values(), ids=BAD_ARRAYS)
def test_a_bad_record_or_a_malformed_array_is_a_reject_that_keeps_the_records_before_it(tmp_path, rest):
    """A bad record (not an object, not JSON) is a reject naming its place in the array, and the array is read on;
    where the array itself is malformed (between records, cut short), the records before are kept and the rest is
    one reject saying where."""
    tail, number, reason = rest
    path = tmp_path / "bad.json"
    path.write_bytes(b'[{"text": "a"}, ' + tail)
    for columnar in (False, True):
        read = list(read_documents([Piece(str(path))], ReadOptions(), columnar))
        rejects = [(r.line, r.reason) for _, rs in read for r in rs]
        assert len(rejects) == 1 and rejects[0][0] == number and reason in rejects[0][1], rejects
        texts = [str(t) for batch, _ in read for t in batch.text_values()]
        assert texts == (["a", "c"] if number else ["a", "b"])
        assert number or rejects[0][1].startswith("cannot be read after 2 records")


def test_a_plan_that_cut_a_json_array_at_its_lines_is_made_again_at_its_records(tmp_path, monkeypatch):
    """An earlier tokenmill read a .json file as lines and cut a large one at them; its plan, signed as this user's
    own (whose cuts are otherwise taken unchecked), is not kept for a file that holds an array: it is cut again, at
    records. A plan cut at records is kept."""
    path = tmp_path / "alpaca.json"
    data = json.dumps(ALPACA, indent=2).encode()
    path.write_bytes(data)
    config = make_config([str(path)], 10_000, tmp_path, id_field=None, text_field="output")
    with monkeypatch.context() as m:
        m.setattr(partition, "holds_array", lambda piece, options: False)  # as the earlier tokenmill saw it
        m.setattr(partition, "opens_array", lambda f: False)
        m.setattr(readers, "opens_array", lambda f: False)
        earlier, _ = load_or_plan(config)
    assert len(earlier.shards) > 5 and all(data[s.pieces[0].start - 1] == ord("\n") for s in earlier.shards[1:])
    plan, change = load_or_plan(config)
    assert len(plan.shards) > 5 and all(data[s.pieces[0].start - 1] == ord(",") for s in plan.shards[1:])
    assert change["shards_new"] == len(plan.shards)
    docs, rejects = read_all(config, plan)
    assert [text for _, text in docs] == [r["output"] for r in ALPACA] and not rejects
    (tmp_path / "more.json").write_text(json.dumps(ALPACA[:2]))  # the input changes: the array's cuts are kept
    config = make_config([str(path), str(tmp_path / "more.json")], 10_000, tmp_path, id_field=None, text_field="output")
    monkeypatch.setattr(partition, "record_starts", None)  # not found again by a pass over the file
    again, change = load_or_plan(config)
    assert again.shards[:-1] == plan.shards and change["shards_kept"] == len(plan.shards)
