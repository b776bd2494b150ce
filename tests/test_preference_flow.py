"""Preference pairs through the real CLI, Prefect and Dask (docs/chat.md, Preference pairs): the pairs of
tests/data/preference (HH-RLHF's conversations, the TL;DR comparisons' plain text) stored as TRL's own DPO
preprocessing tokenizes them, each a Megatron document of two sequences with its loss on the completions; pairs longer
than max_length dropped or cut as TRL does and counted; packed whole (read back through tokenmill.loader); TRL's
tokenized DPO columns loaded with `datasets` and passed through TRL's own collator; bad records quarantined with
what is wrong; a planted all-ones mask or half a pair stops validate."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tokenmill.formats.megatron import MegatronReader
from tokenmill.formats.provenance import read_documents_table, write_documents_table
from tokenmill.loader import IGNORE_INDEX, PackedSplit

from .docs_blocks import page_blocks, run_python

DATA = Path(__file__).parent / "data" / "preference"
HH = DATA / "hh-rlhf-helpful-base" / "helpful_base_test_messages.first300.jsonl.gz"
TLDR = DATA / "summarize-from-feedback-tldr" / "tldr_comparisons.first200.jsonl.gz"
PHI3 = Path(__file__).parents[1] / "examples" / "tokenizers" / "phi3-mini"
PAD = 32000  # phi3's <|endoftext|>: its EOS pads the packed rows


def read(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f]


def pair_config(tmp_path: Path, paths: list[Path], seq_len: int = 1024, formats=("megatron", "packed", "trl"),
                **preference) -> Path:  # fmt: skip
    config = {
        "name": "dpo",
        "input": {"paths": [str(p) for p in paths], "id_field": "id", "preference": preference},
        "split": {"train": 0.9, "validation": 0.1},
        "tokenizer": {"path": str(PHI3), "eod": "auto", "check_fraction": 1.0},  # validate checks each pair
        "pack": {"seq_len": seq_len},
        "output": {"path": str(tmp_path / "out"), "formats": list(formats)},
    }
    path = tmp_path / "dpo.yaml"
    path.write_text(json.dumps(config))
    return path


def trl_tokenized(records: list[dict], tmp_path: Path) -> dict[str, tuple[list, list, list]]:
    """TRL's own DPO preprocessing of the records (DPOTrainer._prepare_dataset, as its trainer runs it on a
    dataset) with transformers' phi3 tokenizer and its template: each id -> (prompt_ids, chosen_ids, rejected_ids)."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(str(PHI3))
    args = DPOConfig(output_dir=str(tmp_path / "dpo"), max_length=None, report_to=[], use_cpu=True, bf16=False)
    trainer = SimpleNamespace(_tokenizer=tokenizer)  # what the step reads of the trainer: its tokenizer's EOS
    ids = [r["id"] for r in records]
    dataset = DPOTrainer._prepare_dataset(trainer, Dataset.from_list(records), tokenizer, args, "train")
    rows = dataset.select_columns(["prompt_ids", "chosen_ids", "rejected_ids"]).to_list()
    return {i: (r["prompt_ids"], r["chosen_ids"], r["rejected_ids"]) for i, r in zip(ids, rows, strict=True)}


def stored_pairs(
    out: Path, under: str = "megatron"
) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Each stored pair by id, from every split's Megatron files (`under` the output: a mixture source's are under
    megatron/<source>): (chosen sequence, its mask, rejected, its mask)."""
    found = {}
    for prefix in sorted((out / under).glob("*/shard-00000.idx")):
        prefix = prefix.with_suffix("")
        reader = MegatronReader(prefix)
        assert reader.index.document_indices.tolist() == list(range(0, len(reader) + 1, 2))  # a pair: two sequences
        mask = np.fromfile(f"{prefix}.loss_mask.bin", dtype=np.uint8)
        starts = np.concatenate(([0], np.cumsum(reader.index.lengths, dtype=np.int64)))
        ids = read_documents_table(f"{prefix}.docs.parquet", ["id"]).column("id").to_pylist()
        assert len(ids) == len(reader) // 2
        for k, pair_id in enumerate(ids):
            sides = [(reader[s], mask[starts[s] : starts[s + 1]]) for s in (2 * k, 2 * k + 1)]
            found[pair_id] = (*sides[0], *sides[1])
    return found


def test_pairs_are_stored_as_trls_dpo_preprocessing_packed_whole_and_load_in_trls_collator(run_cli, tmp_path):
    """HH-RLHF's 300 pairs: every pair's two stored sequences are TRL's prompt_ids + chosen_ids and prompt_ids +
    rejected_ids, the loss on the completion's tokens only; with max_length 512 (half a row of 1024) the pairs
    with a longer side are dropped whole and counted; the packed rows hold each kept pair whole, its chosen then its
    rejected sequence as segments of their own, the labels -100 on the prompts (tokenmill.loader); TRL's tokenized
    columns hold the kept pairs, and TRL's DataCollatorForPreference makes its batch of them."""
    from datasets import load_dataset
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    records = read(HH)
    run_cli("run", str(pair_config(tmp_path, [HH])))
    out = tmp_path / "out"
    theirs, stored = trl_tokenized(records, tmp_path), stored_pairs(out)
    assert stored.keys() == theirs.keys() and len(stored) == 300
    for pair_id, (prompt, chosen, rejected) in theirs.items():
        chosen_ids, chosen_mask, rejected_ids, rejected_mask = stored[pair_id]
        assert chosen_ids.tolist() == prompt + chosen and rejected_ids.tolist() == prompt + rejected, pair_id
        assert chosen_mask.tolist() == [0] * len(prompt) + [1] * len(chosen)
        assert rejected_mask.tolist() == [0] * len(prompt) + [1] * len(rejected)

    kept = {i: t for i, t in theirs.items() if len(t[0]) + max(len(t[1]), len(t[2])) <= 512}
    manifest = json.loads((out / "manifest.json").read_text())
    assert sum(s["too_long"] for s in manifest["splits"].values()) == len(theirs) - len(kept) > 0
    assert sum(s["tokens_cut"] for s in manifest["splits"].values()) == sum(
        2 * len(p) + len(c) + len(r) for i, (p, c, r) in theirs.items() if i not in kept
    )

    packed = Counter()
    for split in ("train", "validation"):
        for sample in PackedSplit(out, split):
            labels = sample["labels"]
            for (a, b), (c, d) in sample["pairs"].tolist():  # never half a pair: each chosen, then its rejected
                assert b == c
                assert sample["position_ids"][a:b].tolist() == list(range(b - a))
                assert sample["position_ids"][c:d].tolist() == list(range(d - c))
                packed[(tuple(sample["input_ids"][a:b].tolist()), tuple(sample["input_ids"][c:d].tolist()))] += 1
                assert labels[b - 1] == IGNORE_INDEX and labels[d - 1] == IGNORE_INDEX  # nothing across a boundary
                # a label is the next token where that one carries loss: the completion's, never the prompt's
                targets = np.flatnonzero(labels[a:b] != IGNORE_INDEX) + 1
                prompt = next(len(p) for p, c, _ in kept.values() if (p + c) == sample["input_ids"][a:b].tolist())
                assert targets.min() == prompt and len(targets) == b - a - prompt
    assert packed == Counter((tuple(p + c), tuple(p + r)) for p, c, r in kept.values())

    rows = load_dataset("parquet", data_dir=str(out / "trl" / "train"), split="train").to_list()
    rows += load_dataset("parquet", data_dir=str(out / "trl" / "validation"), split="train").to_list()
    assert sorted(map(str, rows)) == sorted(
        str({"prompt_ids": p, "chosen_ids": c, "rejected_ids": r}) for p, c, r in kept.values()
    )
    batch = DataCollatorForPreference(pad_token_id=PAD)(rows[:4])
    for k, row in enumerate(rows[:4]):  # the collator's rows: each pair's chosen sequences first, then its rejected
        for side, at in (("chosen_ids", k), ("rejected_ids", 4 + k)):
            sequence = row["prompt_ids"] + row[side]
            assert batch["input_ids"][at][: len(sequence)].tolist() == sequence
            assert batch["completion_mask"][at][: len(sequence)].tolist() == [0] * len(row["prompt_ids"]) + [1] * len(
                row[side]
            )
    (block,) = [b for b in page_blocks("docs/chat.md") if "DataCollatorForPreference" in b.code]  # docs/chat.md's
    assert len(run_python(block, {"out/dpo/<version>": str(out)})["batch"]["input_ids"]) == 16  # 8 pairs, 2 sides


def test_plain_text_pairs_in_parquet_with_an_implicit_prompt_are_cut_as_trls_collator_cuts(run_cli, tmp_path):
    """The TL;DR comparisons as plain text in TRL's implicit-prompt form (chosen and rejected whole, the prompt
    their common start), in Parquet: ids as TRL's preprocessing gives them (its extract_prompt, the EOS appended);
    with too_long: truncate each side longer than max_length is cut to its first max_length tokens, as TRL's
    collator cuts it, both sides of the pair kept."""
    records = [{"id": r["id"], "chosen": r["prompt"] + r["chosen"], "rejected": r["prompt"] + r["rejected"]}
               for r in read(TLDR)]  # fmt: skip
    path = tmp_path / "tldr.parquet"
    pq.write_table(pa.Table.from_pylist(records), path)
    run_cli("run", str(pair_config(tmp_path, [path], seq_len=768, max_length=320, too_long="truncate")))
    out = tmp_path / "out"
    theirs, stored = trl_tokenized(records, tmp_path), stored_pairs(out)
    assert stored.keys() == theirs.keys() and len(stored) == 200
    for pair_id, (prompt, chosen, rejected) in theirs.items():
        assert stored[pair_id][0].tolist() == prompt + chosen and stored[pair_id][2].tolist() == prompt + rejected
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    collate = DataCollatorForPreference(pad_token_id=PAD, max_length=320)
    expected = Counter()
    for p, c, r in theirs.values():
        if len(p) >= 320:  # TRL's filter: no completion token would remain
            continue
        batch = collate([{"prompt_ids": p, "chosen_ids": c, "rejected_ids": r}])
        chosen, rejected = (row[row_mask.bool()].tolist() for row, row_mask in
                            zip(batch["input_ids"], batch["attention_mask"], strict=True))  # fmt: skip
        expected[(tuple(chosen), tuple(rejected))] += 1
    rows = pd.concat([pd.read_parquet(out / "trl" / split) for split in ("train", "validation")])
    got = Counter((tuple(p) + tuple(c), tuple(p) + tuple(r)) for p, c, r in rows.itertuples(index=False))
    assert got == Counter({(tuple(map(int, a)), tuple(map(int, b))): n for (a, b), n in expected.items()})
    manifest = json.loads((out / "manifest.json").read_text())
    cut = sum(len(p) + max(len(c), len(r)) > 320 for p, c, r in theirs.values())
    assert sum(s["too_long"] for s in manifest["splits"].values()) == cut > 0


def test_plain_text_pairs_need_no_chat_template(run_cli, tmp_path):
    """A base model's tokenizer without a chat template (phi3's, its template taken out): the TL;DR comparisons as
    plain text are tokenized as TRL does with it (its EOS appended to each completion), and a conversational pair is
    refused saying why."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    base = tmp_path / "base-tokenizer"
    base.mkdir()
    (base / "tokenizer.json").write_bytes((PHI3 / "tokenizer.json").read_bytes())
    settings = json.loads((PHI3 / "tokenizer_config.json").read_text())
    del settings["chat_template"]
    (base / "tokenizer_config.json").write_text(json.dumps(settings))
    records = [{k: r[k] for k in ("id", "prompt", "chosen", "rejected")} for r in read(TLDR)[:50]]
    hh = read(HH)[0]
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [*records, hh]))
    config = json.loads(pair_config(tmp_path, [path]).read_text())
    config["tokenizer"]["path"] = str(base)
    (tmp_path / "dpo.yaml").write_text(json.dumps(config))
    run_cli("run", str(tmp_path / "dpo.yaml"))

    tokenizer = AutoTokenizer.from_pretrained(str(base))
    args = DPOConfig(output_dir=str(tmp_path / "dpo"), max_length=None, report_to=[], use_cpu=True, bf16=False)
    prepared = DPOTrainer._prepare_dataset(SimpleNamespace(_tokenizer=tokenizer), Dataset.from_list(records),
                                           tokenizer, args, "train")  # fmt: skip
    stored = stored_pairs(tmp_path / "out")
    assert len(stored) == len(records)
    for record, row in zip(records, prepared.to_list(), strict=True):
        assert stored[record["id"]][0].tolist() == row["prompt_ids"] + row["chosen_ids"]
        assert stored[record["id"]][2].tolist() == row["prompt_ids"] + row["rejected_ids"]
        assert row["chosen_ids"][-1] == tokenizer.eos_token_id
    (reject,) = [json.loads(line) for line in (tmp_path / "out" / "rejects" / "shard-00000.jsonl").open()]
    assert reject["line"] == 51 and reject["reason"].startswith("a conversational pair needs a chat template")


def test_bad_records_are_quarantined_saying_what_is_wrong(run_cli, tmp_path):
    good = read(HH)[0]
    user = {"role": "user", "content": "Hi"}
    records = [
        good,
        {"id": "no-chosen", "prompt": [user], "rejected": [{"role": "assistant", "content": "no"}]},
        {"id": "mixed", "prompt": [user], "chosen": "yes", "rejected": "no"},
        {"id": "role", "prompt": [user], "chosen": [{"role": "bot", "content": "yes"}], "rejected": []},
        {"id": "no-start", "chosen": "Yes.", "rejected": "No."},
        {"id": "number", "prompt": "Hi", "chosen": 3, "rejected": "no"},
    ]
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    run_cli("run", str(pair_config(tmp_path, [path])))
    rejects = [
        json.loads(line) for line in (tmp_path / "out" / "rejects" / "shard-00000.jsonl").read_text().splitlines()
    ]
    reasons = {r["line"]: r["reason"] for r in rejects}
    assert {r["file"] for r in rejects} == {"bad.jsonl"} and len(stored_pairs(tmp_path / "out")) == 1
    assert reasons[2] == "no 'chosen' (the chosen completion: a list of messages or a string)"
    assert reasons[3] == "'prompt' is a list but 'chosen' is a string ('yes'): all lists of messages, or all strings"
    assert "chosen[0]: unknown role 'bot'" in reasons[4]
    assert reasons[5].startswith("'chosen' and 'rejected' share no start, so no prompt")
    assert reasons[6].startswith("'chosen' is a number, not a list of messages or a string")
    explicit = run_cli("run", str(pair_config(tmp_path, [path], form="explicit")), "--set", "input.on_invalid=fail",
                       "--set", f"output.path={tmp_path / 'fail'}", check=False)  # fmt: skip
    assert explicit.returncode != 0 and "line 2: no 'chosen' (the chosen completion" in explicit.stderr


@pytest.fixture(scope="module")
def hh_run(run_cli, tmp_path_factory) -> Path:
    """A run of HH-RLHF's pairs, left as it finished (a test copies it before changing it)."""
    tmp_path = tmp_path_factory.mktemp("hh-run")
    run_cli("run", str(pair_config(tmp_path, [HH])))
    return tmp_path / "out"


@pytest.mark.parametrize("planted", ["all ones", "half a pair"])
def test_validate_stops_on_a_planted_all_ones_mask_or_half_a_pair(hh_run, tmp_path, planted):
    """With the stats made to agree, only checking each sampled pair can tell: a mask of all ones (the prompt's
    tokens with loss), or a pair whose rejected sequence is another pair's (so half of each), stops validate naming
    the pair, and nothing is published."""
    import shutil

    from tokenmill.config import load_config
    from tokenmill.core.plan import Plan
    from tokenmill.core.stats import COLUMNS, ValidationFailed
    from tokenmill.formats.megatron import write_index
    from tokenmill.stages.train_tokenizer import install_pretrained
    from tokenmill.stages.validate import validate

    shutil.copytree(hh_run, tmp_path / "out")
    config = load_config(pair_config(tmp_path, [HH]))
    prefix = tmp_path / "out" / "megatron" / "train" / "shard-00000"
    table = pd.DataFrame(json.loads((tmp_path / "out" / "stats.json").read_text()))[COLUMNS]
    tokenizer, plan = install_pretrained(config), Plan.read(config.output.store())
    validate(config, plan, tokenizer, table)  # as the run left it: sound
    if planted == "all ones":
        mask_file = Path(f"{prefix}.loss_mask.bin")
        mask_file.write_bytes(np.ones(len(np.fromfile(mask_file, np.uint8)), np.uint8).tobytes())
        table.loc[table.split == "train", "supervised_tokens"] = int(table[table.split == "train"].tokens.iloc[0])
        said = "outside the completion (the prompt) but with loss"
    else:  # the first two pairs' rejected sequences swapped: the same tokens, lengths and counts
        reader = MegatronReader(prefix)
        sequences = [reader[k] for k in range(len(reader))]
        mask = np.fromfile(f"{prefix}.loss_mask.bin", np.uint8)
        starts = np.concatenate(([0], np.cumsum(reader.index.lengths, dtype=np.int64)))
        masks = [mask[a:b] for a, b in zip(starts[:-1], starts[1:], strict=True)]
        order = [0, 3, 2, 1, *range(4, len(sequences))]
        del reader
        Path(f"{prefix}.bin").write_bytes(np.concatenate([sequences[k] for k in order]).tobytes())
        Path(f"{prefix}.loss_mask.bin").write_bytes(np.concatenate([masks[k] for k in order]).tobytes())
        lengths = np.array([len(sequences[k]) for k in order])
        write_index(f"{prefix}.idx", lengths, sequences[0].dtype, 2)
        documents = read_documents_table(f"{prefix}.docs.parquet")  # its rows tile the pairs' new lengths
        pairs = lengths[0::2] + lengths[1::2]
        documents = documents.set_column(documents.schema.get_field_index("token_length"), "token_length",
                                         pa.array(pairs.astype(np.int32)))  # fmt: skip
        documents = documents.set_column(documents.schema.get_field_index("token_offset"), "token_offset",
                                         pa.array(np.cumsum(pairs) - pairs))  # fmt: skip
        write_documents_table(f"{prefix}.docs.parquet", [documents])
        said = "rejected: its"
    with pytest.raises(ValidationFailed, match="sampled pairs are not their prompt and completions") as failed:
        validate(config, plan, tokenizer, table)
    assert "megatron/train/shard-00000.bin: pair" in str(failed.value) and said in str(failed.value)


def test_pairs_read_from_s3_are_a_source_of_a_mixture_beside_text(run_cli, s3_server, hh_run, tmp_path):
    """HH-RLHF's pairs on S3 as one source of a mixture, Wikitext beside them, one tokenizer: the pairs are stored
    as a local run stores them (its validation pairs merged for Megatron still documents of two sequences), and the
    mix draws each source's real tokens in its share, rows of pairs with labels on their completions only."""
    import boto3

    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="pairs")
    s3.upload_file(str(HH), "pairs", f"hh/{HH.name}")
    wiki = Path(__file__).parents[1] / "examples" / "data" / "wikitext2_raw_test.jsonl"
    config = {
        "name": "dpo-mix",
        "sources": [
            {"name": "pairs", "input": {"paths": [f"s3://pairs/hh/{HH.name}"], "id_field": "id", "preference": {}},
             "weight": 0.4},
            {"name": "wiki", "input": {"paths": [str(wiki)]}, "weight": 0.6},
        ],
        "split": {"train": 0.9, "validation": 0.1},
        "tokenizer": {"path": str(PHI3), "eod": "auto"},
        "pack": {"mode": "concat", "seq_len": 4096},  # max_length 2048: no pair too long (a share counts them)
        "output": {"path": str(tmp_path / "out")},
    }  # fmt: skip
    path = tmp_path / "mix.yaml"
    path.write_text(json.dumps(config))
    run_cli("run", str(path))
    out = tmp_path / "out"
    stored, alone = stored_pairs(out, "megatron/pairs"), stored_pairs(hh_run)
    assert stored.keys() == alone.keys() and len(stored) == 300
    assert all(all(map(np.array_equal, stored[i], alone[i])) for i in stored)
    merged = MegatronReader(out / "mix" / "megatron" / "validation" / "pairs")
    assert merged.index.document_indices.tolist() == list(range(0, len(merged) + 1, 2)) and len(merged) > 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["splits"]["pairs/train"]["too_long"] == 0
    shares = {name: s["share"] for name, s in manifest["mix"]["sources"].items()}
    assert shares == pytest.approx({"pairs": 0.4, "wiki": 0.6})
    plan = json.loads((out / "plan.json").read_text())
    source_of = {s["shard_id"]: s["mix_source"] for s in plan["shards"]}
    mixed, index = PackedSplit(out, "train"), np.load(out / "mix" / "packed" / "train.npy")
    drawn = Counter()
    for i, (shard, _) in enumerate(index):
        _, boundaries = mixed.row(i)
        drawn[source_of[int(shard)]] += int(boundaries[-1])
        sample = mixed[i]
        assert ("pairs" in sample) == (source_of[int(shard)] == "pairs")
        if "pairs" in sample:  # whole pairs, the labels on their completions only
            assert sample["pairs"][-1, 1, 1] == boundaries[-1] and (sample["labels"] != IGNORE_INDEX).sum() < len(
                sample["labels"][: boundaries[-1]]
            )
    total = sum(drawn.values())
    for name, share in shares.items():
        assert drawn[name] / total == pytest.approx(share, rel=0.01), drawn
