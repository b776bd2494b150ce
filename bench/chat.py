"""tokenmill against TRL's own dataset preparation, side by side on the same conversations (docs/chat.md).

Both turn sgd-dialogues (`../shared/corpora/chat/`, its SOURCE.md; written `--repeat` times with unique ids, as
plain JSONL) into phi3 token ids with the loss on the assistant's turns:

- TRL: `SFTTrainer(..., train_dataset=load_dataset("json", ...))` with `assistant_only_loss=True` and
  `dataset_num_proc` = the cores, as its users run it: its `_prepare_dataset` maps `apply_chat_template` with the
  assistant masks over the records (`datasets.map`, `num_proc` processes). The template is TRL's
  `phi3_training.jinja` (phi3's with `{% generation %}` tags, which TRL needs for the mask); the model is a tiny
  Llama built from a config (TRL prepares the dataset when the trainer is made, before any training). Its time is
  from spawn to the dataset prepared (the Arrow files in its own cache, a fresh one each round), then its rows are
  written for the comparison, outside its time.
- tokenmill: `tokenmill run` with its default config and `input.chat: {}` (phi3's own template, no tags), from
  spawn to exit, reporting to its own Prefect server (started before the rounds, as a user's is).

Each round runs both from scratch, the order alternating. After each, tokenmill's ids and masks are compared with
TRL's input_ids and labels for every conversation (they must be identical). Then the medians, the ratio of the
walls and the machine.

    .venv/bin/python bench/chat.py --rounds 4 [--repeat 1]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
from megatron import RESERVE, Watched, checkout  # beside this file
from throughput import tokenmill_command

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
PHI3 = SHARED / "tokenizers" / "phi3-mini"
SGD = SHARED / "corpora" / "chat" / "sgd-dialogues" / "sgd_train_messages.jsonl.gz"


def write_corpus(path: Path, repeat: int, source: Path = SGD) -> int:
    """`source`'s records (sgd-dialogues' conversations) `repeat` times as JSONL, each copy's ids made unique; the
    records written."""
    with gzip.open(source, "rt") as f:
        records = [json.loads(line) for line in f]
    with open(path, "w") as out:
        for copy in range(repeat):
            for record in records:
                out.write(json.dumps({**record, "id": f"{record['id']}-{copy}"}) + "\n")
    return len(records) * repeat


def trl_prepare(corpus: Path, out: Path, cores: int) -> None:
    """(In the spawned process.) TRL's preparation of `corpus`; prints when it is done, then writes its rows."""
    import transformers
    from datasets import load_dataset
    from trl import SFTConfig, SFTTrainer

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(PHI3))
    tokenizer.chat_template = (PHI3 / "phi3_training.jinja").read_text()
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2
    )
    dataset = load_dataset("json", data_files=str(corpus), split="train", cache_dir=str(out / "cache"))
    args = SFTConfig(
        output_dir=str(out / "trainer"), assistant_only_loss=True, dataset_num_proc=cores, max_length=None,
        padding_free=True, report_to=[], use_cpu=True, save_strategy="no",
    )  # fmt: skip
    trainer = SFTTrainer(
        model=transformers.LlamaForCausalLM(config), args=args, train_dataset=dataset, processing_class=tokenizer
    )
    print(f"prepared at {time.time()}", flush=True)
    trainer.train_dataset.select_columns(["input_ids", "labels"]).to_parquet(str(out / "rows.parquet"))


def run_trl(corpus: Path, work: Path, cores: int, log: Path, script: str = __file__) -> dict:
    """TRL's preparation of `corpus`, by `script --trl-prepare` (this file's, or bench/dpo.py's), timed."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = os.environ | {"HF_DATASETS_CACHE": str(work / "cache"), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, script, "--trl-prepare", str(corpus), str(work), "--cores", str(cores)]
    run = Watched(command, env, psutil.virtual_memory().total - RESERVE, log)
    if run.returncode != 0:
        raise SystemExit(f"TRL failed:\n{run.log[-3000:]}")
    prepared = float(run.log.split("prepared at ")[1].split()[0])
    return {"tool": "TRL", "wall_s": round(prepared - run.spawned, 2), "cpu_s": tree_cpu(run),
            "peak_tree_gb": round(run.peak_tree / 1e9, 2)}  # fmt: skip


def run_tokenmill(mill, corpus: Path, out: Path, log: Path, kind: str = "chat") -> dict:
    """`tokenmill run` on `corpus` read as `input.<kind>` (chat, preference), timed."""
    shutil.rmtree(out, ignore_errors=True)
    config = out.parent / "tokenmill.yaml"
    config.write_text(json.dumps({
        "name": f"{kind}-bench", "input": {"paths": [str(corpus)], "id_field": "id", kind: {}},
        "tokenizer": {"path": str(PHI3), "eod": "auto"}, "output": {"path": str(out)},
    }))  # fmt: skip
    command = [*tokenmill_command(code=REPO), "run", str(config)]
    run = Watched(command, mill.env, psutil.virtual_memory().total - RESERVE, log, beside=mill.server, cwd=REPO)
    if run.returncode != 0:
        raise SystemExit(f"tokenmill failed:\n{run.log[-3000:]}")
    return {"tool": "tokenmill", "wall_s": round(run.wall, 2), "cpu_s": tree_cpu(run),
            "peak_tree_gb": round(run.peak_tree / 1e9, 2)}  # fmt: skip


def tree_cpu(run: Watched) -> float:
    """The CPU seconds of the command's process tree: each process's when last polled, where that is more than what
    wait4 reaped (the Dask workers, forked by the cluster's server, are not reaped into it)."""
    return round(max(run.cpu, sum(cpu for _, cpu in run.cpu_by_process.values())), 1)


def same_rows(trl_rows: Path, tokenmill_out: Path, conversations: int) -> None:
    """Every conversation's ids and labels (ids where the mask is 1, else -100) identical in both, in order."""
    import pyarrow.parquet as pq

    from tokenmill.formats.megatron import MegatronReader

    theirs = pq.read_table(trl_rows)
    ids, labels = theirs["input_ids"].to_pylist(), theirs["labels"].to_pylist()
    assert len(ids) == conversations, (len(ids), conversations)
    position = 0
    for prefix in sorted((tokenmill_out / "megatron" / "train").glob("shard-*.idx")):
        reader = MegatronReader(prefix.with_suffix(""))
        mask = np.fromfile(prefix.with_suffix(".loss_mask.bin"), dtype=np.uint8)
        starts = np.concatenate(([0], np.cumsum(reader.index.lengths)))
        for i in range(len(reader)):
            ours = reader[i].astype(np.int64)
            ours_labels = np.where(mask[starts[i] : starts[i + 1]] == 1, ours, -100)
            if ours.tolist() != ids[position] or ours_labels.tolist() != labels[position]:
                raise SystemExit(f"conversation {position} differs between TRL and tokenmill")
            position += 1
    assert position == conversations


def main() -> None:
    args = arguments(__doc__, "sgd-dialogues written this many times")
    if args.trl_prepare:
        return trl_prepare(Path(args.trl_prepare[0]), Path(args.trl_prepare[1]), args.cores)
    work = Path(tempfile.mkdtemp(prefix="tokenmill-chat-bench-"))
    corpus = work / "sgd.jsonl"
    conversations = write_corpus(corpus, args.repeat)
    side_by_side(args, work, corpus, f"{conversations:,} conversations",
                 lambda rows, out: same_rows(rows, out, conversations),
                 "ids and labels identical for every conversation, in every round")  # fmt: skip


def arguments(doc: str, repeat: str, **flags: str) -> argparse.Namespace:
    """The options of this benchmark and bench/dpo.py (`flags`: its own, by name and help)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=1, help=repeat)
    for flag, says in flags.items():
        parser.add_argument(f"--{flag}", action="store_true", help=says)
    parser.add_argument("--cores", type=int, default=os.cpu_count(), help="TRL's dataset_num_proc")
    parser.add_argument("--trl-prepare", nargs=2, metavar=("CORPUS", "OUT"), help=argparse.SUPPRESS)
    return parser.parse_args()


def side_by_side(
    args, work: Path, corpus: Path, what: str, same, identical: str, kind: str = "chat", script: str = __file__
) -> None:
    """`args.rounds` rounds of TRL's preparation and `tokenmill run` on `corpus` (read as `input.<kind>`), the order
    alternating, their outputs compared after each (`same(TRL's rows, tokenmill's output)`, which says `identical`);
    then the medians and their ratio, and the machine. `script` prepares TRL's side (`--trl-prepare`)."""
    print(f"{what}, {corpus.stat().st_size / 1e6:.1f} MB of JSONL; {args.rounds} rounds")
    rows = []
    with checkout("tokenmill", REPO, work / "prefect-home") as mill:
        for round_ in range(args.rounds):
            order = ["TRL", "tokenmill"] if round_ % 2 == 0 else ["tokenmill", "TRL"]
            for tool in order:
                load = os.getloadavg()[0]
                if tool == "TRL":
                    row = run_trl(corpus, work / "trl", args.cores, work / "trl.log", script)
                else:
                    row = run_tokenmill(mill, corpus, work / "out", work / "tokenmill.log", kind)
                rows.append(row | {"round": round_, "load": round(load, 2)})
                print(json.dumps(rows[-1]), flush=True)
            same(work / "trl" / "rows.parquet", work / "out")
    print(identical)
    medians = {tool: statistics.median(r["wall_s"] for r in rows if r["tool"] == tool) for tool in ("TRL", "tokenmill")}
    print(f"\nmedian wall: TRL {medians['TRL']:.1f} s, tokenmill {medians['tokenmill']:.1f} s: "
          f"tokenmill/TRL = {medians['tokenmill'] / medians['TRL']:.2f}")  # fmt: skip
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, "
          f"{psutil.virtual_memory().total / 2**30:.0f} GiB, {time.strftime('%Y-%m-%d')}")  # fmt: skip
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if not SHARED.is_dir():  # the benchmarks' corpora and tokenizers; the tests read tests/data
        raise SystemExit(f"bench/chat.py reads the corpora and tokenizers of {SHARED}, which is missing")
    main()
