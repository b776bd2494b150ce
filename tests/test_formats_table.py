"""The one table of formats (`tokenmill/formats/table.py`): what config and layout derive from it, each trainer's
layout's module behind the common interface, and docs/architecture.md's worked example of adding a layout."""

from __future__ import annotations

import types
import typing
from types import SimpleNamespace

import numpy as np
import pytest

from tests.docs_blocks import page_blocks, run_python
from tokenmill.config import OutputConfig
from tokenmill.core import layout
from tokenmill.formats import table
from tokenmill.formats.table import FORMATS, TRAINERS, Format, SplitFound, SplitOut
from tokenmill.io.storage import Store


def test_config_and_layout_take_every_format_from_the_table():
    (literal,) = typing.get_args(OutputConfig.model_fields["formats"].annotation)
    assert typing.get_args(literal) == tuple(FORMATS) == table.NAMES
    assert set(layout.TRAINER_SUFFIXES) == set(TRAINERS) and {"megatron", "packed", "llmc"}.isdisjoint(TRAINERS)
    for name in TRAINERS:
        for suffix, kind in FORMATS[name].files:
            rel = layout.trainer_files(name, "train", 7)[FORMATS[name].suffixes.index(suffix)]
            assert layout.describe(rel) == {"kind": kind, "split": "train", "shard": 7}
    assert set(layout.INDEXED_TRAINERS) == {"litdata", "mds"}
    assert set(layout.MIX_TRAINERS) == {"olmo", "datatrove", "litdata", "hf_parquet", "mds"}
    assert layout.describe("litdata/news/train/index.json")["kind"] == "litdata-index"


@pytest.mark.parametrize("name", TRAINERS)
def test_each_trainer_layout_is_one_module_behind_the_interface(name):
    format, module = FORMATS[name], FORMATS[name].module()
    assert module.__name__ == f"tokenmill.formats.{name}"
    wanted = (
        {"write", "check"} | ({"mix"} if format.mixable else set()) | ({"split_index"} if format.indexed else set())
    )
    assert all(callable(getattr(module, f, None)) for f in wanted), sorted(f for f in wanted if not hasattr(module, f))
    assert not format.indexed or format.made_from == "documents"


def test_what_a_format_cannot_hold_is_refused_by_the_config(tmp_path):
    from pydantic import ValidationError

    from tokenmill.config import TokenmillConfig

    def text_config(*formats):
        output = {"path": str(tmp_path), "formats": ["megatron", *formats]}
        return {"name": "t", "input": {"paths": ["x.jsonl"]}, "tokenizer": {"path": "t.json"}, "output": output}

    with pytest.raises(ValidationError, match="output.formats trl hold conversations or preference pairs"):
        TokenmillConfig.model_validate(text_config("packed", "trl"))
    with pytest.raises(ValidationError, match="output.formats megatron_bridge are made while conversations are packed"):
        TokenmillConfig.model_validate(text_config("megatron_bridge"))


def test_the_worked_example_of_a_new_layout_writes_and_checks(tmp_path):
    module_block, row_block = page_blocks("docs/architecture.md")[:2]
    example = types.ModuleType("u32")
    run_python(module_block, {}, example.__dict__)
    made = eval(row_block.code, {"Format": Format, "TEXT": table.TEXT})  # noqa: S307 (a row of the table)
    assert made.name == "u32" and made.suffixes == (".u32", ".lengths")

    store, files = Store(str(tmp_path)), {}
    tokens, lengths = np.arange(100, dtype=np.uint16), np.array([60, 40])
    rels = [f"u32/train/shard-00000{suffix}" for suffix in made.suffixes]
    out = SplitOut(store, rels, files, tokens, lengths, vocab_size=50257, seq_len=64, tokenizer_name="gpt2")
    example.write(out)
    assert sorted(files) == sorted(rels) and np.fromfile(tmp_path / rels[0], "<u4").tolist() == list(range(100))
    row = SimpleNamespace(tokens=100, documents=2)
    paths = [tmp_path / rel for rel in rels]
    assert example.check(SplitFound(rels, paths, row, np.dtype(np.uint16), 64)) == []
    (tmp_path / rels[0]).write_bytes((tmp_path / rels[0]).read_bytes()[:-4])  # a token short
    assert example.check(SplitFound(rels, paths, row, np.dtype(np.uint16), 64)) == [
        f"{rels[0]}: not the split's 100 uint16 tokens and 2 documents"
    ]
