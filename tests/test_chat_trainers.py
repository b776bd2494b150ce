"""Conversations in each SFT trainer's own layout (docs/chat.md), loaded by the trainer's own code: TRL's collator
over `datasets`' Parquet, OLMo-core's numpy datasets with a label mask (`make trainers`: it needs a venv of its
own), and Megatron-Bridge's packed Parquet, checked against its reader's source (not installable here). Every
conversation of one run over gsm8k (instruction/response pairs) is compared with the Megatron files and the mask
tokenmill stores beside them, which test_chat_flow checks against transformers."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.conftest import CHAT
from tests.docs_blocks import page_blocks, run_python
from tests.test_chat_flow import PHI3, documents, packed_conversations

GSM8K = CHAT / "gsm8k" / "test.jsonl.gz"
RECORDS = 300
SEQ_LEN = 512


@pytest.fixture(scope="module")
def chat_run(run_cli, tmp_path_factory) -> Path:
    """gsm8k's first RECORDS question/answer pairs (see its SOURCE.md) as phi3 conversations, in every layout."""
    root = tmp_path_factory.mktemp("trainers")
    with gzip.open(GSM8K, "rt") as f:
        (root / "gsm8k.jsonl").write_text("".join(next(f) for _ in range(RECORDS)))
    config = {
        "name": "gsm8k",
        "input": {
            "paths": [str(root / "gsm8k.jsonl")],
            "chat": {"format": "prompt_completion", "prompt_fields": ["question"], "completion_field": "answer"},
        },
        "tokenizer": {"path": str(PHI3), "eod": "auto"},
        "pack": {"seq_len": SEQ_LEN},
        "output": {"path": str(root / "out"), "formats": ["megatron", "packed", "trl", "megatron_bridge", "olmo"]},
    }
    (root / "gsm8k.yaml").write_text(json.dumps(config))
    run_cli("run", str(root / "gsm8k.yaml"))
    return root / "out"


def test_trl_loads_the_rows_and_its_collator_keeps_the_loss_on_the_mask(chat_run):
    """`datasets.load_dataset("parquet")`, then TRL's own collator with padding-free position ids: the labels of
    every conversation are its ids where tokenmill's mask is 1, -100 elsewhere (TRL's model shifts them)."""
    from datasets import load_dataset
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    ids, masks = documents(chat_run)
    dataset = load_dataset("parquet", data_dir=str(chat_run / "trl" / "train"), split="train")
    assert len(dataset) == len(ids) == RECORDS  # none of gsm8k's pairs is longer than a row
    collate = DataCollatorForLanguageModeling(pad_token_id=32000, padding_free=True)
    for start in range(0, len(dataset), 32):
        batch = collate([dataset[i] for i in range(start, min(start + 32, len(dataset)))])
        stored = range(start, min(start + 32, len(dataset)))
        flat = np.concatenate([ids[i] for i in stored])
        labels = np.concatenate([np.where(masks[i] == 1, ids[i].astype(np.int64), -100) for i in stored])
        assert np.array_equal(batch["input_ids"][0].numpy(), flat)
        assert np.array_equal(batch["labels"][0].numpy(), labels)
        starts = np.cumsum([0] + [len(ids[i]) for i in stored])[:-1]
        assert np.array_equal(np.flatnonzero(batch["position_ids"][0].numpy() == 0), starts)


def test_the_chat_pages_trl_snippet_loads_the_rows(chat_run):
    """docs/chat.md's `load_dataset` for TRL as it is (TRL's trainer, which needs a model, is shown only)."""
    load = next(b for b in page_blocks("docs/chat.md") if b.marker and "trl/train" in b.code)
    train = run_python(load, {"out/sft-mix/<version>": str(chat_run)})["train"]
    ids, _ = documents(chat_run)
    assert [row["input_ids"] for row in train] == [i.tolist() for i in ids]


def test_megatron_bridges_packed_parquet_is_what_its_reader_takes(chat_run):
    """Megatron-Bridge's `GPTSFTPackedParquetDataset` is only on its GitHub main (PyPI's megatron-bridge 0.3.1 has
    no Parquet reader, and main needs a megatron-core newer than PyPI's): the layout is checked against its reader's
    source (`src/megatron/bridge/data/packing/parquet.py` at 067f987df03b). Its collate takes, per conversation
    [s, e) of a row, inputs ids[s:e-1], labels ids[s+1:e] and loss_mask[s:e-1]: so the targets that carry loss
    there must be exactly the tokens of tokenmill's packed mask, and seq_start_id each conversation's start."""
    table = pq.read_table(chat_run / "megatron_bridge" / "train" / "shard-00000.parquet").to_pylist()
    packed_ids, packed_masks = packed_conversations(chat_run)
    conversations = iter(zip(packed_ids, packed_masks, strict=True))
    assert {column for row in table for column in row} == {"input_ids", "loss_mask", "seq_start_id"}
    for row in table:
        bounds = [*row["seq_start_id"], len(row["input_ids"])]  # the reader appends the row's length
        assert bounds[0] == 0
        for s, e in zip(bounds[:-1], bounds[1:], strict=True):
            tokens, mask = next(conversations)
            labels, loss_mask = row["input_ids"][s + 1 : e], row["loss_mask"][s : e - 1]
            assert row["input_ids"][s:e] == tokens.tolist()
            assert [t for t, m in zip(labels, loss_mask, strict=True) if m] == tokens[1:][mask[1:] == 1].tolist()
    assert next(conversations, None) is None


@pytest.mark.trainers
def test_olmo_core_reads_the_tokens_with_the_label_mask(chat_run, tmp_path, monkeypatch):
    """OLMo-core's padded and packed numpy datasets over `olmo/<split>/*.npy`, their documents from the `.csv.gz`
    (phi3's <|end|> ends every turn, so EOS positions cannot tell conversations apart), with the Megatron
    `.loss_mask.bin` as `label_mask_paths`: one instance per conversation, its label mask tokenmill's."""
    from olmo_core.data import NumpyPackedFSLDataset, NumpyPaddedFSLDataset

    monkeypatch.setenv("OLMO_DATA_PREP_WORKERS", "1")
    monkeypatch.setenv("OLMO_DATA_PREP_USE_ARRAY_IF_LOCAL", "false")  # the .csv.gz, not EOS in the array
    ids, masks = documents(chat_run)
    tokens, mask = (
        chat_run / "olmo" / "train" / "shard-00000.npy",
        chat_run / "megatron" / "train" / "shard-00000.loss_mask.bin",
    )
    options = {"pad_token_id": 32000, "eos_token_id": 32000, "vocab_size": 32064, "dtype": np.uint16}
    padded = NumpyPaddedFSLDataset(str(tokens), sequence_length=SEQ_LEN, label_mask_paths=[str(mask)], **options)
    padded.work_dir = tmp_path / "padded"
    padded.prepare()
    assert len(padded) == len(ids)
    for i, (stored, stored_mask) in enumerate(zip(ids, masks, strict=True)):
        instance = padded[i]
        assert np.array_equal(instance["input_ids"][: len(stored)].numpy(), stored)
        assert np.array_equal(instance["label_mask"][: len(stored)].numpy(), stored_mask.astype(bool))
        assert not instance["label_mask"][len(stored) :].any()
    packed = NumpyPackedFSLDataset(
        str(tokens), sequence_length=SEQ_LEN, label_mask_paths=[str(mask)], generate_doc_lengths=True, **options
    )
    packed.work_dir = tmp_path / "packed"
    packed.prepare()
    supervised = sum(int(packed[i]["label_mask"].sum()) for i in range(len(packed)))
    assert supervised == sum(int(m.sum()) for m in masks)


@pytest.mark.trainers
def test_the_chat_pages_olmo_core_snippet_reads_a_conversation_with_its_mask(chat_run, tmp_path, monkeypatch):
    """docs/chat.md's OLMo-core snippet as it is (prepared before its first index), with the page's setting."""
    monkeypatch.setenv("OLMO_DATA_PREP_WORKERS", "1")
    monkeypatch.setenv("OLMO_DATA_PREP_USE_ARRAY_IF_LOCAL", "false")
    snippet = next(b for b in page_blocks("docs/chat.md") if "olmo_core" in b.code)
    replaced = {"out/sft-mix/<version>": str(chat_run), "/tmp/olmo-work": str(tmp_path / "work")}
    conversation = run_python(snippet, replaced)["conversation"]
    (first, *_), (mask, *_) = documents(chat_run)
    assert np.array_equal(conversation["input_ids"][: len(first)].numpy(), first)
    assert np.array_equal(conversation["label_mask"][: len(first)].numpy(), mask.astype(bool))
