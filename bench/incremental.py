"""A nightly run over a growing input: what each night costs with the default config (GPT-2), with each way of
checking the files of the shards a night keeps (`output.reuse_check`) side by side: sha256 (the default: every
kept file read whole, each night) and stamp (a kept file read once, then only when its stamp changed).

The input is `--files` gzipped JSONL files of `--docs` enwiki_slice documents each, as a crawl drops them into a
prefix. Six nights, each a `tokenmill run` of the same config per reuse check (two datasets, the two runs of a
night one after the other, in turns first), each spawned as a user's cron would, against one Prefect server
(started first, its own PREFECT_HOME):

1. the first night: every file is new;
2. nothing changed;
3. one file landed, named after the others as dated dumps are (the input grew by 1 / `--files`);
4. one file landed whose name sorts in the middle of the others (the shards after it are renumbered);
5. one of the files was replaced with other documents;
6. one file landed after the others again.

Printed per night and check: wall time from spawn to exit, the flow's own seconds, the shards kept and made (from
the manifest's lineage), and the input bytes actually tokenized (the shards whose tokenize result is new: not the
ones reused, under their id or another) against the whole input. With `--s3` the datasets (build and versions)
are on moto's S3 server on 127.0.0.1, behind tests/fault_proxy.py with no faults, and each run's requests and the
MB it downloaded are printed too. With `--cold` the page cache is emptied before each run (as root), as a night
finds a dataset larger than the memory, or written the night before and pushed out since.

    python bench/incremental.py [--files 100] [--docs 300] [--s3] [--cold]
"""

# ruff: noqa: E402 (the imports below come after the path is set)
from __future__ import annotations

import sys
from pathlib import Path

# Run as `python bench/incremental.py`: the repository goes on the path, for tests/fault_proxy.py (this folder, for
# throughput.py, is there already).
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import argparse
import datetime
import gzip
import itertools
import json
import logging
import os
import re
import shutil
import subprocess
from collections import Counter

from throughput import machine, timed_run, tokenmill_command

from tokenmill.io.storage import Store

SHARED = REPO.parent / "shared"
CHECKS = ("sha256", "stamp")


def documents():
    """enwiki_slice's documents, over and over with fresh ids once it runs out."""
    for lap in itertools.count():
        with gzip.open(SHARED / "corpora/enwiki_slice/enwiki_slice.jsonl.gz", "rb") as f:
            for line in f:
                doc = json.loads(line)
                yield json.dumps({"id": f"{doc['id']}@{lap}", "text": doc["text"]}).encode() + b"\n"


def land(path: Path, docs, n: int) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(gzip.compress(b"".join(next(docs) for _ in range(n)), mtime=0))
    tmp.rename(path)  # as a crawler's upload appears: whole


class Dataset:
    """One of the datasets the nights build: its config, where it is, and the sources of every shard tokenized on
    earlier nights."""

    def __init__(self, work: Path, check: str, output: str, storage: dict):
        self.check, self.output, self.storage = check, output, storage
        self.config = work / f"config-{check}.yaml"
        self.config.write_text(
            f"name: nightly\ninput: {{paths: ['{work}/in/*.jsonl.gz'], id_field: id}}\n"
            f"tokenizer: {{path: {SHARED / 'tokenizers/gpt2/tokenizer.json'}, eod: '<|endoftext|>'}}\n"
            f"output: {{path: '{output}', reuse_check: {check}}}\n"
        )
        self.tokenized: set[str] = set()

    def night(self, env: dict, proxy=None, cold: bool = False) -> dict:
        """One run, and what it made and (through `proxy`) asked of the object store. `cold`: from disk."""
        asked, sent = (len(proxy.seen), proxy.sent) if proxy else (0, 0)
        if cold:
            os.sync()
            Path("/proc/sys/vm/drop_caches").write_text("1\n")
        wall, printed = timed_run(self.config, env)
        requests = Counter(method for method, _ in proxy.seen[asked:]) if proxy else Counter()
        downloaded = (proxy.sent - sent) / 1e6 if proxy else 0
        # read past the proxy: what the benchmark reads is not the run's
        root, build = Store(f"{self.output}/nightly", self.storage), Store(self.output, self.storage)
        manifest = root.read_json(f"{root.read_bytes('LATEST').decode().strip()}/manifest.json")
        results = [build.read_json(rel)["result"] for rel in build.list("_commits/tokenize")]
        fresh = [r for r in results if r["source"] not in self.tokenized]
        self.tokenized.update(r["source"] for r in results)
        flow = re.search(r"whole flow: ([\d.]+) s", printed)
        return {
            "wall_s": round(wall, 1),
            "flow_s": float(flow[1]) if flow else None,
            "nothing_to_do": "Nothing to do" in printed,
            "lineage": manifest["lineage"],
            "input_mb": round(sum(f["bytes"] for f in manifest["inputs"]["files"]) / 1e6, 1),
            "tokenized_mb": round(sum(r["bytes_in"] for r in fresh) / 1e6, 2),
            "requests": requests,
            "downloaded_mb": round(downloaded, 1),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=100)
    parser.add_argument("--docs", type=int, default=300, help="documents per file")
    parser.add_argument("--work", type=Path, default=REPO / "out" / "bench-incremental")
    parser.add_argument("--s3", action="store_true", help="the datasets on moto's S3 server, requests counted")
    parser.add_argument("--cold", action="store_true", help="empty the page cache before each run (root)")
    args = parser.parse_args()

    shutil.rmtree(args.work, ignore_errors=True)
    (args.work / "in").mkdir(parents=True)
    docs = documents()
    for i in range(args.files):
        land(args.work / "in" / f"dump-{i:04d}.jsonl.gz", docs, args.docs)
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "TOKENMILL_DASK_ADDRESS")}
    env |= {"PREFECT_HOME": str(args.work / "prefect-home"), "CI": "1"}
    moto = proxy = None
    if args.s3:
        import boto3
        from moto.server import ThreadedMotoServer

        from tests.fault_proxy import FaultProxy

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
        moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
        moto.start()
        upstream = "http://{}:{}".format(*moto.get_host_and_port())
        proxy = FaultProxy(upstream).start()
        env |= {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_ENDPOINT_URL": proxy.endpoint}  # fmt: skip
        os.environ |= {k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
        boto3.client("s3", endpoint_url=upstream).create_bucket(Bucket="nightly")
        datasets = [Dataset(args.work, c, f"s3://nightly/{c}", {"endpoint_url": upstream}) for c in CHECKS]
    else:
        datasets = [Dataset(args.work, c, str(args.work / f"out-{c}"), {}) for c in CHECKS]

    landings = {
        "first night": None,
        "nothing changed": None,
        "one file landed (last)": f"dump-{args.files:04d}.jsonl.gz",
        "one file landed (middle)": f"dump-{args.files // 2:04d}a.jsonl.gz",  # sorts after dump-NNNN.
        "one file replaced": "dump-0000.jsonl.gz",
        "one more file landed (last)": f"dump-{args.files + 1:04d}.jsonl.gz",
    }
    subprocess.run([*tokenmill_command(), "server", "start"], env=env, capture_output=True, check=True)
    nights: dict[tuple[str, str], dict] = {}
    try:
        for turn, (name, lands) in enumerate(landings.items()):
            if lands:
                land(args.work / "in" / lands, docs, args.docs)
            for dataset in datasets[::-1] if turn % 2 else datasets:  # in turns first
                nights[name, dataset.check] = dataset.night(env, proxy, args.cold)
    finally:
        subprocess.run([*tokenmill_command(), "server", "stop"], env=env, capture_output=True)
        if proxy:
            proxy.stop()
            moto.stop()

    where = "moto's S3 server (127.0.0.1)" if args.s3 else "a local disk"
    where += ", the page cache emptied before each run" if args.cold else ""
    print(f"# {datetime.datetime.now():%Y-%m-%d %H:%M}, {machine()}, 1-min load {os.getloadavg()[0]:.1f}; "
          f"{args.files} files of {args.docs} enwiki documents, default config, the datasets on {where}")  # fmt: skip
    s3 = " requests (GET/HEAD/PUT/other) | MB downloaded |" if args.s3 else ""
    print(f"| night | reuse check | wall s | flow s | shards kept | shards made | input MB | tokenized MB |{s3}")
    print("|---|---|--:|--:|--:|--:|--:|--:|" + ("--:|--:|" if args.s3 else ""))
    for (name, check), n in nights.items():
        kept, made = n["lineage"]["shards_kept"], n["lineage"]["shards_made"]
        if n["nothing_to_do"]:
            kept, made = "(nothing to do)", 0
        row = f"| {name} | {check} | {n['wall_s']} | {n['flow_s']} | {kept} | {made} | {n['input_mb']} "
        row += f"| {n['tokenized_mb']} |"
        if args.s3:
            r = n["requests"]
            other = sum(r.values()) - r["GET"] - r["HEAD"] - r["PUT"]
            row += f" {sum(r.values())} ({r['GET']}/{r['HEAD']}/{r['PUT']}/{other}) | {n['downloaded_mb']} |"
        print(row)


if __name__ == "__main__":
    if not SHARED.is_dir():  # the benchmarks' corpora and tokenizers; the tests read tests/data
        raise SystemExit(f"bench/incremental.py reads the corpora and tokenizers of {SHARED}, which is missing")
    main()
