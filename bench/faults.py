"""The fault campaign: faults injected into real `tokenmill run`s at random points, each faulted run followed
by a rerun of the same config, whose published files are compared byte for byte with a clean run's.

    python bench/faults.py --trials 20                 # every kind, 20 trials each (make faults)
    python bench/faults.py --trials 2 --kinds worker_kill,corruption --seed 7

Everything runs on 127.0.0.1 and is started and stopped here: a `prefect server` (SQLite, its own
PREFECT_HOME), moto's S3 server behind the fault proxy (tests/fault_proxy.py), and each run's LocalCluster.
The corpus is the first `--corpus-mb` of enwiki_slice cut into many small shards (`--shard-size`).

Fault kinds (a trial = one faulted run, then one clean rerun of the same output):
  worker_kill   a Dask worker process SIGKILLed at a random moment of the run
  flow_kill     the `tokenmill run` process SIGKILLed at a random moment (its workers die with it)
  publish_kill  the `tokenmill run` process SIGKILLed while it publishes (after the build's manifest appears)
  s3            output on S3 through the proxy: a random share (2-10%) of all requests fail (reset, reset after
                the server acted, 503 SlowDown, 500, cut-off answer, stall); the rerun has no faults
  disk_full     the build (or, half the trials, the publish path) on a tmpfs too small for it (a random size);
                the rerun gets enough space
  oom           dask.memory_limit (350-500 MiB) far below what one large document needs, so its worker is killed for
                memory; the rerun has the default limit
  corruption    a finished build, then one random committed shard file bit-flipped, truncated or deleted
  server        the Prefect server SIGKILLed at a random moment and restarted on the same port and database
                after a random 1-15 s
  server_outage the Prefect server SIGKILLed at a random moment and restarted only once the run has ended

Per trial: the faulted run's outcome (completed / failed with a message / hung: still running after
`--hang-s`), whether its message names a shard or object and the cause, the rerun's outcome, whether the
published files equal the clean run's byte for byte, the documents of the manifest against the clean run's
(lost or duplicated), and processes left behind. The table goes to stdout and `--report` (JSON).
"""

# ruff: noqa: E402 (the imports below come after the path is set)
from __future__ import annotations

import sys
from pathlib import Path

# Run as `python bench/faults.py`: the repository goes on the path, for tests/fault_proxy.py.
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import argparse
import contextlib
import gzip
import json
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections import Counter, defaultdict

import psutil

from flows import server as prefect_server
from tests.fault_proxy import FaultProxy

SHARED = REPO.parent / "shared"
ENWIKI = SHARED / "corpora" / "enwiki_slice" / "enwiki_slice.jsonl.gz"
KINDS = ["worker_kill", "flow_kill", "publish_kill", "s3", "disk_full", "oom", "corruption", "server", "server_outage"]
# What a clear failure message looks like: it names a shard, a file or object, or the server's URL, and a cause.
NAMES_WHAT = re.compile(r"shard[ -]\d{5}|s3://\S+|/\S+\.(bin|idx|npy|json|jsonl)\b|http://127\.0\.0\.1:\d+")


def make_corpus(work: Path, megabytes: float) -> Path:
    """The first `megabytes` of enwiki_slice as uncompressed JSONL (cut into shards at line boundaries)."""
    corpus = work / "corpus" / "enwiki_head.jsonl"
    corpus.parent.mkdir(parents=True, exist_ok=True)
    budget = int(megabytes * 1e6)
    with gzip.open(ENWIKI, "rb") as source, open(corpus, "wb") as out:
        for line in source:
            if budget <= 0:
                break
            out.write(line)
            budget -= len(line)
    return corpus


def big_document(work: Path, megabytes: int) -> Path:
    """One document of `megabytes` of real text (enwiki repeated), for the oom kind."""
    path = work / "corpus-big" / "big.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(ENWIKI, "rt") as source:
        text = " ".join(json.loads(line)["text"] for _, line in zip(range(400), source, strict=False))
    text = (text * (megabytes * 1_000_000 // len(text) + 1))[: megabytes * 1_000_000]
    path.write_text(json.dumps({"id": "big-0", "text": text}) + "\n")
    return path


class Campaign:
    def __init__(self, args):
        self.args = args
        self.work = Path(args.work or tempfile.mkdtemp(prefix="tokenmill-faults-"))
        self.work.mkdir(parents=True, exist_ok=True)
        self.corpus = make_corpus(self.work, args.corpus_mb)
        self.shortest_run = float("inf")  # of the whole runs seen: the window for timed faults
        self.home = self.work / "prefect-home"
        self.env = {
            **os.environ,
            "PREFECT_HOME": str(self.home),
            "PREFECT_LOGGING_LEVEL": "WARNING",
            "CI": "1",  # plain logs, no progress bars
            "TOKENMILL_S3_READ_TIMEOUT": "2",
        }
        self.env.pop("PREFECT_API_URL", None)
        self.server = None
        self.moto = self.proxy = None
        self.spawned: list[int] = []

    # --- the services the runs use ---------------------------------------------------------------------

    def start_server(self, port: int | None = None) -> None:
        with _environ(PREFECT_HOME=str(self.home), PREFECT_API_URL=None):  # this process's own env is left as it was
            self.server = prefect_server.start_server(port)
        self.env["PREFECT_API_URL"] = self.server["api_url"]

    def kill_server(self) -> None:
        with _quiet():
            os.killpg(self.server["pid"], signal.SIGKILL)

    def restart_server(self) -> None:
        port = int(self.server["api_url"].split(":")[-1].split("/")[0])
        for _ in range(60):  # the port is free again once the killed server's socket is gone
            try:
                self.start_server(port)
                return
            except RuntimeError:
                time.sleep(1)
        raise RuntimeError("the Prefect server did not come back")

    def start_s3(self) -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
        self.moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
        self.moto.start()
        host, port = self.moto.get_host_and_port()
        upstream = f"http://{host}:{port}"
        creds = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
        self.env.update(creds)
        self.proxy = FaultProxy(upstream, seed=self.args.seed).start()
        self.env["AWS_ENDPOINT_URL"] = self.proxy.endpoint
        import boto3

        self.s3 = boto3.client("s3", endpoint_url=upstream, region_name="us-east-1",
                               aws_access_key_id="testing", aws_secret_access_key="testing")  # fmt: skip
        self.s3.create_bucket(Bucket="faults")

    def stop(self) -> None:
        if self.server:
            with _quiet():
                os.killpg(self.server["pid"], signal.SIGTERM)
        if self.proxy:
            self.proxy.stop()
        if self.moto:
            self.moto.stop()

    # --- runs ------------------------------------------------------------------------------------------

    def run_args(self, output: str, *extra: str) -> list[str]:
        return [
            str(Path(sys.executable).with_name("tokenmill")), "run", "examples/gpt2.yaml",
            "--set", f"input.paths=[{self.corpus.parent}/*.jsonl]",
            "--set", f"partition.shard_size={self.args.shard_size}",
            "--set", "fertility.enabled=false",
            "--set", f"dask.n_workers={self.args.workers}",
            "--set", f"output.path={output}",
            *extra,
        ]  # fmt: skip

    def start_run(self, output: str, *extra: str) -> subprocess.Popen:
        log = open(self.work / "runs.log", "ab")
        process = subprocess.Popen(
            self.run_args(output, *extra), cwd=REPO, env=self.env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        process.log = log
        return process

    def finish(self, process: subprocess.Popen, started: float) -> dict:
        """Wait for a run (at most --hang-s from its start); its outcome, last lines and leftover processes."""
        try:
            out, _ = process.communicate(timeout=max(1, self.args.hang_s - (time.monotonic() - started)))
            hung = False
        except subprocess.TimeoutExpired:
            hung = True
            with _quiet():
                os.killpg(process.pid, signal.SIGKILL)
            out, _ = process.communicate()
        process.log.write(out)
        process.log.close()
        text = out.decode(errors="replace")
        # The CLI's last words: its `error:` line and the indented lines under it (one per failed shard).
        return {
            "rc": process.returncode,
            "hung": hung,
            "seconds": round(time.monotonic() - started, 1),
            "message": last_error(text),
            "tail": text[-3000:],
        }

    def run(self, output: str, *extra: str) -> dict:
        return self.finish(self.start_run(output, *extra), time.monotonic())

    def leftovers(self, process: subprocess.Popen) -> int:
        """Processes of the run's session still alive 20 s after it ended (killed here: we started them)."""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            alive = [p for p in psutil.process_iter(["pid"]) if _session(p) == process.pid]
            if not alive:
                return 0
            time.sleep(1)
        for p in alive:
            with _quiet():
                p.kill()
        return len(alive)

    # --- comparing with the clean run ----------------------------------------------------------------

    def published(self, output: str) -> dict[str, bytes]:
        """Every file of the published version (its manifest included), by relative path."""
        if output.startswith("s3://"):
            prefix = output.removeprefix("s3://faults/") + "/"
            pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket="faults", Prefix=prefix)
            keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
            files = {}
            for key in keys:
                rel = key[len(prefix) :]
                if rel.startswith("demo-gpt2/") and rel.count("/") >= 2:
                    files[rel.split("/", 2)[2]] = self.s3.get_object(Bucket="faults", Key=key)["Body"].read()
            return files
        root = Path(output) / "demo-gpt2"
        if not (root / "LATEST").exists():
            return {}
        version = root / (root / "LATEST").read_text().strip()
        return {str(p.relative_to(version)): p.read_bytes() for p in sorted(version.rglob("*")) if p.is_file()}

    def compare(self, output: str) -> dict:
        files = self.published(output)
        identical = {k: v for k, v in files.items() if not k.startswith("report/")} == self.clean_files
        documents = None
        if "manifest.json" in files:
            counts = json.loads(files["manifest.json"])["counts"]
            documents = counts["documents_out"] + counts["documents_rejected"] - self.clean_documents
        differing = sorted(
            set(files) ^ set(self.clean_files) | {k for k in files if files[k] != self.clean_files.get(k)}
        )
        return {"identical": identical, "documents_delta": documents, "differing": differing[:5]}

    # --- the campaign ----------------------------------------------------------------------------------

    def clean(self, name: str = "clean") -> None:
        out = str(self.work / name)
        result = self.run(out)
        if result["rc"] != 0:
            raise SystemExit(f"the clean run failed:\n{result['tail']}")
        files = self.published(out)
        self.clean_files = {k: v for k, v in files.items() if not k.startswith("report/")}
        counts = json.loads(files["manifest.json"])["counts"]
        self.clean_documents = counts["documents_out"] + counts["documents_rejected"]
        self.shortest_run = min(self.shortest_run, result["seconds"])
        self.clean_dir = Path(out)
        self.dataset_bytes = sum(len(v) for v in self.clean_files.values())
        build = Path(out)
        self.build_bytes = sum(p.stat().st_size for p in build.rglob("*") if p.is_file() and "demo-gpt2" not in p.parts)
        self.shards = json.loads(files["manifest.json"])["shards"]
        print(f"clean run: {self.shards} shards, {counts['documents_in']} documents, {result['seconds']} s", flush=True)

    def trial(self, kind: str, index: int) -> dict:
        rng = random.Random(f"{self.args.seed}-{kind}-{index}")
        out = str(self.work / "trials" / f"{kind}-{index:03d}")
        inject = getattr(self, f"inject_{kind}")
        record = {"kind": kind, "trial": index}
        for draw in range(1, MOMENT_DRAWS + 1):
            shutil.rmtree(out, ignore_errors=True)
            faulted, rerun_extra, detail = inject(rng, out)
            if detail.get("landed", True) or draw == MOMENT_DRAWS:
                break
            # The run ended before the fault's moment: it ran faster than every run before it (the host's load
            # fell). Its moment is drawn again within this run's length, on a fresh output.
            self.shortest_run = min(self.shortest_run, detail["at"])
            print(f"{kind} #{index}: the run ended before the fault at {detail['at']} s; drawn again", flush=True)
        record |= {"faulted": faulted, "detail": detail, "draws": draw}
        if isinstance(faulted, dict) and faulted.get("output"):
            out = faulted["output"]
        rerun = self.run(out, *rerun_extra)
        record["rerun"] = {k: rerun[k] for k in ("rc", "hung", "seconds", "message")}
        record["redone_lines"] = [line for line in rerun["tail"].splitlines() if line.startswith("redone:")]
        record |= self.compare(faulted.get("publish_root") or out)
        if kind == "disk_full":
            subprocess.run(["umount", "-l", detail["mount"]], check=False)
        elif not out.startswith("s3://") and not self.args.keep:
            shutil.rmtree(out, ignore_errors=True)
        return record

    def _faulted_run(self, out: str, act, *extra: str) -> dict:
        """Start a run, call `act(process, started)` (which injects the fault), then wait for the run."""
        process = self.start_run(out, *extra)
        started = time.monotonic()
        detail = act(process, started) or {}
        result = self.finish(process, started)
        if result["rc"] == 0:
            self.shortest_run = min(self.shortest_run, result["seconds"])
        result["leftover_processes"] = self.leftovers(process)
        return result | {"detail": detail}

    def _random_moment(self, rng) -> float:
        # Within the shortest whole run seen: runs here vary twofold with the host's load, and a fault timed
        # after the run's end tests nothing (`landed` records it either way).
        return rng.uniform(1.0, 0.9 * self.shortest_run)

    def inject_worker_kill(self, rng, out):
        at = self._random_moment(rng)

        def act(process, started):
            landed = _sleep_until(started + at, process)
            workers = _workers(process.pid)
            while not workers and process.poll() is None:  # its cluster still starting, on a loaded host
                time.sleep(0.05)
                workers = _workers(process.pid)
            if not workers:
                return {"at": round(at, 1), "killed": None, "landed": False}
            victim = rng.choice(workers)
            with _quiet():
                victim.kill()
            return {"at": round(at, 1), "killed": victim.pid, "landed": landed}

        result = self._faulted_run(out, act)
        return result, (), result.pop("detail")

    def inject_flow_kill(self, rng, out):
        at = self._random_moment(rng)

        def act(process, started):
            landed = _sleep_until(started + at, process)
            with _quiet():
                os.kill(process.pid, signal.SIGKILL)  # the flow's process only: its children see it die
            return {"at": round(at, 1), "landed": landed}

        result = self._faulted_run(out, act)
        return result, (), result.pop("detail")

    def inject_publish_kill(self, rng, out):
        delay = rng.uniform(0, 1.5)

        def act(process, started):
            manifest = Path(out) / "manifest.json"
            while not manifest.exists() and process.poll() is None:
                time.sleep(0.05)
            time.sleep(delay)
            with _quiet():
                os.kill(process.pid, signal.SIGKILL)
            return {"after_manifest_s": round(delay, 2)}

        result = self._faulted_run(out, act)
        return result, (), result.pop("detail")

    def inject_s3(self, rng, out):
        if self.proxy is None:
            self.start_s3()
        rate = round(rng.uniform(0.02, 0.1), 3)
        self.proxy.configure(rate, stall_s=2.5)
        self.proxy.injected.clear()
        remote = f"s3://faults/{Path(out).name}"
        result = self._faulted_run(remote, lambda p, s: None)
        self.proxy.configure(0)
        result["output"] = remote
        return result, (), {"rate": rate, "injected": sum(self.proxy.injected.values())}

    def inject_disk_full(self, rng, out):
        """Half the trials fill the build's disk (mid-shard), half the publish path's (mid-publish)."""
        during_publish = rng.random() < 0.5
        mount = Path(out + "-publish" if during_publish else out)
        mount.mkdir(parents=True, exist_ok=True)
        if during_publish:  # room for part of the dataset
            low, high, extra = 50_000, self.dataset_bytes, ("--set", f"output.publish.path={mount}")
        else:  # from just the tokenizer (3.6 MB) to almost all the build needs
            low, high, extra = 3_700_000, self.build_bytes, ()
        size_kb = int(rng.uniform(low, high) / 1024)
        if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(mount)]).returncode:
            raise SystemExit("disk_full needs `mount -t tmpfs` (root)")
        result = self._faulted_run(out, lambda p, s: None, *extra)
        subprocess.run(["mount", "-o", "remount,size=512m", str(mount)], check=True)  # space freed
        result["publish_root"] = str(mount) if during_publish else None
        detail = {"size_kb": size_kb, "mount": str(mount), "during": "publish" if during_publish else "build"}
        return result, extra, detail

    def inject_oom(self, rng, out):
        # The big document is in the corpus for every run of this kind (and only this kind's runs): its clean
        # reference is the faulted trial's own rerun against the first one's.
        big = self.work / "corpus" / "zz-big.jsonl"
        if not big.exists():
            shutil.copy(big_document(self.work, self.args.big_mb), big)
            self.clean("clean-with-big-document")  # a new reference (a new output: plan.json is reused)
        limit = f"{rng.randint(350, 500)}MiB"  # a worker idles at ~110 MB and tokenizes a 96 KB shard well under it
        result = self._faulted_run(out, lambda p, s: None, "--set", f"dask.memory_limit={limit}")
        return result, (), {"memory_limit": limit}

    def inject_corruption(self, rng, out):
        shutil.copytree(self.clean_dir, out, symlinks=True)
        shutil.rmtree(Path(out) / "demo-gpt2")  # published copy: the rerun publishes again
        committed = sorted(
            rel for stage in ("tokenize", "pack") for m in sorted((Path(out) / "_commits" / stage).glob("*.json"))
            for rel in json.loads(m.read_text())["files"]
        )  # fmt: skip
        rel = rng.choice(committed)
        path = Path(out) / rel
        how = rng.choice(["bit flip", "truncate", "delete"])
        if how == "delete":
            path.unlink()
        else:
            data = bytearray(path.read_bytes())
            if how == "bit flip":
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            else:
                data = data[: rng.randrange(len(data))]
            path.write_bytes(bytes(data))
        return {"rc": None, "hung": False, "message": "", "seconds": 0}, (), {"file": rel, "how": how}

    def inject_server(self, rng, out):
        at, down = self._random_moment(rng), rng.uniform(1, 15)

        def act(process, started):
            landed = _sleep_until(started + at, process)
            self.kill_server()
            time.sleep(down)
            self.restart_server()
            return {"at": round(at, 1), "down_s": round(down, 1), "landed": landed}

        result = self._faulted_run(out, act)
        return result, (), result.pop("detail")

    def inject_server_outage(self, rng, out):
        at = self._random_moment(rng)

        def act(process, started):
            landed = _sleep_until(started + at, process)
            self.kill_server()
            return {"at": round(at, 1), "landed": landed}

        result = self._faulted_run(out, act)
        self.restart_server()
        return result, (), result.pop("detail")


@contextlib.contextmanager
def _environ(**changes):
    """Environment variables set (None: removed) for the block, then restored."""
    saved = {k: os.environ.get(k) for k in changes}
    try:
        for k, v in changes.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def last_error(output: str) -> str:
    """The CLI's last words: its `error:` line (Prefect's own stderr may precede it on the same line) and the
    indented lines under it, one per failed shard."""
    lines = output.splitlines()
    starts = [i for i, line in enumerate(lines) if "error: " in line]
    if not starts:
        return ""
    first = lines[starts[-1]]
    return "\n".join([first[first.index("error: ") :], *lines[starts[-1] + 1 :]])


# A timed fault that found its run already ended tested nothing: its moment is drawn again, this many times at most.
MOMENT_DRAWS = 3


def _sleep_until(deadline: float, process: subprocess.Popen) -> bool:
    """Wait for the deadline; whether the run is still going then (else the fault lands after it)."""
    while time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.05)
    return process.poll() is None


def _session(p: psutil.Process) -> int | None:
    try:
        return os.getsid(p.pid)
    except OSError:
        return None


def _workers(root: int) -> list[psutil.Process]:
    """The Dask worker processes of a run's LocalCluster: the children of its forkserver (in the cluster's own
    process, a child of the run's)."""
    try:
        children = psutil.Process(root).children(recursive=True)
    except psutil.Error:
        return []
    for child in children:
        try:  # a child may end between the listing and this look (a short-lived helper process)
            if "forkserver" in " ".join(child.cmdline()):
                return child.children()
        except psutil.Error:
            continue
    return []


class _quiet:
    def __enter__(self):
        return self

    def __exit__(self, kind, error, tb):
        return kind is not None and issubclass(kind, ProcessLookupError | psutil.Error | OSError)


def outcome(record: dict) -> str:
    faulted = record["faulted"]
    if faulted.get("hung"):
        return "hung"
    if faulted.get("rc") in (None, 0):
        return "completed"
    if faulted["rc"] == -signal.SIGKILL or faulted["rc"] == 128 + signal.SIGKILL:
        return "killed"
    return "failed"


def summarize(records: list[dict]) -> list[dict]:
    rows = []
    for kind, group in _by_kind(records).items():
        outcomes = Counter(outcome(r) for r in group)
        failed = [r for r in group if outcome(r) == "failed"]
        rows.append(
            {
                "kind": kind,
                "trials": len(group),
                # a kill timed past the run's end (runs vary with the host's load) tested nothing
                "fault landed mid-run": sum(r["detail"].get("landed", True) for r in group),
                "byte_identical": sum(r["identical"] for r in group),
                "hung": outcomes["hung"] + sum(r["rerun"]["hung"] for r in group),
                "faulted run completed": outcomes["completed"],
                "failed": len(failed),
                "failed with a clear error": sum(bool(NAMES_WHAT.search(r["faulted"]["message"])) for r in failed),
                "killed": outcomes["killed"],
                "rerun completed": sum(r["rerun"]["rc"] == 0 for r in group),
                "documents lost or duplicated": sum(abs(r["documents_delta"] or 0) for r in group)
                + sum(r["documents_delta"] is None for r in group),
                "max faulted run s": max((r["faulted"].get("seconds") or 0) for r in group),
                "leftover processes": sum(r["faulted"].get("leftover_processes", 0) for r in group),
            }
        )
    return rows


def _by_kind(records):
    groups = defaultdict(list)
    for r in records:
        groups[r["kind"]].append(r)
    return groups


def print_table(rows: list[dict]) -> None:
    if not rows:
        return
    headers = list(rows[0])
    print("| " + " | ".join(headers) + " |")
    print("|" + "---|" * len(headers))
    for row in rows:
        print("| " + " | ".join(str(row[h]) for h in headers) + " |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20, help="trials per fault kind")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of {','.join(KINDS)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--corpus-mb", type=float, default=3.0, help="input size")
    parser.add_argument("--shard-size", default="96KB", help="partition.shard_size: many small shards")
    parser.add_argument("--workers", type=int, default=2, help="LocalCluster worker processes")
    parser.add_argument("--big-mb", type=int, default=40, help="the oom kind's one large document")
    parser.add_argument("--hang-s", type=float, default=600, help="a faulted run still running then is hung")
    parser.add_argument("--work", default=None, help="working directory (default: a new temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep each trial's output")
    parser.add_argument("--report", default=None, help="write every trial's record and the table as JSON")
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    if unknown := set(kinds) - set(KINDS):
        parser.error(f"unknown kinds {sorted(unknown)}")
    # oom adds its large document to the corpus (and remakes the clean reference): last in each round.
    kinds.sort(key=lambda k: k == "oom")
    campaign = Campaign(args)
    records = []
    try:
        campaign.start_server()
        campaign.clean("warm-up")  # a campaign's first run is slower than the rest (the server's first flow, caches)
        campaign.clean()
        # Round by round (one trial of every kind, then the next), so a campaign stopped early covers all kinds.
        for index in range(args.trials):
            for kind in kinds:
                record = campaign.trial(kind, index)
                records.append(record)
                faulted = record["faulted"]
                print(
                    f"{kind} #{index}: {outcome(record)} in {faulted.get('seconds')} s {record['detail']} "
                    f"{faulted.get('message', '')[:400]!r}; rerun rc {record['rerun']['rc']}"
                    f" in {record['rerun']['seconds']} s; identical {record['identical']}"
                    f"{' differing ' + str(record['differing']) if not record['identical'] else ''}"
                    f"{' ' + str(record['redone_lines']) if record['redone_lines'] else ''}",
                    flush=True,
                )
                if args.report:  # after every trial: a campaign cut short still leaves its table
                    report = {"table": summarize(records), "trials": records}
                    Path(args.report).write_text(json.dumps(report, indent=1, default=str))
    finally:
        campaign.stop()
    rows = summarize(records)
    print_table(rows)
    bad = any(
        r["hung"] or r["byte_identical"] < r["trials"] or r["documents lost or duplicated"]
        or r["failed with a clear error"] < r["failed"] for r in rows
    )  # fmt: skip
    return 1 if bad else 0


if __name__ == "__main__":
    if not SHARED.is_dir():  # the benchmarks' corpora and tokenizers; the tests read tests/data
        raise SystemExit(f"bench/faults.py reads the corpora and tokenizers of {SHARED}, which is missing")
    sys.exit(main())
