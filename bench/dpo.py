"""tokenmill against TRL's own DPO dataset preparation, side by side on the same preference pairs (docs/chat.md,
Preference pairs).

Both turn HH-RLHF's helpful-base pairs (`../shared/corpora/preference/hh-rlhf-helpful-base`, its SOURCE.md; written
`--repeat` times with unique ids, as plain JSONL, TRL's conversational explicit-prompt form) into phi3 token ids:

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

    .venv/bin/python bench/dpo.py --rounds 4 [--repeat 1]
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
from chat import arguments, side_by_side, write_corpus  # beside this file

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
PHI3 = REPO / "examples" / "tokenizers" / "phi3-mini"
HH = SHARED / "corpora" / "preference" / "hh-rlhf-helpful-base" / "helpful_base_test_messages.jsonl.gz"


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


def same_pairs(trl_rows: Path, tokenmill_out: Path, pairs: int) -> None:
    """Every pair's two sequences identical in both, in order (each the prompt's ids and a completion's), and
    tokenmill's loss mask on the completions' ids only."""
    import pyarrow.parquet as pq

    from tokenmill.formats.megatron import MegatronReader

    theirs = pq.read_table(trl_rows).to_pylist()
    assert len(theirs) == pairs, (len(theirs), pairs)
    position = 0
    for prefix in sorted((tokenmill_out / "megatron" / "train").glob("shard-*.idx")):
        reader = MegatronReader(prefix.with_suffix(""))
        mask = np.fromfile(prefix.with_suffix(".loss_mask.bin"), dtype=np.uint8)
        starts = np.concatenate(([0], np.cumsum(reader.index.lengths, dtype=np.int64)))
        for k in range(len(reader) // 2):
            row = theirs[position]
            for side, s in (("chosen_ids", 2 * k), ("rejected_ids", 2 * k + 1)):
                loss = [0] * len(row["prompt_ids"]) + [1] * len(row[side])
                stored = reader[s].tolist(), mask[starts[s] : starts[s + 1]].tolist()
                if stored != (row["prompt_ids"] + row[side], loss):
                    raise SystemExit(f"pair {position} ({side}) differs between TRL and tokenmill")
            position += 1
    assert position == pairs, (position, pairs)


def main() -> None:
    args = arguments(__doc__, "HH-RLHF's pairs written this many times")
    if args.trl_prepare:
        return trl_prepare(Path(args.trl_prepare[0]), Path(args.trl_prepare[1]), args.cores)
    work = Path(tempfile.mkdtemp(prefix="tokenmill-dpo-bench-"))
    corpus = work / "hh.jsonl"
    pairs = write_corpus(corpus, args.repeat, HH)
    side_by_side(args, work, corpus, f"{pairs:,} pairs", lambda rows, out: same_pairs(rows, out, pairs),
                 "ids and masks identical for every pair, in every round", "preference", __file__)  # fmt: skip


if __name__ == "__main__":
    if not SHARED.is_dir():  # the benchmark's pairs; the tests read tests/data
        raise SystemExit(f"bench/dpo.py reads the preference pairs of {SHARED}, which is missing")
    main()
