"""What orchestration costs per shard: `tokenmill run` (default config, GPT-2) over a corpus cut into many
tiny shards, so that nearly all of a run's time is orchestration.

The corpus: the shared corpora (all but DNA) cut into documents of about `--doc-chars` characters, one plain
JSONL; `partition.shard_size` is set so the plan has about `--shards` shards. A fresh Prefect server (SQLite,
its own PREFECT_HOME) is started before each run, so its database holds that run only. Printed per run:

- wall time from process start to exit, per shard, and orchestration per shard: (wall - encoder alone) /
  shards, where "encoder alone" is gigatoken over every text in memory in one process, divided by the workers;
- CPU seconds per shard of each process: the flow process, the LocalCluster's process (its scheduler and
  nannies), the Dask workers, the Prefect server;
- the flow process's peak RSS, and its RSS once the encoder is chosen (before the shards: the rise above it per
  shard is what the flow holds per shard), the LocalCluster process's peak RSS, Prefect task runs and flow runs,
  the database's size, files per shard.

    python bench/orchestration.py --shards 1000             # a quick look
    python bench/orchestration.py --shards 100000           # the 100,000-shard run (about 100 MB)

`--code <another checkout>` measures that checkout's tokenmill with this venv (e.g. the commit before a change).
`--against <another checkout>` runs that checkout's too, alternately with `--code`'s (`--runs` each: A B A B ...),
then prints the median wall and CPU of each and their ratios. The CPU is that of the whole run: `tokenmill run` and
every process it started and waited for (`getrusage`), and the Prefect server's; on a shared host it moves far
less than the wall.

    python bench/orchestration.py --shards 1000 --runs 7 --against ../before   # this checkout against ../before
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import orjson
import psutil
from throughput import tokenmill_command  # beside this file

from tokenmill.core.layout import ENCODER_CHOICE

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
SOURCES = ["enwiki_slice", "wikitext", "web_scrapinghub_aeb", "web_dclm_annotated", "web_trafilatura_pages",
           "multilingual", "code"]  # fmt: skip


def make_corpus(target: Path, doc_chars: int) -> tuple[int, int]:
    """The shared corpora (DNA aside) cut into documents of about `doc_chars` characters; (documents, bytes)."""
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target.with_suffix(".tmp"), "wb") as out:
            for source in SOURCES:
                for path in sorted((SHARED / "corpora" / source).glob("*.jsonl.gz")):
                    for line in gzip.open(path):
                        doc = orjson.loads(line)
                        text = doc["text"]
                        for part, start in enumerate(range(0, len(text), doc_chars)):
                            piece = {"id": f"{doc['id']}#{part}", "text": text[start : start + doc_chars]}
                            out.write(orjson.dumps(piece) + b"\n")
        target.with_suffix(".tmp").rename(target)
    with open(target, "rb") as f:
        return sum(1 for _ in f), target.stat().st_size


def encoder_alone_seconds(corpus: Path, tokenizer: Path) -> float:
    """gigatoken over every text of the corpus, in memory, in one process (as the flow's encoder choice takes)."""
    from tokenmill.tokenizers.encoders import new_backend

    texts = [orjson.loads(line)["text"] for line in open(corpus, "rb")]
    encoder = new_backend("gigatoken", tokenizer.read_bytes())
    encoder.encode_batch(texts[:1000])  # warm its caches, as a worker's first shard does
    started = time.perf_counter()
    for start in range(0, len(texts), 20_000):
        encoder.encode_batch(texts[start : start + 20_000])
    return time.perf_counter() - started


class ProcessWatch:
    """Peak RSS of the flow's process and of the LocalCluster's (its scheduler and nannies), and the CPU seconds
    of process groups, polled (exited processes keep their last reading)."""

    def __init__(self, flow_pid: int, server_pid: int, choice: Path):
        self.flow, self.server_pid = psutil.Process(flow_pid), server_pid
        self.peak_rss, self.peak_cluster_rss, self.cpu = 0, 0, {}
        # the flow's RSS once the run's encoder choice (`choice`) is written: what it holds before its shards
        self.choice, self.rss_at_choice = choice, 0
        server = psutil.Process(server_pid)
        self.baseline = sum(sum(p.cpu_times()[:2]) for p in [server, *server.children(recursive=True)])
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        while not self.stop.wait(0.25):
            try:
                rss = self.flow.memory_info().rss
                self.peak_rss = max(self.peak_rss, rss)
                if not self.rss_at_choice and self.choice.exists():
                    self.rss_at_choice = rss
                roles = {self.flow.pid: "flow"}
                for child in self.flow.children(recursive=True):
                    roles[child.pid] = "scheduler" if "serve_local_cluster" in " ".join(child.cmdline()) else "worker"
                    if roles[child.pid] == "scheduler":
                        self.peak_cluster_rss = max(self.peak_cluster_rss, child.memory_info().rss)
                server = psutil.Process(self.server_pid)
                roles |= {server.pid: "server"} | {p.pid: "server" for p in server.children(recursive=True)}
                for pid, role in roles.items():
                    times = psutil.Process(pid).cpu_times()
                    self.cpu[pid] = (role, times.user + times.system)
            except psutil.Error:
                continue

    def close(self) -> dict[str, float]:
        self.stop.set()
        self.thread.join()
        totals: dict[str, float] = {}
        for role, seconds in self.cpu.values():
            totals[role] = totals.get(role, 0.0) + seconds
        totals["server"] -= self.baseline  # the server started before the run
        return totals


def count(api: str, what: str, home: Path) -> int:
    """How many `what` the server holds. A server that answers its user only (tokenmill's own, from the version that
    made it so) is asked with the password in `home` and a CSRF token."""
    auth_file = home / "tokenmill-server-auth"
    if not auth_file.exists():
        return httpx.post(f"{api}/{what}/count", json={}, timeout=60).json()
    user, password = auth_file.read_text().strip().split(":", 1)
    token = httpx.get(f"{api}/csrf-token", params={"client": "bench"}, auth=(user, password), timeout=60)
    headers = {"Prefect-Csrf-Token": token.json()["token"], "Prefect-Csrf-Client": "bench"}
    return httpx.post(f"{api}/{what}/count", json={}, auth=(user, password), headers=headers, timeout=60).json()


def run_once(corpus: Path, shard_size: int, work: Path, python: str, code: Path) -> dict:
    home, out = work / "prefect-home", work / "out"
    shutil.rmtree(home, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "TOKENMILL_DASK_ADDRESS")}
    env |= {"PREFECT_HOME": str(home), "CI": "1", "PREFECT_LOGGING_LEVEL": "INFO", "PYTHONPATH": str(code)}
    tokenmill = tokenmill_command(python, code)  # run from `code`: `python -m` puts the working directory first
    subprocess.run([*tokenmill, "server", "start"], env=env, cwd=code, capture_output=True, check=True)
    server = json.loads((home / "tokenmill-server.json").read_text())
    api, server_pid = server["api_url"], server["pid"]
    config = work / "config.yaml"
    config.write_text(
        f"name: orchestration\ninput: {{paths: [{corpus}]}}\npartition: {{shard_size: {shard_size}}}\n"
        f"tokenizer: {{path: {SHARED / 'tokenizers/gpt2/tokenizer.json'}}}\noutput: {{path: {out}}}\n"
    )
    env["PREFECT_API_URL"] = api
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    process = subprocess.Popen([*tokenmill, "run", str(config)], env=env, cwd=code,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    watch = ProcessWatch(process.pid, server_pid, out / ENCODER_CHOICE)
    output, _ = process.communicate()
    wall = time.perf_counter() - began
    reap_orphans(keep=server_pid)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = watch.close()
    # the run's process tree, each process counted once it is waited for: no process is missed between two polls
    tree = children.ru_utime + children.ru_stime - children_before.ru_utime - children_before.ru_stime
    (work.parent / "last-run.log").write_text(output)  # the run's log: where its time went
    if process.returncode:
        raise SystemExit(f"tokenmill run failed:\n{output[-3000:]}")
    plan = json.loads((out / "plan.json").read_text())
    shards = plan.get("shuffled_shards") or len(plan["shards"])
    published = json.loads((out / "manifest.json").read_text())
    published_copy = out / "orchestration"  # <output.path>/<name>/<version>/: links to the built files
    built = sum(len(files) for root, _, files in os.walk(out) if not Path(root).is_relative_to(published_copy))
    result = {
        "shards": shards,
        "documents": published["counts"]["documents_in"],
        "wall_s": round(wall, 1),
        "cpu_s": {role: round(seconds, 1) for role, seconds in sorted(cpu.items())},
        "cpu_total_s": round(tree + cpu.get("server", 0.0), 1),
        "flow_peak_rss_mb": round(watch.peak_rss / 2**20),
        "flow_rss_at_choice_mb": round(watch.rss_at_choice / 2**20),
        "scheduler_peak_rss_mb": round(watch.peak_cluster_rss / 2**20),
        "task_runs": count(api, "task_runs", home),
        "flow_runs": count(api, "flow_runs", home),
        "db_mb": round(sum(p.stat().st_size for p in home.glob("prefect.db*")) / 2**20, 1),
        "files_per_shard": round(built / shards, 2),
        "manifest_files": len(published["files"]),
    }
    subprocess.run([*tokenmill, "server", "stop"], env=env, cwd=code, capture_output=True)
    reap_orphans()
    return result


def adopt_orphans() -> None:
    """Make this process the reaper of every process its runs leave behind (Linux's child subreaper): the LocalCluster's
    forkserver and workers, which outlive their parents by a moment, then count in `getrusage(RUSAGE_CHILDREN)` once
    `reap_orphans` waits for them, rather than in init's."""
    import ctypes

    pr_set_child_subreaper = 36
    if ctypes.CDLL(None, use_errno=True).prctl(pr_set_child_subreaper, 1, 0, 0, 0) != 0:
        raise SystemExit(f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(ctypes.get_errno())}")


def reap_orphans(keep: int | None = None, timeout_s: float = 60) -> None:
    """Wait for the processes adopted (`adopt_orphans`) to end, but `keep` (the Prefect server, still running) and
    the processes it runs under."""
    kept = {keep}
    with contextlib.suppress(psutil.NoSuchProcess):  # a server that died: nothing of it to keep
        kept |= {p.pid for p in psutil.Process(keep).parents()} if keep else set()
    deadline = time.monotonic() + timeout_s
    while orphans := [p.pid for p in psutil.Process().children() if p.pid not in kept]:
        for pid in orphans:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        if time.monotonic() > deadline:
            raise SystemExit(f"processes {orphans} left by the run did not end within {timeout_s:.0f} s")
        time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=1000, help="about this many shards")
    parser.add_argument("--doc-chars", type=int, default=700, help="characters per document")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="the LocalCluster's workers")
    parser.add_argument("--work", type=Path, default=REPO / "out" / "bench-orchestration")
    parser.add_argument("--code", type=Path, default=REPO, help="the checkout whose tokenmill runs")
    parser.add_argument(
        "--against", type=Path, help="another checkout, run alternately with --code's; medians compared"
    )
    args = parser.parse_args()

    corpus = args.work / f"corpus-{args.doc_chars}.jsonl"
    documents, size = make_corpus(corpus, args.doc_chars)
    shard_size = max(1, size // args.shards)
    encoder = encoder_alone_seconds(corpus, SHARED / "tokenizers/gpt2/tokenizer.json") / args.workers
    print(f"# {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; corpus "
          f"{documents:,} documents, {size / 1e6:.0f} MB, shard_size {shard_size} B; encoder alone "
          f"{encoder:.1f} s on {args.workers} workers", flush=True)  # fmt: skip
    adopt_orphans()
    checkouts = [args.code.resolve(), *([args.against.resolve()] if args.against else [])]
    results: dict[Path, list[dict]] = {code: [] for code in checkouts}
    for _ in range(args.runs):
        for code in checkouts:
            with tempfile.TemporaryDirectory(dir=args.work) as work:
                r = run_once(corpus, shard_size, Path(work), sys.executable, code)
            results[code].append(r)
            report(r, encoder, code if args.against else None)
    if args.against:
        compare(results)


def report(r: dict, encoder: float, code: Path | None) -> None:
    n = r["shards"]
    per_shard = {role: f"{1000 * s / n:.1f} ms" for role, s in r["cpu_s"].items()}
    print(json.dumps(r | ({"code": str(code)} if code else {})))
    print(f"{n:,} shards in {r['wall_s']} s: {1000 * r['wall_s'] / n:.1f} ms per shard, orchestration "
          f"{1000 * (r['wall_s'] - encoder) / n:.1f} ms per shard; CPU per shard {per_shard}, "
          f"{1000 * r['cpu_total_s'] / n:.1f} ms in all; flow peak RSS "
          f"{r['flow_peak_rss_mb']} MB ({r['flow_rss_at_choice_mb']} MB once the encoder was chosen: "
          f"{(r['flow_peak_rss_mb'] - r['flow_rss_at_choice_mb']) * 2**20 / n / 1000:.1f} KB per shard above it), "
          f"the LocalCluster's process (scheduler, nannies) {r['scheduler_peak_rss_mb']} MB; "
          f"{r['task_runs']} task runs, {r['flow_runs']} flow runs, "
          f"database {r['db_mb']} MB, {r['files_per_shard']} files per shard", flush=True)  # fmt: skip


def compare(results: dict[Path, list[dict]]) -> None:
    """The median wall and CPU of each checkout's runs, and the first's over the second's."""
    medians = {
        code: (statistics.median(r["wall_s"] for r in runs), statistics.median(r["cpu_total_s"] for r in runs))
        for code, runs in results.items()
    }
    (ours, (wall, cpu)), (theirs, (their_wall, their_cpu)) = medians.items()
    for code, runs in results.items():
        walls, cpus = [r["wall_s"] for r in runs], [r["cpu_total_s"] for r in runs]
        print(f"{code}: {len(runs)} runs, walls {walls} s, CPU {cpus} s; medians {medians[code][0]:.1f} s of wall, "
              f"{medians[code][1]:.1f} s of CPU", flush=True)  # fmt: skip
    print(f"{ours} against {theirs}: wall {wall / their_wall:.3f}, CPU {cpu / their_cpu:.3f} (ratios of medians)")


if __name__ == "__main__":
    if not SHARED.is_dir():  # the benchmarks' corpora and tokenizers; the tests read tests/data
        raise SystemExit(f"bench/orchestration.py reads the corpora and tokenizers of {SHARED}, which is missing")
    main()
