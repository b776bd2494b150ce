"""Do two checkouts of tokenmill make the same bytes? For a change that must not change the output (a refactor, a
move): each config below is run with this checkout's code and with `--code DIR`'s, into the same output path, and
every published file's sha256 and its kind in the manifest are compared. The configs write every layout: the
bundled corpus in every document layout, a mixture of its three sources, conversations (trl, megatron_bridge,
olmo) and DPO pairs (trl), from the repository's own data.

    git worktree add ../before HEAD~3
    .venv/bin/python bench/same_bytes.py --code ../before

Prints a line per config and file that differs; exits 1 if any does. Not a speed benchmark: it lives here because it
runs the whole flow four times per checkout (about a minute each on a 2-core VM).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
GPT2, PHI3 = EXAMPLES / "tokenizers/gpt2/tokenizer.json", EXAMPLES / "tokenizers/phi3-mini"
DOCUMENT_LAYOUTS = ["megatron", "packed", "llmc", "olmo", "datatrove", "litdata", "hf_parquet", "mds"]


def configs(out: Path) -> dict[str, dict]:
    data = EXAMPLES / "data"
    return {
        "text": {
            "name": "text", "input": {"paths": [str(data / "*.jsonl*")], "text_field": "text", "id_field": "id"},
            "partition": {"shard_size": "1MB"}, "split": {"train": 0.95, "val": 0.05},
            "tokenizer": {"path": str(GPT2), "eod": "<|endoftext|>"}, "pack": {"mode": "concat", "seq_len": 1024},
            "output": {"path": str(out / "text"), "formats": DOCUMENT_LAYOUTS},
        },
        "mix": {
            "name": "mix",
            "sources": [
                {"name": "wiki", "input": {"paths": [str(data / "wikitext2_raw_test.jsonl")]}, "weight": 0.6},
                {"name": "web", "input": {"paths": [str(data / "web_dclm_annotated.jsonl.gz")]}, "weight": 0.4},
                {"name": "news", "input": {"paths": [str(data / "web_scrapinghub_aeb.jsonl.gz")]}, "epochs": 1},
            ],
            "split": {"train": 0.99, "val": 0.01}, "tokenizer": {"path": str(GPT2), "eod": "<|endoftext|>"},
            "pack": {"mode": "concat", "seq_len": 2048},
            "output": {"path": str(out / "mix"), "formats": [f for f in DOCUMENT_LAYOUTS if f != "llmc"]},
        },
        "chat": {
            "name": "chat",
            "input": {"paths": [str(EXAMPLES / "chat/sgd_dialogues_500.jsonl.gz")], "id_field": "id",
                      "chat": {"format": "messages"}},
            "split": {"train": 0.95, "validation": 0.05}, "tokenizer": {"path": str(PHI3), "eod": "auto"},
            "pack": {"seq_len": 2048, "too_long": "drop"},
            "output": {"path": str(out / "chat"), "formats": ["megatron", "packed", "trl", "megatron_bridge", "olmo"]},
        },
        "dpo": {
            "name": "dpo",
            "input": {"paths": [str(next((REPO / "tests/data/preference/hh-rlhf-helpful-base").glob("*.jsonl.gz")))],
                      "id_field": "id", "preference": {}},
            "split": {"train": 0.9, "validation": 0.1}, "tokenizer": {"path": str(PHI3), "eod": "auto"},
            "pack": {"seq_len": 1024}, "output": {"path": str(out / "dpo"), "formats": ["megatron", "packed", "trl"]},
        },
    }  # fmt: skip


def published(root: Path) -> dict[str, tuple[str, str]]:
    """Every file of the version published under `root` (`<output.path>/<name>`, by default): its sha256 and its
    kind in the manifest."""
    version = root / (root / "LATEST").read_text().strip()
    listed = {f["path"]: (f["sha256"], f["kind"]) for f in json.loads((version / "manifest.json").read_text())["files"]}
    beside = {  # published with the version but not in its manifest (a single input's Megatron data-args files)
        rel: (hashlib.sha256(p.read_bytes()).hexdigest(), "beside the manifest")
        for p in version.rglob("*")
        if p.is_file() and (rel := str(p.relative_to(version))) not in listed and rel != "manifest.json"
    }
    return listed | beside


def build(code: Path, out: Path) -> dict[str, dict]:
    """Each config run with `code`'s tokenmill into `out` (emptied first): its published files."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "TOKENMILL_DASK_ADDRESS")}
    env["PYTHONPATH"] = str(code)
    made = {}
    for name, config in configs(out).items():
        path = out / f"{name}.json"
        path.write_text(json.dumps(config))
        tokenmill = Path(sys.executable).parent / "tokenmill"  # the venv's command, which honours PYTHONPATH
        done = subprocess.run([tokenmill, "run", str(path)], cwd=code, env=env, capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"{name} with {code}: failed\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
        made[name] = published(out / name / name)
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--code", type=Path, required=True, help="the other checkout (a git worktree, say)")
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="tokenmill-same-bytes-")) / "out"  # the same path for both: args files name it
    ours, theirs = build(REPO, out), build(args.code.resolve(), out)
    differ = 0
    for name in ours:
        paths = sorted(ours[name].keys() | theirs[name].keys())
        # the stats hold the run's timings, the report its dates
        different = [
            p for p in paths if not p.endswith(("stats.json", ".md")) and ours[name].get(p) != theirs[name].get(p)
        ]
        for path in different:
            print(f"{name}: {path}: {ours[name].get(path)} here, {theirs[name].get(path)} at {args.code}")
        print(f"{name}: {len(paths)} files, {len(different)} different")
        differ += len(different)
    shutil.rmtree(out.parent, ignore_errors=True)
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
