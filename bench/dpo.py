"""tokenmill against TRL's own DPO dataset preparation, side by side on the same preference pairs (docs/chat.md,
Preference pairs).

Both turn the same pairs (plain JSONL, TRL's conversational explicit-prompt form) into phi3 token ids. The pairs
are HH-RLHF's helpful-base test pairs (`../shared/corpora/preference/hh-rlhf-helpful-base`, its SOURCE.md; 2,339,
written `--repeat` times with unique ids), or with `--mixed` about 62,000 pairs, the size of UltraFeedback's, none
repeated (`mixed_pairs`): HH-RLHF's, and pairs made from the conversations of `../shared/corpora/chat` (each
prompt a real conversation up to an assistant turn or a real question, the chosen completion its real answer, the
rejected one another record's real answer).

- TRL: `DPOTrainer(..., train_dataset=load_dataset("json", ...))` with `dataset_num_proc` = the cores and
  `max_length=None`, as its users run it: its `_prepare_dataset` extracts the prompt and tokenizes each pair
  (`datasets.map`, `num_proc` processes) when the trainer is made, before any training. The model and its reference
  are tiny Llamas built from a config. Its time is from spawn to the dataset prepared (the Arrow files in its own
  cache, a fresh one each round); then its rows are written for the comparison, outside its time.
- tokenmill: `tokenmill run` with its default config and `input.preference: {}`, from spawn to exit, reporting to
  its own Prefect server (started before the rounds, as a user's is).

Each round runs both from scratch, the order alternating. After each, every pair's stored chosen and rejected
sequences are compared with TRL's prompt_ids + chosen_ids and prompt_ids + rejected_ids (they must be identical), and
its loss mask with the completions. Then the medians, the ratio of the walls and the machine.

    .venv/bin/python bench/dpo.py --rounds 4 [--repeat 1 | --mixed]
"""

from __future__ import annotations

import gzip
import json
import tempfile
import time
from pathlib import Path

import numpy as np
from chat import arguments, side_by_side, write_corpus  # beside this file

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
PHI3 = REPO / "examples" / "tokenizers" / "phi3-mini"
HH = SHARED / "corpora" / "preference" / "hh-rlhf-helpful-base" / "helpful_base_test_messages.jsonl.gz"
CHAT = SHARED / "corpora" / "chat"
SGD_CUTS = 3  # pairs made of each sgd dialogue: its conversation cut at its first, middle and last assistant turns


def trl_prepare(corpus: Path, out: Path, cores: int) -> None:
    """(In the spawned process.) TRL's preparation of `corpus`; prints when it is done, then writes its rows."""
    import transformers
    from datasets import load_dataset
    from trl import DPOConfig, DPOTrainer

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(PHI3))
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2
    )
    dataset = load_dataset("json", data_files=str(corpus), split="train", cache_dir=str(out / "cache"))
    args = DPOConfig(
        output_dir=str(out / "trainer"), dataset_num_proc=cores, max_length=None, report_to=[], use_cpu=True,
        bf16=False, save_strategy="no",
    )  # fmt: skip
    model, reference = (transformers.LlamaForCausalLM(config) for _ in range(2))  # built here, not from a hub name
    trainer = DPOTrainer(model=model, ref_model=reference, args=args, train_dataset=dataset, processing_class=tokenizer)
    print(f"prepared at {time.time()}", flush=True)
    columns = ["prompt_ids", "chosen_ids", "rejected_ids"]
    trainer.train_dataset.select_columns(columns).to_parquet(str(out / "rows.parquet"))


def mixed_pairs(path: Path) -> int:
    """About 62,000 unique conversational pairs as JSONL at `path` (the size of UltraFeedback's binarized pairs),
    none repeated; the pairs written. HH-RLHF's 2,339; of each sgd-dialogues conversation (12,174), SGD_CUTS pairs,
    the conversation up to an assistant turn the prompt, that turn the chosen completion and the turn at the same
    place of the next conversation the rejected one; gpteacher-alpaca's instructions (with their input) and gsm8k's
    train and test questions, the record's answer chosen and the next record's rejected. Records with an empty
    prompt or answer are left out."""

    def user(text: str) -> list[dict]:
        return [{"role": "user", "content": text}]

    def assistant(text: str) -> list[dict]:
        return [{"role": "assistant", "content": text}]

    def lines(file: Path) -> list[dict]:
        with gzip.open(file, "rt") as f:
            return json.load(f) if file.name.endswith(".json.gz") else [json.loads(line) for line in f]

    pairs = [{**record, "id": f"hh-{k}"} for k, record in enumerate(lines(HH))]
    dialogues = [record["messages"] for record in lines(CHAT / "sgd-dialogues" / "sgd_train_messages.jsonl.gz")]
    for d, messages in enumerate(dialogues):
        turns = [
            i for i, m in enumerate(messages) if m["role"] == "assistant" and i and messages[i - 1]["role"] == "user"
        ]
        following = dialogues[(d + 1) % len(dialogues)]
        others = [m["content"] for m in following if m["role"] == "assistant"]
        for cut in sorted({turns[0], turns[len(turns) // 2], turns[-1]} if turns else ()):
            rejected = others[min(turns.index(cut), len(others) - 1)]
            if messages[cut]["content"] and rejected and rejected != messages[cut]["content"]:
                pairs.append({"id": f"sgd-{d}-{cut}", "prompt": messages[:cut], "chosen": assistant(
                    messages[cut]["content"]), "rejected": assistant(rejected)})  # fmt: skip
    answered = [  # (name, prompt, answer)
        *((f"{file.name}-{k}", r["instruction"] + (f"\n\n{r['input']}" if r["input"] else ""), r["response"])
          for file in sorted((CHAT / "gpteacher-alpaca").glob("*.json.gz")) for k, r in enumerate(lines(file))),
        *((f"{file.name}-{k}", r["question"], r["answer"])
          for file in sorted((CHAT / "gsm8k").glob("*.jsonl.gz")) for k, r in enumerate(lines(file))),
    ]  # fmt: skip
    answered = [(name, prompt, answer) for name, prompt, answer in answered if prompt.strip() and answer.strip()]
    for k, (name, prompt, answer) in enumerate(answered):
        rejected = answered[(k + 1) % len(answered)][2]
        if rejected != answer:
            pairs.append(
                {"id": name, "prompt": user(prompt), "chosen": assistant(answer), "rejected": assistant(rejected)}
            )
    with open(path, "w") as out:
        out.writelines(json.dumps(pair) + "\n" for pair in pairs)
    return len(pairs)


def same_pairs(trl_rows: Path, tokenmill_out: Path, pairs: int) -> None:
    """Every pair's two sequences identical in both, in order (each the prompt's ids and a completion's), and
    tokenmill's loss mask on the completions' ids only; compared a shard at a time, as arrays."""
    import pyarrow.parquet as pq

    from tokenmill.formats.megatron import MegatronReader

    theirs = pq.read_table(trl_rows)
    assert len(theirs) == pairs, (len(theirs), pairs)
    position = 0
    for prefix in sorted((tokenmill_out / "megatron" / "train").glob("shard-*.idx")):
        reader = MegatronReader(prefix.with_suffix(""))
        count = len(reader) // 2
        rows = theirs.slice(position, count)
        (prompt, p), (chosen, c), (rejected, r) = (
            flat_lists(rows[column]) for column in ("prompt_ids", "chosen_ids", "rejected_ids")
        )
        # TRL's pairs as tokenmill stores them: prompt + chosen, then prompt + rejected, the loss on the completions
        values = np.concatenate([prompt, chosen, rejected])
        lengths = np.stack([p, c, p, r], axis=1).ravel()
        starts = np.stack(
            [np.cumsum(n) - n + base for n, base in ((p, 0), (c, len(prompt)), (p, 0), (r, len(prompt) + len(chosen)))],
            axis=1,
        ).ravel()
        expected = values[np.arange(lengths.sum()) + np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)]
        loss = np.repeat(np.tile(np.uint8([0, 1]), 2 * count), lengths)
        sequences = lengths.reshape(-1, 2).sum(axis=1)
        stored = np.asarray(reader.tokens[: int(reader.index.lengths.sum())], np.int64)
        mask = np.fromfile(prefix.with_suffix(".loss_mask.bin"), dtype=np.uint8)
        if not (np.array_equal(reader.index.lengths, sequences) and np.array_equal(stored, expected)
                and np.array_equal(mask, loss)):  # fmt: skip
            raise SystemExit(f"{prefix.name}: its pairs differ between TRL and tokenmill (from pair {position})")
        position += count
    assert position == pairs, (position, pairs)


def flat_lists(column) -> tuple[np.ndarray, np.ndarray]:
    """A list column's values back to back and each row's length."""
    column = column.combine_chunks()
    offsets = np.asarray(column.offsets, np.int64)
    values = np.asarray(column.values, np.int64)[offsets[0] : offsets[-1]]
    return values, np.diff(offsets)


def main() -> None:
    args = arguments(
        __doc__, "HH-RLHF's pairs written this many times", mixed="about 62,000 unique pairs (mixed_pairs)"
    )
    if args.trl_prepare:
        return trl_prepare(Path(args.trl_prepare[0]), Path(args.trl_prepare[1]), args.cores)
    work = Path(tempfile.mkdtemp(prefix="tokenmill-dpo-bench-"))
    corpus = work / "pairs.jsonl"
    pairs = mixed_pairs(corpus) if args.mixed else write_corpus(corpus, args.repeat, HH)
    side_by_side(args, work, corpus, f"{pairs:,} pairs", lambda rows, out: same_pairs(rows, out, pairs),
                 "ids and masks identical for every pair, in every round", "preference", __file__)  # fmt: skip


if __name__ == "__main__":
    if not SHARED.is_dir():  # the benchmark's pairs; the tests read tests/data
        raise SystemExit(f"bench/dpo.py reads the preference pairs of {SHARED}, which is missing")
    main()
