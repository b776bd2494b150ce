"""tokenmill.tokenizers.preference against TRL itself: every pair of tests/data/preference (HH-RLHF's conversations,
the TL;DR summaries' plain text), in each of TRL's preference formats (explicit prompt, implicit prompt), gives the
prompt, chosen and rejected ids that TRL's own DPO preprocessing (`DPOTrainer._prepare_dataset`, run here on a
`datasets.Dataset`) gives with the same tokenizer and template; a pair longer than `max_length` is dropped or cut
as TRL's filter and collator do, never one side only; records that make no pair are refused naming the field."""

from __future__ import annotations

import copy
import gzip
import itertools
import json
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest

from tokenmill.core import packers
from tokenmill.tokenizers import chat, preference
from tokenmill.tokenizers.preference import PairFormat

from .conftest import DATA
from .test_chat import TEMPLATES, ours
from .test_chat_flow import transformers_tokenizers  # noqa: F401 (a fixture)

PREFERENCE = DATA / "preference"  # slices of ../shared/corpora/preference (their SOURCE.md)
HH = PREFERENCE / "hh-rlhf-helpful-base/helpful_base_test_messages.first300.jsonl.gz"
TLDR = PREFERENCE / "summarize-from-feedback-tldr/tldr_comparisons.first200.jsonl.gz"


@pytest.fixture(scope="module")
def reference(transformers_tokenizers):  # noqa: F811 (the fixture imported above)
    """transformers' tokenizers (AutoTokenizer, as a trainer loads them), the date templates write pinned to TODAY."""
    return transformers_tokenizers


def read(path, limit: int | None = None) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for i, line in enumerate(f) if limit is None or i < limit]


def explicit(records: list[dict]) -> list[dict]:
    """TRL's explicit-prompt form: prompt, chosen, rejected."""
    return [{key: r[key] for key in ("prompt", "chosen", "rejected")} for r in records]


def implicit(records: list[dict]) -> list[dict]:
    """TRL's implicit-prompt form: chosen and rejected whole, the prompt their shared start."""
    return [{"chosen": r["prompt"] + r["chosen"], "rejected": r["prompt"] + r["rejected"]} for r in records]


def trl_tokenized(records: list[dict], name: str, reference, tmp_path) -> list[dict]:
    """TRL's own DPO preprocessing of the records (its prompt extraction, EOS and tokenization), as DPOTrainer runs
    it on a dataset, with the tokenizer transformers loads and the template `name`."""
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    tokenizer = copy.copy(reference[TEMPLATES[name][0]])
    tokenizer.chat_template = TEMPLATES[name][1]

    args = DPOConfig(output_dir=str(tmp_path / "dpo"), max_length=None, report_to=[], use_cpu=True, bf16=False)
    trainer = SimpleNamespace(_tokenizer=tokenizer)  # what the step reads of the trainer: its tokenizer's EOS
    dataset = DPOTrainer._prepare_dataset(trainer, Dataset.from_list(records), tokenizer, args, "train")
    return dataset.select_columns(["prompt_ids", "chosen_ids", "rejected_ids"]).to_list()


def ours_tokenized(records: list[dict], name: str, reference) -> list[preference.TokenizedPair]:
    template, tokenizer = ours(name, reference)
    eos = template.variables["eos_token"]
    return [preference.tokenize_pair(preference.to_pair(r), tokenizer, template, eos) for r in records]


def assert_same(theirs: list[dict], ours: list[preference.TokenizedPair], records: list[dict]) -> None:
    assert len(theirs) == len(ours) == len(records)
    for trl, pair, record in zip(theirs, ours, records, strict=True):
        got = {"prompt_ids": pair.prompt.tolist(), "chosen_ids": pair.chosen.tolist()}
        got["rejected_ids"] = pair.rejected.tolist()
        assert got == trl, record
        assert len(pair.chosen) and len(pair.rejected)  # a completion always has a token: its end at least


@pytest.mark.parametrize("form", [explicit, implicit])
@pytest.mark.parametrize("name", ["phi3", "granite"])
def test_every_conversational_pair_tokenizes_as_trls_dpo_preprocessing(name, form, reference, tmp_path):
    """HH-RLHF's first 300 pairs (multi-turn prompts, empty and identical replies among them), as message lists with
    the prompt given or implicit, rendered with phi3's or Granite's template."""
    records = form(read(HH))
    theirs = trl_tokenized(records, name, reference, tmp_path)
    assert_same(theirs, ours_tokenized(records, name, reference), records)


@pytest.mark.parametrize("form", [explicit, implicit])
@pytest.mark.parametrize("name", ["phi3", "granite"])
def test_every_plain_text_pair_tokenizes_as_trls_dpo_preprocessing(name, form, reference, tmp_path):
    """The TL;DR comparisons' first 200 pairs as plain text (each summary starting with a space): the tokenizer's own
    special tokens added, the EOS appended to each completion; with the prompt implicit, TRL's prompt is the
    characters the two share, less a space it ends with."""
    records = form(read(TLDR))
    theirs = trl_tokenized(records, name, reference, tmp_path)
    assert_same(theirs, ours_tokenized(records, name, reference), records)


@pytest.mark.parametrize("around", [False, True])
def test_pairs_encoded_by_the_runs_fast_encoder_have_the_references_ids(around, reference):
    """The tokenize stage encodes pairs with the run's encoder (the fastest exact backend, chosen and guarded as for
    any input): every pair's sequences, masks and prompt length are those of HF tokenizers (the tests above check
    those against TRL), conversational and plain text, with the prompt given or implicit; `around`: the tokenizer's
    post-processor puts a BOS and an EOS around every text (as a Llama 2 tokenizer's does), which a plain-text pair
    gets as `tokenizer(text)` gives it, and a rendered conversation does not."""
    from tokenizers.processors import TemplateProcessing

    from tokenmill.tokenizers.encoders import build_encoder, choose_encoder

    template, tokenizer = ours("phi3", reference)
    if around:
        bos, eos = tokenizer.token_to_id("<s>"), tokenizer.token_to_id("</s>")
        tokenizer.post_processor = TemplateProcessing(
            single="<s> $A </s>", special_tokens=[("<s>", bos), ("</s>", eos)]
        )
        assert [a.tolist() for a in preference.special_ends(tokenizer)] == [[bos], [eos]]
    pairs = [
        preference.pair_texts(preference.to_pair(record), template, template.variables["eos_token"])
        for records in (read(HH), read(TLDR))
        for record in (*explicit(records), *implicit(records))
    ]
    data = tokenizer.to_str().encode()
    choice, _ = choose_encoder(data, "auto", [pair.text for pair in pairs])
    assert choice.backend != "hf"  # a fast backend, or this test tests nothing
    fast = preference.encode_pairs(pairs, preference.encoder_encode(build_encoder(data, choice), tokenizer))
    exact = preference.encode_pairs(pairs, preference.tokenizer_encode(tokenizer))
    for got, wanted in zip(fast, exact, strict=True):
        np.testing.assert_array_equal(got, wanted)
    tokens, _, lengths, _ = exact
    last = tokens[len(tokens) - lengths[-1] :]  # the last pair's rejected sequence: TL;DR's plain text
    assert (last[0] == tokenizer.token_to_id("<s>"), last[-1] == tokenizer.token_to_id("</s>")) == (around, around)


def test_the_implicit_prompt_is_trls_extract_prompt():
    from trl.data_utils import extract_prompt

    user = {"role": "user", "content": "Hi"}
    cases = [
        ([user, {"role": "assistant", "content": "A"}], [user, {"role": "assistant", "content": "B"}]),
        ([user, {"role": "assistant", "content": "A"}], [user, {"role": "assistant", "content": "A"}]),  # the same
        ([user, {"role": "assistant", "content": "A"}, user], [user, {"role": "assistant", "content": "A"}]),
        ("The sky is blue.", "The sky is green."),
        ("Say yes: yes", "Say yes: no"),  # a space before the completion goes with it
        ("TL;DR: I", "TL;DR: I"),
    ]
    for chosen, rejected in cases:
        theirs = extract_prompt({"chosen": chosen, "rejected": rejected})
        got = preference.extract_prompt(chosen, rejected)
        assert got == (theirs["prompt"], theirs["chosen"], theirs["rejected"])
    assert preference.extract_prompt("Say yes: yes", "Say yes: no") == ("Say yes:", " yes", " no")


@pytest.mark.parametrize(
    ("record", "said"),
    [
        ({"prompt": "Hi", "rejected": "no"}, r"^no 'chosen' \(the chosen completion: a list of messages or a string\)"),
        ({"prompt": "Hi", "chosen": 3, "rejected": "no"}, r"^'chosen' is a number, not a list of messages or a"),
        ({"prompt": "Hi", "chosen": [{"role": "assistant", "content": "yes"}], "rejected": "no"},
         r"^'chosen' is a list but 'rejected' is a string \('no'\)$"),
        ({"prompt": [{"role": "user", "content": "Hi"}], "chosen": "yes", "rejected": "no"},
         r"^'prompt' is a list but 'chosen' is a string \('yes'\): all lists of messages, or all strings$"),
        ({"prompt": "Hi", "chosen": [{"role": "bot", "content": "yes"}], "rejected": []}, r"chosen\[0\]: unknown role"),
        ({"chosen": "Yes.", "rejected": "No."}, r"^'chosen' and 'rejected' share no start, so no prompt"),
        ({"chosen": "", "rejected": "No."}, r"^'chosen' or 'rejected' is empty: no prompt to extract$"),
    ],
)  # fmt: skip
def test_a_record_that_makes_no_pair_is_refused_naming_its_field(record, said):
    with pytest.raises(chat.ChatError, match=said):
        preference.to_pair(record)


def test_field_names_are_configurable():
    record = {"question": "2+2?", "good": " 4", "bad": " 5"}
    pair = preference.to_pair(record, PairFormat(prompt_field="question", chosen_field="good", rejected_field="bad"))
    assert pair == preference.Pair("2+2?", " 4", " 5")


@pytest.mark.parametrize("max_length", [48, 128, 512])
def test_a_pair_longer_than_max_length_is_dropped_or_cut_as_trl_does_never_one_side(max_length, reference):
    """TRL drops a pair whose prompt alone fills `max_length` and its collator cuts each side (prompt and
    completion) to its first `max_length` tokens: `truncate` gives the sequences its collator gives; `drop` drops
    the pairs that `truncate` would cut, whole."""
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    tokenized = ours_tokenized(explicit(read(HH, 300)), "phi3", reference)
    collate = DataCollatorForPreference(pad_token_id=32000, max_length=max_length)
    kept = {"drop": 0, "truncate": 0}
    for pair in tokenized:
        truncated = preference.fit_pair(pair, max_length, "truncate")
        dropped = preference.fit_pair(pair, max_length, "drop")
        if len(pair.prompt) >= max_length:  # TRL's filter
            assert truncated is None and dropped is None
            continue
        example = {"prompt_ids": pair.prompt.tolist(), "chosen_ids": pair.chosen.tolist()}
        batch = collate([example | {"rejected_ids": pair.rejected.tolist()}])
        for row, completion in zip(batch["input_ids"], (truncated.chosen, truncated.rejected), strict=True):
            sequence = np.concatenate([truncated.prompt, completion])
            assert row[: len(sequence)].tolist() == sequence.tolist()
            assert len(sequence) <= max_length and (row[len(sequence) :] == 32000).all()
        fits = max(len(pair.chosen), len(pair.rejected)) + len(pair.prompt) <= max_length
        assert (dropped is pair) if fits else (dropped is None)
        kept["drop"] += dropped is not None
        kept["truncate"] += 1
    assert 0 < kept["drop"] < kept["truncate"] <= len(tokenized)


def segments(rows: packers.PackedConversations) -> list[list[tuple[np.ndarray, np.ndarray, np.ndarray]]]:
    """Each row's sequences in order: (tokens, loss, positions) of each."""
    packed, found = rows.packed, []
    for r in range(len(packed.row_offsets) - 1):
        cuts = packed.cu_seqlens[packed.row_offsets[r] : packed.row_offsets[r + 1]].tolist()
        found.append(
            [(packed.rows[r, a:b], rows.loss[r, a:b], rows.positions[r, a:b]) for a, b in itertools.pairwise(cuts)]
        )
    return found


@pytest.mark.parametrize("seq_len", [1024, 4096])
def test_pairs_packed_keep_each_pair_whole_in_one_row_with_the_objective_unpacked(seq_len, reference):
    """HH-RLHF's pairs (phi3), fitted to half a row a side and packed: each row holds whole pairs, a pair's chosen
    sequence and then its rejected one, each a sequence of its own (positions from 0); the loss is on the
    completions' tokens only, exactly as unpacked (where a sequence's first token never carries loss): the multiset
    of (chosen ids, chosen loss, rejected ids, rejected loss) is the unpacked pairs'."""
    tokenized = ours_tokenized(explicit(read(HH)), "phi3", reference)
    fitted = [p for p in (preference.fit_pair(pair, seq_len // 2, "drop") for pair in tokenized) if p is not None]
    tokens, masks, lengths = preference.pair_sequences(fitted)
    rows = packers.pack_pairs(tokens, masks, lengths, seq_len, pad_id=32000)
    packed = Counter()
    for row in segments(rows):
        assert len(row) % 2 == 0  # never half a pair
        for (chosen, chosen_loss, positions), (rejected, rejected_loss, others) in zip(
            row[::2], row[1::2], strict=True
        ):
            assert positions.tolist() == list(range(len(chosen))) and others.tolist() == list(range(len(rejected)))
            packed[(tuple(chosen.tolist()), tuple(chosen_loss.tolist()), tuple(rejected.tolist()),
                    tuple(rejected_loss.tolist()))] += 1  # fmt: skip
    unpacked = Counter()
    for pair in fitted:
        sides = []
        for completion in (pair.chosen, pair.rejected):
            loss = [0] * len(pair.prompt) + [1] * len(completion)
            loss[0] = 0  # the first token is never a target
            sides += [tuple(np.concatenate([pair.prompt, completion]).tolist()), tuple(loss)]
        unpacked[tuple(sides)] += 1
    assert packed == unpacked and sum(packed.values()) == len(fitted) > 250  # of the 300 pairs
    assert rows.packed.real_tokens == lengths.sum() and rows.packed.real_tokens / rows.packed.rows.size > 0.9
    pad = np.arange(seq_len) >= rows.packed.real_lengths[:, None]
    assert not rows.loss[pad].any() and not rows.positions[pad].any()


def test_a_pair_that_does_not_fit_a_row_is_refused_not_split():
    pair = preference.TokenizedPair(np.arange(5), np.arange(3), np.arange(4))
    tokens, masks, lengths = preference.pair_sequences([pair])
    assert lengths.tolist() == [8, 9] and masks.tolist() == [0] * 5 + [1] * 3 + [0] * 5 + [1] * 4
    with pytest.raises(ValueError, match="a pair of 17 tokens .* does not fit a row of 16"):
        packers.pack_pairs(tokens, masks, lengths, 16, pad_id=-1)
    rows = packers.pack_pairs(tokens, masks, lengths, 17, pad_id=-1)
    assert rows.packed.cu_seqlens.tolist() == [0, 8, 17] and rows.loss.tolist() == [
        [0] * 5 + [1] * 3 + [0] * 5 + [1] * 4
    ]


def test_the_pair_check_passes_the_packed_pairs_and_names_a_wrong_mask_or_half_a_pair(reference):
    """validate's check of a stored pair: the packed sequences of real pairs pass; an all-ones mask, a mask shifted
    by a token, the prompt's last token with loss, and a pair with one side only are named."""
    _, tokenizer = ours("phi3", reference)
    tokenized = ours_tokenized(explicit(read(HH, 200)), "phi3", reference)
    rows = packers.pack_pairs(*preference.pair_sequences(tokenized), 4096, pad_id=32000)
    stored = [(ids, loss) for row in segments(rows) for ids, loss, _ in row]
    by_ids = {tuple(np.concatenate([p.prompt, p.chosen]).tolist()): p for p in tokenized}
    for chosen, rejected in zip(stored[::2], stored[1::2], strict=True):
        assert preference.pair_problems(tokenizer, by_ids[tuple(chosen[0].tolist())], [chosen, rejected]) == []
    (chosen, chosen_loss), rejected = stored[0], stored[1]
    pair = by_ids[tuple(chosen.tolist())]
    prompt = len(pair.prompt)
    leak = chosen_loss.copy()
    leak[prompt - 1] = 1
    assert preference.pair_problems(tokenizer, pair, [(chosen, leak), rejected]) == [
        f"chosen: tokens {prompt - 1}:{prompt} ('<|assistant|>') are outside the completion (the prompt) but with loss"
    ]
    for wrong in (np.ones_like(chosen_loss), np.roll(chosen_loss, 1)):
        assert preference.pair_problems(tokenizer, pair, [(chosen, wrong), rejected])
    assert preference.pair_problems(tokenizer, pair, [(chosen, chosen_loss)]) == [
        "1 sequences, not a pair's two (chosen, rejected)"
    ]
    assert preference.pair_problems(tokenizer, pair, [(chosen, chosen_loss), (chosen, chosen_loss)])[0].startswith(
        "rejected: its"
    )
