"""Conversations through the real CLI, Prefect and Dask (docs/chat.md): the ids transformers' apply_chat_template
gives, the loss mask its own `{% generation %}` template gives, validate's mask check on every conversation (and
stopping on a planted wrong mask), bad records quarantined by file and line, conversations longer than a row
dropped, truncated or split and counted, and the packed rows' objective the unpacked one."""

from __future__ import annotations

import collections
import gzip
import hashlib
import json
from datetime import date
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tokenmill.formats.megatron import MegatronReader
from tokenmill.formats.packed import PackedReader
from tokenmill.loader import PackedSplit

from .conftest import CHAT, EXAMPLES, TOKENIZERS

PHI3, GRANITE = TOKENIZERS / "phi3-mini", TOKENIZERS / "granite-3.1"
SGD = EXAMPLES / "chat" / "sgd_dialogues_500.jsonl.gz"  # the first 500 of sgd-dialogues (its SOURCE.md)
CONVERSATIONS = 150
TODAY = date(2026, 1, 15)


@pytest.fixture(scope="module")
def sgd(tmp_path_factory) -> Path:
    """The first CONVERSATIONS dialogues of sgd-dialogues (see its SOURCE.md), as JSONL."""
    path = tmp_path_factory.mktemp("sgd") / "sgd.jsonl"
    with gzip.open(SGD, "rt") as f:
        path.write_text("".join(next(f) for _ in range(CONVERSATIONS)))
    return path


@pytest.fixture(scope="module")
def transformers_tokenizers():
    """transformers' own tokenizers, with the date its templates write pinned to TODAY."""
    from transformers import AutoTokenizer
    from transformers.utils import chat_template_utils as rendering

    class _Today(rendering.datetime):
        @classmethod
        def now(cls, tz=None):
            return cls(TODAY.year, TODAY.month, TODAY.day)

    clock, rendering.datetime = rendering.datetime, _Today  # strftime_now reads `datetime` when it runs
    yield {directory: AutoTokenizer.from_pretrained(str(directory)) for directory in (PHI3, GRANITE)}
    rendering.datetime = clock


def chat_config(tmp_path: Path, paths: list[Path], tokenizer: Path, **chat) -> Path:
    config = {
        "name": "chat",
        "input": {"paths": [str(p) for p in paths], "chat": chat},
        "tokenizer": {"path": str(tokenizer), "eod": "auto", "check_fraction": 1.0},  # validate checks each one
        "pack": {"seq_len": 1024},
        "output": {"path": str(tmp_path / "out")},
    }
    path = tmp_path / "chat.yaml"
    path.write_text(json.dumps(config))
    return path


def documents(out: Path, split: str = "train", shard: int = 0) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each conversation's stored ids and loss mask, in order."""
    prefix = out / "megatron" / split / f"shard-{shard:05d}"
    reader = MegatronReader(prefix)
    mask = np.fromfile(f"{prefix}.loss_mask.bin", dtype=np.uint8)
    starts = np.concatenate(([0], np.cumsum(reader.index.lengths)))
    return [reader[i] for i in range(len(reader))], [mask[a:b] for a, b in zip(starts[:-1], starts[1:], strict=True)]


def test_ids_are_apply_chat_templates_and_the_mask_its_generation_tagged_templates(
    run_cli, sgd, tmp_path, transformers_tokenizers
):
    """phi3's template has no {% generation %} tags; TRL's phi3_training.jinja is the same template with them, and
    its assistant mask is what transformers trains on: tokenmill's mask, found without tags, is that one."""
    run_cli("run", str(chat_config(tmp_path, [sgd], PHI3)))
    out = tmp_path / "out"
    ids, masks = documents(out)
    theirs, tagged = transformers_tokenizers[PHI3], (PHI3 / "phi3_training.jinja").read_text()
    records = [json.loads(line) for line in sgd.read_text().splitlines()]
    assert len(ids) == len(records) == CONVERSATIONS
    for record, stored, mask in zip(records, ids, masks, strict=True):
        encoded = theirs.apply_chat_template(
            record["messages"], chat_template=tagged, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        assert stored.tolist() == theirs.apply_chat_template(record["messages"], tokenize=True)["input_ids"]
        assert stored.tolist() == encoded["input_ids"]
        assert mask.tolist() == encoded["assistant_masks"]
    split, loss = PackedSplit(out, "train"), np.load(out / "packed" / "train" / "shard-00000.loss.npy")
    samples = [split[i] for i in range(len(split))]
    assert sum(int((s["labels"] != -100).sum()) for s in samples) == int(loss.sum())  # the loader's labels: the mask's
    check = json.loads((out / "_work" / "reference_check.json").read_text())
    assert check["documents"] == CONVERSATIONS and check["mismatches"] == 0  # each mask decoded and checked
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["encoder"]["name"] == "gigatoken"  # the fast path: its ids, and masks from where they lie
    template = manifest["tokenizer"]["chat_templates"][""]  # the dataset carries the template it was rendered with
    assert template["end_of_turn"] == "<|end|>\n" and template["date"] is None
    config_template = json.loads((PHI3 / "tokenizer_config.json").read_text())["chat_template"]
    assert (out / "chat" / "LATEST").exists() and (out / template["path"]).read_text() == config_template
    train = manifest["splits"]["train"]
    assert train["supervised_tokens"] == sum(int(m.sum()) for m in masks)
    assert 0.3 < train["supervised_share"] < 0.7


def test_validate_passes_transformers_masks_where_answers_begin_with_spaces_or_hold_special_tokens_text(
    run_cli, sgd, tmp_path, transformers_tokenizers
):
    """Conversations real corpora hold, which a check by decoding the masked tokens refused although their masks
    were transformers': answers that begin or end with whitespace (phi3's `<|assistant|>` absorbs it), that hold a
    special token's text followed by a space, and assistant turns in a row. Every conversation is checked
    (`check_fraction: 1`), the run publishes, and each stored mask is transformers' own."""
    turns = [
        ["  Hey, sorry, I cannot help with that."],
        ["Sure.  \n"],
        ["I write <|end|> and then stop"],
        ["One.", "Two.", " Three "],
        ["\n\nx\n", "\t z <|user|> y"],
    ]
    edges = [[{"role": "user", "content": "Can you help?"}] + [{"role": "assistant", "content": a} for a in t]
             for t in turns]  # fmt: skip
    path = tmp_path / "edges.jsonl"
    path.write_text("".join(json.dumps({"messages": m}) + "\n" for m in edges) + sgd.read_text())  # one shard
    run_cli("run", str(chat_config(tmp_path, [path], PHI3)))
    out = tmp_path / "out"
    check = json.loads((out / "_work" / "reference_check.json").read_text())
    assert check["documents"] == CONVERSATIONS + len(edges) and check["mismatches"] == 0
    assert (out / "manifest.json").exists()
    theirs, tagged = transformers_tokenizers[PHI3], (PHI3 / "phi3_training.jinja").read_text()
    expected = {}
    for messages in edges:
        encoded = theirs.apply_chat_template(
            messages, chat_template=tagged, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        expected[tuple(encoded["input_ids"])] = encoded["assistant_masks"]
    stored = {tuple(ids.tolist()): mask.tolist() for ids, mask in zip(*documents(out), strict=True)}
    assert {ids: stored[ids] for ids in expected} == expected


def test_a_template_that_writes_the_date_renders_the_pinned_one(run_cli, sgd, tmp_path, transformers_tokenizers):
    """Granite's template writes today's date into its default system prompt: without `chat.date` the run is
    refused (its tokens would change every day); with it, the ids are transformers' on that date."""
    template = GRANITE / "granite_3_1_chat_template.jinja"
    refused = run_cli("run", str(chat_config(tmp_path, [sgd], GRANITE, template=str(template))), check=False)
    assert refused.returncode != 0 and "strftime_now" in refused.stderr and "input.chat.date" in refused.stderr
    run_cli("run", str(chat_config(tmp_path, [sgd], GRANITE, template=str(template), date=TODAY.isoformat())))
    ids, masks = documents(tmp_path / "out")
    theirs = transformers_tokenizers[GRANITE]
    for line, stored in zip(sgd.read_text().splitlines(), ids, strict=True):
        messages = json.loads(line)["messages"]
        assert stored.tolist() == theirs.apply_chat_template(messages, chat_template=template.read_text())["input_ids"]
    assert all(0 < m.sum() < len(m) for m in masks)


def objective(tokens: list[np.ndarray], masks: list[np.ndarray]) -> collections.Counter:
    """The multiset of what the loss is computed on: (the conversation, the position, the target token) for each
    target that carries loss, its context being the conversation's tokens before it."""
    pairs = collections.Counter()
    for ids, mask in zip(tokens, masks, strict=True):
        conversation = hashlib.sha256(ids.astype(np.int64).tobytes()).hexdigest()
        pairs.update((conversation, int(t), int(ids[t])) for t in np.flatnonzero(mask) if t > 0)
    return pairs


def packed_conversations(out: Path, split: str = "train") -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The conversations of the packed rows (cut at their cu_seqlens), with the packed loss mask alike."""
    prefix = out / "packed" / split / "shard-00000"
    packed, loss = PackedReader(prefix), np.load(f"{prefix}.loss.npy")
    tokens, masks = [], []
    for i in range(len(packed)):
        row, cu = packed[i]
        for a, b in zip(cu[:-1], cu[1:], strict=True):
            tokens.append(row[a:b])
            masks.append(loss[i, a:b])
    return tokens, masks


@pytest.mark.parametrize("policy", ["drop", "truncate", "split"])
def test_conversations_longer_than_a_row_are_counted_and_packing_keeps_the_objective(run_cli, sgd, tmp_path, policy):
    """With rows shorter than many conversations: each policy counts them, the stats reconcile (validate), and
    the packed rows' loss is the unpacked conversations' (as the policy made them), no token's loss across a
    boundary; a changed seq_len or policy reuses the tokenized shard."""
    config = chat_config(tmp_path, [sgd], PHI3)
    run_cli("run", str(config))
    result = run_cli("run", str(config), "--set", "pack.seq_len=256", "--set", f"pack.too_long={policy}")
    assert "(1 reused)" in result.stdout  # only the packing was redone
    out = tmp_path / "out"
    ids, masks = documents(out)
    longer = [(i, m) for i, m in zip(ids, masks, strict=True) if len(i) > 256]
    train = json.loads((out / "manifest.json").read_text())["splits"]["train"]
    assert train["too_long"] == len(longer) > 0
    # the terminal's summary says it too, beside the tokens that carry loss
    rows = [line.split("│") for line in result.stdout.splitlines() if "│" in line]  # metric, train, ...
    shown = {row[1].strip(): row[2].strip() for row in rows}
    assert shown["too long"] == f"{len(longer):,}"
    assert shown["supervised tokens (loss)"] == f"{train['supervised_tokens']:,}"
    if policy == "drop":
        kept = [(i, m) for i, m in zip(ids, masks, strict=True) if len(i) <= 256]
    elif policy == "truncate":
        kept = [(i[:256], m[:256]) for i, m in zip(ids, masks, strict=True)]
    else:
        kept = [
            (i[a : a + 256], m[a : a + 256]) for i, m in zip(ids, masks, strict=True) for a in range(0, len(i), 256)
        ]
    assert train["tokens_cut"] == sum(map(len, ids)) - sum(len(i) for i, _ in kept)
    packed_ids, packed_masks = packed_conversations(out)
    assert sorted(map(bytes, packed_ids)) == sorted(bytes(i) for i, _ in kept)
    assert objective(packed_ids, packed_masks) == objective(*zip(*kept, strict=True))
    assert all(m[0] == 0 for m in packed_masks)  # a conversation's first token is nobody's target


def test_bad_records_are_quarantined_by_file_line_and_field(run_cli, sgd, tmp_path):
    good = json.loads(sgd.read_text().splitlines()[0])
    records = [
        good,
        {"id": "no-messages", "text": "hello"},
        {"messages": [{"role": "human", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "  "}]},
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": 7}]},
        {"messages": [{"role": "user", "content": "hi"}, {"role": "tool", "content": "42"}, good["messages"][1]]},
        {"messages": "hello"},
        {"messages": {"role": "user", "content": "hi"}},
    ]
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    run_cli("run", str(chat_config(tmp_path, [path], PHI3)))
    rejects = [
        json.loads(line) for line in (tmp_path / "out" / "rejects" / "shard-00000.jsonl").read_text().splitlines()
    ]
    reasons = {r["line"]: r["reason"] for r in rejects}
    assert {r["file"] for r in rejects} == {"bad.jsonl"}
    assert reasons[2] == "no 'messages' (a list of turns)"
    assert "messages[0]: unknown role 'human'" in reasons[3]
    assert "messages[1]: an empty assistant turn" in reasons[4]
    assert "messages[1]: content is a number, not a string" in reasons[5]
    assert "renders message 1 (tool) 0 times" in reasons[6]  # phi3's template drops tool turns: not a hole
    assert reasons[7] == "'messages' is a string ('hello'), not a list of turns"
    assert reasons[8] == "'messages' is an object, not a list of turns"
    assert len(documents(tmp_path / "out")[0]) == 1
    failed = run_cli("run", str(chat_config(tmp_path, [path], PHI3)), "--set", "input.on_invalid=fail",
                     "--set", f"output.path={tmp_path / 'fail'}", check=False)  # fmt: skip
    assert failed.returncode != 0 and "bad.jsonl, line 2: no 'messages'" in failed.stderr


@pytest.mark.parametrize("planted", ["all ones", "one token later"])
def test_validate_stops_on_a_planted_wrong_mask(run_cli, sgd, tmp_path, planted):
    """A mask of all ones (what Megatron-Bridge falls back to) or shifted by one token, with stats made to agree
    with it: only checking each token against the assistant spans can tell, and validate does, naming the file,
    so nothing is published."""
    from tokenmill.config import load_config
    from tokenmill.core.plan import Plan
    from tokenmill.core.stats import COLUMNS, ValidationFailed
    from tokenmill.stages.train_tokenizer import install_pretrained
    from tokenmill.stages.validate import validate

    path = chat_config(tmp_path, [sgd], PHI3)
    run_cli("run", str(path))
    config = load_config(path)
    store, mask_file = config.output.store(), tmp_path / "out" / "megatron" / "train" / "shard-00000.loss_mask.bin"
    table = pd.DataFrame(json.loads((tmp_path / "out" / "stats.json").read_text()))[COLUMNS]
    tokenizer, plan = install_pretrained(config), Plan.read(store)
    validate(config, plan, tokenizer, table)  # as the run left it: sound
    mask = np.fromfile(mask_file, dtype=np.uint8)
    wrong = np.ones_like(mask) if planted == "all ones" else np.roll(mask, 1)
    mask_file.write_bytes(wrong.tobytes())
    table.loc[table.split == "train", "supervised_tokens"] = int(wrong.sum())
    with pytest.raises(ValidationFailed, match="loss masks are not their assistant turns") as failed:
        validate(config, plan, tokenizer, table)
    assert "megatron/train/shard-00000.loss_mask.bin: conversation" in str(failed.value)


def test_a_chat_source_mixed_with_text_is_drawn_in_its_share(run_cli, sgd, tmp_path):
    """Conversations beside pretraining text in one mixture, one tokenizer: the packed loader's mix draws each
    source's real tokens within 1% of its resolved share, the conversations with their loss masks."""
    from tokenmill.loader import PackedSplit

    config = {
        "name": "sft-mix",
        "sources": [
            {"name": "chat", "input": {"paths": [str(sgd)], "chat": {}}, "weight": 0.3},
            {"name": "wiki", "input": {"paths": [str(Path("examples/data/wikitext2_raw_test.jsonl").absolute())]},
             "weight": 0.7},
        ],
        "tokenizer": {"path": str(PHI3), "eod": "auto"},
        "pack": {"mode": "concat", "seq_len": 1024},
        "output": {"path": str(tmp_path / "out")},
    }  # fmt: skip
    path = tmp_path / "mix.yaml"
    path.write_text(json.dumps(config))
    run_cli("run", str(path))
    out = tmp_path / "out"
    manifest = json.loads((out / "manifest.json").read_text())
    shares = {name: s["share"] for name, s in manifest["mix"]["sources"].items()}
    assert shares == pytest.approx({"chat": 0.3, "wiki": 0.7})
    plan = json.loads((out / "plan.json").read_text())
    source_of = {s["shard_id"]: s["mix_source"] for s in plan["shards"]}
    mixed, index = PackedSplit(out, "train"), np.load(out / "mix" / "packed" / "train.npy")
    drawn = collections.Counter()
    for i, (shard, _) in enumerate(index):
        _, boundaries = mixed.row(i)
        drawn[source_of[int(shard)]] += int(boundaries[-1])  # the row's real tokens
        if source_of[int(shard)] == "chat":  # its labels follow its loss mask: fewer than its tokens
            assert (mixed[i]["labels"] != -100).sum() < boundaries[-1]
    total = sum(drawn.values())
    for name, share in shares.items():
        assert drawn[name] / total == pytest.approx(share, rel=0.01), drawn


def test_a_template_whose_assistant_turns_cannot_be_found_stops_the_run_before_any_shard(run_cli, sgd, tmp_path):
    """A template that does not write the assistant's content as it is: no mask can be right, so none is made (not
    all ones, not all zeros); the run stops naming the template and why."""
    template = tmp_path / "hides.jinja"
    template.write_text("{% for m in messages %}<|{{ m.role }}|>{{ 'OK' if m.role == 'assistant' else m.content }}"
                        "<|end|>{% endfor %}")  # fmt: skip
    result = run_cli("run", str(chat_config(tmp_path, [sgd], PHI3, template=str(template))), check=False)
    assert result.returncode != 0
    assert f"chat template {template}: an assistant content appears 0 times" in result.stderr
    assert not (tmp_path / "out" / "megatron").exists()


def test_the_bundled_chat_example_runs_as_a_newcomer_runs_it(run_cli, tmp_path):
    """examples/chat.yaml, as the README says to run it: its report gives the supervised share of each split."""
    result = run_cli("run", "examples/chat.yaml", "--set", f"output.path={tmp_path / 'out'}")
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["counts"]["documents_out"] == 500 and manifest["counts"]["documents_rejected"] == 0
    assert {f["kind"] for f in manifest["files"]} >= {"megatron-loss-mask", "packed-loss", "trl", "olmo-tokens"}
    summary = (tmp_path / "out" / "report" / "summary.md").read_text()
    share = manifest["splits"]["train"]["supervised_share"]
    assert f"| train | {manifest['splits']['train']['documents']:,} |" in summary and f"{share:.2%}" in summary
    assert "supervised share" in summary and result.returncode == 0


def test_conversations_in_parquet_are_read_as_in_jsonl(run_cli, sgd, tmp_path, transformers_tokenizers):
    """A Parquet file of the same records (its messages a list of structs): the ids are apply_chat_template's."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = [json.loads(line) for line in sgd.read_text().splitlines()[:40]]
    path = tmp_path / "sgd.parquet"
    pq.write_table(pa.Table.from_pylist(records), path, row_group_size=16)
    run_cli("run", str(chat_config(tmp_path, [path], PHI3)))
    ids, masks = documents(tmp_path / "out")
    theirs = transformers_tokenizers[PHI3]
    assert [i.tolist() for i in ids] == [theirs.apply_chat_template(r["messages"])["input_ids"] for r in records]
    assert all(0 < m.sum() < len(m) for m in masks)


def test_alpaca_records_in_a_json_array_file_are_read_as_json_lines_would_be(
    run_cli, tmp_path, transformers_tokenizers
):
    """Alpaca's layout as GPTeacher ships it: one JSON array a file, indented, plain or gzipped. Each record is a
    conversation (the user's instruction and input, the assistant's response) whose ids are apply_chat_template's,
    in the array's order, the plain file cut into shards at records; a record without its response is quarantined
    by its place in the array."""
    with gzip.open(CHAT / "gpteacher-alpaca" / "codegen-instruct.json.gz", "rt") as f:
        records = json.load(f)[:120]
    plain, packed = tmp_path / "a.json", tmp_path / "b.json.gz"
    plain.write_text(json.dumps(records[:60] + [{"instruction": "no response"}], indent=4))
    packed.write_bytes(gzip.compress(json.dumps(records[60:], indent=4).encode()))
    prompt_completion = {"prompt_fields": ["instruction", "input"], "completion_field": "response"}
    config = chat_config(tmp_path, [plain, packed], PHI3, format="prompt_completion", **prompt_completion)
    config.write_text(json.dumps(json.loads(config.read_text()) | {"partition": {"shard_size": 8_000}}))
    run_cli("run", str(config))
    out, theirs = tmp_path / "out", transformers_tokenizers[PHI3]
    plan = json.loads((out / "plan.json").read_text())
    assert len([shard for shard in plan["shards"] if shard["pieces"][0]["path"].endswith("a.json")]) > 2
    stored = [ids for shard in range(len(plan["shards"])) for ids in documents(out, shard=shard)[0]]
    expected = []
    for r in records:
        user = r["instruction"] + (f"\n\n{r['input']}" if r["input"] else "")
        messages = [{"role": "user", "content": user}, {"role": "assistant", "content": r["response"]}]
        expected.append(theirs.apply_chat_template(messages, tokenize=True)["input_ids"])
    assert [ids.tolist() for ids in stored] == expected
    rejects = [json.loads(line) for path in out.glob("rejects/*.jsonl") for line in path.read_text().splitlines()]
    assert [(r["file"], r["line"]) for r in rejects] == [("a.json", 61)]
    assert "response" in rejects[0]["reason"]
