"""tokenmill against Megatron-LM's `tools/preprocess_data_fast.py --use-gigatoken`, side by side on one file.

Both tools turn the same plain JSONL (enwiki_slice written `--repeat` times, unique ids; or `--corpus FILE` as it
is, e.g. the code or prose corpus bench/corpora.py builds) into GPT-2 ids with EOD appended, as Megatron
`.bin/.idx`. With `--corpus`, each round first measures this machine's parse+encode limit on that corpus
(bench/limits.py's, the library alone on its first `--ceiling-mb`, texts in memory), and tokenmill's median rate is
given against the median limit. With `--code DIR` (repeatable), tokenmill from that checkout (e.g. the commit before
a change) is one more tool in the same rounds. `--tokenizer` (GPT-2's by default; anything `tokenizer.path` takes)
is tokenmill's and the limit's, as a run loads it (Megatron's is `--megatron-tokdir`, made from the same file);
`--without-megatron` leaves Megatron out, for a tokenizer its fast path refuses (Granite's lacks bytes, and it knows
no spelling of cl100k's pattern as HF tokenizers reads it). Each round runs every tool from scratch, the order
rotated from round to round (Megatron first in the first, then tokenmill, then the next; with two tools, they
alternate; rounds a multiple of the tools put each tool in each place equally often), each tool's own modules
compiled to bytecode before the first (`compiled`), and records:

- wall time from spawn to exit (`tokenmill run`: the CLI with its default config, `pack.mode: none` since
  Megatron's tool does not pack; each checkout's runs report to its own Prefect server, in its own PREFECT_HOME,
  started by that checkout's CLI once before the rounds, as a user's is);
- the largest process's peak RSS and the peak RSS of the whole process tree, polled every 50 ms with psutil
  (a watchdog kills a tool whose tree passes `--memory-cap`, or when the host has under 1.5 GB left, and
  reports that it ran out);
- the CPU seconds of the tool's processes (polled, or `wait4`'s if more) and, for tokenmill, those of the
  Prefect server during the run: on a host shared with other work, wall time follows CPU time;
- the tokens written (from the `.idx` files), which must be equal;
- for tokenmill, the seconds of each phase of the run, from its log's time stamps, and each phase's CPU seconds
  by kind of process (flow, workers, forkserver, Prefect server) with the core-seconds none used: a phase
  with idle cores is bound by one process, one without by the cores (a median table after the rounds);
- the 1-minute load average when the round started (other work on the host slows both tools).

With `--code`, a table then gives each checkout's medians (wall, CPU s, the server's CPU s, peak RSS) and their
ratios to this checkout's, and each checkout's phases.

With `--big-repeat N` it then runs once on enwiki_slice x N (x200: 12 GB; with `--corpus`, that file N times):
tokenmill's throughput against the parse+encode limit and the encoder ceiling measured just before (bench/limits.py's:
the cores over pyarrow's parse and gigatoken alone, and the cores x gigatoken alone, each on one core, the texts of
the file's first `--ceiling-mb` in memory), the largest worker's memory, and what Megatron's tool does with it.
bench/limits.py measures the other limits beside tokenmill at several sizes.

Megatron-LM is not part of tokenmill: fetch NVIDIA/Megatron-LM, export its `megatron/` and `tools/`, make a
venv that sees this project's packages plus Megatron's imports, and a transformers tokenizer directory whose
eos is the EOD (the recipe is `../shared/peers/README.md`), then:

    MEGATRON_LM_DIR=/tmp/megatron-lm MEGATRON_PYTHON=/tmp/megfast/bin/python MEGATRON_TOKDIR=/tmp/gpt2-hfdir \\
        .venv/bin/python bench/megatron.py --rounds 5 [--big-repeat 200] [--code ../base]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil
import throughput  # beside this file

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
POLL_S = 0.05
RESERVE = int(1.5e9)  # the watchdog also kills a tool when the host has less memory than this left


class Watched:
    """A command run to its exit while a thread polls its process tree: the wall time, the largest
    process's and the whole tree's peak RSS, why the watchdog killed it, if it did, and each kind of process's
    CPU seconds over time (`timeline`), with those of `beside` (a server the command talks to) since the start."""

    def __init__(
        self,
        command: list[str],
        env: dict,
        cap: int,
        log: Path,
        beside: psutil.Process | None = None,
        cwd: Path | None = None,
    ):
        self.peak_process = self.peak_tree = 0
        self.killed = False
        self.cpu_by_process: dict[int, tuple[str, float]] = {}  # pid -> (what, CPU seconds when last seen)
        self.timeline: list[tuple[float, dict[str, float]]] = []  # (time, CPU seconds so far by what)
        self.beside, self.beside_cpu = beside, _cpu(beside)
        with open(log, "wb") as out:
            self.spawned, started = time.time(), time.perf_counter()
            self.process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=cwd)
            self.done = threading.Event()  # the watcher must not poll(): that could reap the child before wait4
            watcher = threading.Thread(target=self._watch, args=(cap,), daemon=True)
            watcher.start()
            _, status, usage = os.wait4(self.process.pid, 0)  # with the CPU time of the tree it reaped
            self.wall = time.perf_counter() - started
            self.process.returncode = self.returncode = os.waitstatus_to_exitcode(status)
            self.done.set()
            self.cpu = usage.ru_utime + usage.ru_stime
            self.ended = time.time()
            watcher.join()
        self.log = log.read_text(errors="replace")

    def _tree(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.process.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def _watch(self, cap: int) -> None:
        while not self.done.is_set():
            sizes = []
            for p in self._tree():
                with contextlib.suppress(psutil.Error):
                    sizes.append(p.memory_info().rss)
                    what = self.cpu_by_process.get(p.pid, ("", 0.0))[0]
                    if what in ("", p.name()):  # a process just forked may not show its command line yet
                        what = "main" if p.pid == self.process.pid else _role(p)
                    times = p.cpu_times()
                    self.cpu_by_process[p.pid] = (what, times.user + times.system)
            by_what: dict[str, float] = {}
            for what, cpu in self.cpu_by_process.values():
                by_what[what] = by_what.get(what, 0.0) + cpu
            if self.beside is not None:
                by_what["prefect server"] = _cpu(self.beside) - self.beside_cpu
            self.timeline.append((time.time(), by_what))
            if sizes:
                self.peak_process = max(self.peak_process, max(sizes))
                self.peak_tree = max(self.peak_tree, sum(sizes))
            short = psutil.virtual_memory().available < RESERVE
            if sum(sizes) > cap or short:
                self.killed = "the host ran short of memory" if short else "its processes passed the cap"
                for p in reversed(self._tree()):
                    with contextlib.suppress(psutil.Error):
                        p.kill()
            time.sleep(POLL_S)


def _role(process: psutil.Process) -> str:
    """What a process of a run's tree is, for the CPU breakdown: forkserver, Dask nanny or worker, ..."""
    command = " ".join(process.cmdline())
    if "forkserver" in command and process.parent() and "forkserver" in " ".join(process.parent().cmdline()):
        return "dask worker or nanny"
    if "serve_local_cluster" in command:
        return "dask scheduler and nannies"
    for name in ("forkserver", "resource_tracker", "prefect"):
        if name in command:
            return name
    return process.name()


def idx_tokens(prefixes: list[Path]) -> tuple[int, int]:
    """(documents, tokens) of Megatron `.idx` files, from their headers and length arrays."""
    from tokenmill.formats.megatron import MegatronIndex

    documents = tokens = 0
    for prefix in prefixes:
        index = MegatronIndex(f"{prefix}.idx")
        documents += len(index.document_indices) - 1
        tokens += int(index.lengths.sum(dtype=np.int64))
    return documents, tokens


PHASES = [  # (phase, the log line that ends it); Prefect stamps its lines with the local time of day
    ("start-up: imports, server, cluster", r"Beginning flow run"),
    ("tokenizer, partition", r"planned \d+ shards"),  # a pretrained tokenizer is installed first
    ("encoder choice (the sample meanwhile)", r"encoder: "),
    ("tokenize", r" - tokenize[+\w]* [^:]*: \d+ shards"),  # tokenize+check, tokenize+pack+check
    ("validate", r"Task run 'validate-\w+' - Finished"),
    ("publish", r" - published "),
    ("flow end", r"Flow run .* - Finished in state"),
]


def phases(log: str, spawned: float, ended: float) -> dict[str, float]:
    """Seconds per phase of a `tokenmill run`, from its log's time stamps (the last line of each kind)."""
    day = datetime.datetime.fromtimestamp(spawned).replace(hour=0, minute=0, second=0, microsecond=0).timestamp()
    marks = {}
    for line in log.splitlines():
        stamp = re.match(r"(\d\d):(\d\d):(\d\d\.\d+) \|", line)
        for name, pattern in PHASES:
            if stamp and re.search(pattern, line):
                h, m, sec = stamp.groups()
                marks[name] = day + int(h) * 3600 + int(m) * 60 + float(sec)
    times, previous = {}, spawned
    for name, _ in PHASES:
        if name in marks:
            times[name], previous = round(marks[name] - previous, 2), marks[name]
    times["exit"] = round(ended - previous, 2)
    return times


def run_megatron(args, corpus: Path, out: Path, cap: int) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    env = os.environ | {
        "MEGATRON_LM_DIR": args.megatron_dir,
        "PYTHON": args.megatron_python,
        "CORPUS": str(corpus),
        "TOKDIR": args.megatron_tokdir,
        "OUT": str(out),
    }
    run = Watched(["bash", args.megatron_script], env, cap, out.parent / f"{out.name}.log")
    prefixes = [p.with_suffix("") for p in out.glob("*.idx")]
    counted = idx_tokens(prefixes) if run.returncode == 0 else (None, None)
    if run.returncode != 0 and not run.killed:
        print(run.log[-3000:], file=sys.stderr)
    return {"tool": "megatron", **_numbers(run), "documents": counted[0], "tokens": counted[1]}


def compiled(python: str, *trees: Path) -> None:
    """Each tool's own modules compiled to bytecode before the rounds, as a user's runs find them (pip compiles an
    installed package; a checkout's first run writes them): where PYTHONDONTWRITEBYTECODE is set, as on this
    machine, every run compiled them again, Megatron-LM's (about 1.7 s of a 12 MB run) far more than tokenmill's."""
    subprocess.run([python, "-m", "compileall", "-q", *map(str, trees)], check=True, stdout=subprocess.DEVNULL)


def packages(checkout: Path) -> list[Path]:
    """The checkout's own packages, as its pyproject.toml ships them (`tokenmill*`, `tasks*`, `flows*`)."""
    found = tomllib.loads((checkout / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    return sorted({checkout / pattern.split(".")[0].rstrip("*") for pattern in found["include"]})


@dataclass
class Checkout:
    """A checkout of tokenmill in the rounds: its name as a tool, and its runs' environment and Prefect server."""

    tool: str
    code: Path
    env: dict
    server: psutil.Process


@contextlib.contextmanager
def checkout(tool: str, code: Path, home: Path) -> Iterator[Checkout]:
    """The checkout `code` with its own PREFECT_HOME `home` and server, started before the rounds by that checkout's
    CLI (as a user's is) and stopped after them. One server for all would not do: a checkout from before issue 46
    starts one without a password, and a later one stops such a server as unsafe."""
    code = code.resolve()
    unset = ("RAYON_NUM_THREADS", "PREFECT_API_URL", "PREFECT_API_AUTH_STRING", "OPENBLAS_NUM_THREADS")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    # Ahead of the venv's editable install; and run from there, since `python -m` and `-c` (the flow, the cluster's
    # processes) put their working directory ahead of PYTHONPATH.
    env |= {"PREFECT_HOME": str(home), "PYTHONPATH": str(code)}
    tokenmill = throughput.tokenmill_command(code=code)
    subprocess.run([*tokenmill, "server", "start"], env=env, cwd=code, capture_output=True, check=True)
    try:
        server = json.loads((home / "tokenmill-server.json").read_text())
        yield Checkout(tool, code, env | {"PREFECT_API_URL": server["api_url"]}, psutil.Process(server["pid"]))
    finally:
        subprocess.run([*tokenmill, "server", "stop"], env=env, cwd=code, capture_output=True)


def run_tokenmill(args, mill: Checkout, corpus: Path, out: Path, cap: int) -> dict:
    """`tokenmill run` on `corpus` from the checkout `mill`, reporting to its server."""
    shutil.rmtree(out, ignore_errors=True)
    config = out.parent / f"{out.name}.yaml"
    config.write_text(
        json.dumps(
            {
                "name": "bench",
                "input": {"paths": [str(corpus.resolve())]},
                "tokenizer": {"path": str(Path(args.tokenizer).resolve())},
                "pack": {"mode": args.pack_mode},
                "output": {"path": str(out.resolve())},
            }
        )  # fmt: skip
    )
    command = [*throughput.tokenmill_command(code=mill.code), "run", str(config.resolve())]
    server_cpu = _cpu(mill.server)
    run = Watched(command, mill.env, cap, out.parent / f"{out.name}.log", beside=mill.server, cwd=mill.code)
    server_cpu = round(_cpu(mill.server) - server_cpu, 1)
    counted = (None, None)
    if run.returncode == 0:
        counted = idx_tokens([p.with_suffix("") for p in sorted((out / "megatron").glob("*/shard-*.idx"))])
    else:
        print(run.log[-3000:], file=sys.stderr)
    row = {"tool": mill.tool, **_numbers(run), "documents": counted[0], "tokens": counted[1]}
    by_role: dict[str, float] = {}
    for what, cpu in run.cpu_by_process.values():
        by_role[what] = round(by_role.get(what, 0) + cpu, 1)
    times = phases(run.log, run.spawned, run.ended)
    return row | {
        "server_cpu_s": server_cpu,
        "cpu_by_process": by_role,
        "phases": times,
        "phase_cpu": phase_cpu(run.timeline, run.spawned, times),
    }


def phase_cpu(timeline: list[tuple[float, dict[str, float]]], spawned: float, times: dict[str, float]) -> dict:
    """Each phase's CPU seconds by kind of process, and its idle core-seconds (the cores times its wall time,
    less all of that): which phases are bound by one process and which by the cores."""
    cores = os.cpu_count() or 1
    out, start, before = {}, spawned, {}
    for name, seconds in times.items():
        end = start + seconds
        polled = [by for t, by in timeline if t <= end]
        now = polled[-1] if polled else {}
        used = {what: round(cpu - before.get(what, 0.0), 2) for what, cpu in now.items()}
        out[name] = used | {"idle": round(cores * seconds - sum(used.values()), 2)}
        start, before = end, now
    return out


def _cpu(process: psutil.Process | None) -> float:
    with contextlib.suppress(psutil.Error, AttributeError):
        times = process.cpu_times()
        return times.user + times.system + times.children_user + times.children_system
    return 0.0


def _numbers(run: Watched) -> dict:
    return {
        "wall_s": round(run.wall, 2),
        "peak_process_gb": round(run.peak_process / 1e9, 2),
        "peak_tree_gb": round(run.peak_tree / 1e9, 2),
        # each process's CPU time when last polled (workers forked by a server are not reaped into wait4's)
        "cpu_s": round(max(run.cpu, sum(cpu for _, cpu in run.cpu_by_process.values())), 1),
        "exit": run.returncode,
        "killed": run.killed,
    }


def limits_now(corpus: Path, tokenizer: str, prefix_mb: float, cores: int, copy: int) -> dict[str, float]:
    """This machine's limits on the corpus now, MB/s (bench/limits.py's, on its first `prefix_mb`, texts in memory;
    `copy`: the bytes of one copy of the corpus's source): the encoder ceiling (`cores` x gigatoken alone on one
    core) and the parse+encode limit (`cores` / (1 / pyarrow's JSON parser + 1 / gigatoken alone))."""
    import limits  # beside this file; it imports this module too

    rates = limits.with_implied(limits.limits(corpus, tokenizer, prefix_mb, copy), cores)
    return {name: rates[name] for name in ("encoder ceiling", "parse+encode limit")}


def print_rounds(rows: list[dict]) -> None:
    print("| round | tool | load | wall s | CPU s | largest process GB | process tree GB | documents | tokens |")
    print("|--:|---|--:|--:|--:|--:|--:|--:|--:|")
    for r in rows:
        wall = f"{r['wall_s']:.1f}" + (" (killed)" if r["killed"] else "" if r["exit"] == 0 else " (failed)")
        counts = " | ".join("-" if r[k] is None else f"{r[k]:,}" for k in ("documents", "tokens"))
        cpu = f"{r['cpu_s']:.1f}" + (f" + {r['server_cpu_s']:.1f} server" if "server_cpu_s" in r else "")
        print(f"| {r['round']} | {r['tool']} | {r['load']:.1f} | {wall} | {cpu} | {r['peak_process_gb']:.2f} "
              f"| {r['peak_tree_gb']:.2f} | {counts} |")  # fmt: skip


def print_checkouts(by_tool: dict[str, list[dict]], tools: list[str]) -> None:
    """The tokenmill checkouts' medians, each other checkout's also as a ratio to this one's (`--code`)."""
    columns = {"wall s": "wall_s", "CPU s": "cpu_s", "server CPU s": "server_cpu_s",
               "largest process GB": "peak_process_gb", "process tree GB": "peak_tree_gb"}  # fmt: skip
    medians = {t: {k: statistics.median(r[k] for r in by_tool[t]) for k in columns.values()} for t in tools}
    mine = medians["tokenmill"]
    print("\ntokenmill checkouts, medians over their rounds (in parentheses: theirs / this checkout's)")
    print("| tool | rounds | " + " | ".join(columns) + " |")
    print("|---|--:|" + "--:|" * len(columns))
    for tool, median in medians.items():
        ratios = {k: f" ({v / mine[k]:.3f})" if tool != "tokenmill" and mine[k] else "" for k, v in median.items()}
        cells = [f"{v:.2f}{ratios[k]}" for k, v in median.items()]
        print(f"| {tool} | {len(by_tool[tool])} | " + " | ".join(cells) + " |")


def print_phase_cpu(rows: list[dict], tool: str) -> None:
    """Median CPU seconds per phase and kind of process, and idle core-seconds, over a tokenmill's rounds."""
    names = list(rows[0]["phase_cpu"])
    kinds = sorted({k for r in rows for by in r["phase_cpu"].values() for k in by} - {"idle"}) + ["idle"]
    print(f"\n{tool}, median CPU seconds per phase (idle: core-seconds none of the run's processes used)")
    print("| phase | wall s | " + " | ".join(kinds) + " |")
    print("|---|--:|" + "--:|" * len(kinds))
    for n in names:
        wall = statistics.median(r["phases"].get(n, 0) for r in rows)
        cells = [statistics.median(r["phase_cpu"].get(n, {}).get(k, 0) for r in rows) for k in kinds]
        print(f"| {n} | {wall:.2f} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megatron-dir", default=os.environ.get("MEGATRON_LM_DIR"))
    parser.add_argument("--megatron-python", default=os.environ.get("MEGATRON_PYTHON"))
    parser.add_argument("--megatron-tokdir", default=os.environ.get("MEGATRON_TOKDIR"))
    parser.add_argument("--megatron-script", default=str(SHARED / "peers" / "megatron_fast.sh"))
    parser.add_argument("--source", default=str(SHARED / "corpora/enwiki_slice/enwiki_slice.jsonl.gz"))
    parser.add_argument("--tokenizer", default=str(SHARED / "tokenizers/gpt2/tokenizer.json"))
    parser.add_argument("--repeat", type=int, default=20, help="enwiki_slice copies in the side-by-side file")
    parser.add_argument("--corpus", type=Path, help="a JSONL to use as it is instead (bench/corpora.py makes some)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--big-repeat",
        type=int,
        default=0,
        help="then one run on this many copies (200: 12 GB) of enwiki_slice, or of --corpus",
    )
    parser.add_argument("--memory-cap", type=float, default=20.0, help="GB: the watchdog kills a tool's tree past it")
    parser.add_argument("--ceiling-mb", type=float, default=300)
    parser.add_argument("--pack-mode", default="none", help="tokenmill's pack.mode (Megatron's tool does not pack)")
    parser.add_argument("--work", default=None, help="directory for corpora and outputs (default: a temp dir)")
    parser.add_argument("--code", type=Path, action="append", default=[], help="another checkout to run too (repeats)")
    parser.add_argument(
        "--without-megatron",
        action="store_true",
        help="tokenmill against the limit alone: for a tokenizer Megatron's fast path refuses (Granite's, cl100k's)",
    )
    args = parser.parse_args()
    missing = [n for n in ("megatron_dir", "megatron_python", "megatron_tokdir") if not getattr(args, n)]
    if missing and not args.without_megatron:
        parser.error("set " + ", ".join("--" + n.replace("_", "-") for n in missing) + " (see the docstring)")
    cap = int(args.memory_cap * 1e9)
    workers = os.cpu_count() or 1

    if args.work:
        Path(args.work).mkdir(parents=True, exist_ok=True)
    tmp = tempfile.TemporaryDirectory(prefix="tokenmill-vs-megatron-", dir=args.work)
    with tmp, contextlib.ExitStack() as servers:  # the servers stop before their PREFECT_HOMEs go
        work = Path(tmp.name)
        if args.corpus:
            corpus, size, made = args.corpus.resolve(), args.corpus.stat().st_size, args.corpus.name
        else:
            corpus, made = work / "corpus.jsonl", f"{args.repeat} x {Path(args.source).name}"
            size = throughput.make_corpus(Path(args.source), args.repeat if args.rounds else 0, corpus)
        cpu = platform.processor() or platform.machine()
        print(f"corpus: {size / 1e9:.2f} GB of JSONL ({made}); "
              f"{workers} cores {cpu}, {psutil.virtual_memory().total / 2**30:.0f} GiB, "
              f"Python {platform.python_version()}")  # fmt: skip
        codes = {"tokenmill": REPO} | {f"tokenmill at {code.resolve()}": code for code in args.code}
        for code in codes.values():
            compiled(sys.executable, *packages(code))
        if not args.without_megatron:
            compiled(args.megatron_python, Path(args.megatron_dir))
        checkouts = [servers.enter_context(checkout(tool, code, work / f"prefect-{i}"))
                     for i, (tool, code) in enumerate(codes.items())]  # fmt: skip
        tools = {} if args.without_megatron else {"megatron": functools.partial(run_megatron, args)}
        tools |= {c.tool: functools.partial(run_tokenmill, args, c) for c in checkouts}
        outs = {tool: work / re.sub(r"\W+", "-", tool) for tool in tools}
        rows, limits_mb_s = [], []
        for round_ in range(1, args.rounds + 1):
            if args.corpus:  # the limit beside the tools, in each round (the host's speed drifts)
                limit = limits_now(corpus, args.tokenizer, args.ceiling_mb, workers, corpus.stat().st_size)
                limits_mb_s.append(limit["parse+encode limit"])
                print(json.dumps({"round": round_, "parse_encode_limit_mb_s": round(limits_mb_s[-1])}), flush=True)
            turn = (round_ - 1) % len(tools)  # each tool first in turn (with two: alternated)
            for tool in [*tools][turn:] + [*tools][:turn]:
                load = os.getloadavg()[0]
                row = tools[tool](corpus, outs[tool], cap)
                rows.append({"round": round_, "load": load, **row})
                print(json.dumps(rows[-1]), flush=True)
        print()
        print_rounds(rows)
        by_tool = {t: [r for r in rows if r["tool"] == t and r["exit"] == 0] for t in tools}
        medians = {t: statistics.median(r["wall_s"] for r in rs) for t, rs in by_tool.items() if rs}
        largest = {t: max(r["peak_process_gb"] for r in rs) for t, rs in by_tool.items() if rs}
        if {"megatron", "tokenmill"} <= medians.keys():
            print(f"\nmedian wall: tokenmill {medians['tokenmill']:.1f} s, Megatron {medians['megatron']:.1f} s: "
                  f"ratio {medians['tokenmill'] / medians['megatron']:.2f}; largest process: tokenmill "
                  f"{largest['tokenmill']:.2f} GB, Megatron {largest['megatron']:.2f} GB: "
                  f"ratio {largest['tokenmill'] / largest['megatron']:.2f}")  # fmt: skip
        if limits_mb_s and "tokenmill" in medians:
            limit = statistics.median(limits_mb_s)
            rate = size / 1e6 / medians["tokenmill"]
            print(f"tokenmill: {rate:.0f} MB/s = {rate / limit:.2f} of the parse+encode limit ({limit:.0f} MB/s, "
                  f"median of {len(limits_mb_s)} measured beside the runs)")  # fmt: skip
        if len(medians) > 1:
            tokens = {r["tokens"] for rs in by_tool.values() for r in rs}
            same = "equal" if len(tokens) == 1 else "DIFFER"
            print(f"tokens written: {', '.join(f'{t:,}' for t in sorted(tokens))} ({same})")
        ran = [c.tool for c in checkouts if by_tool[c.tool]]
        if len(ran) > 1 and ran[0] == "tokenmill":
            print_checkouts(by_tool, ran)
        for tool in ran:
            names = list(by_tool[tool][0]["phases"])
            medians = {n: statistics.median(r["phases"].get(n, 0) for r in by_tool[tool]) for n in names}
            print(f"\n{tool}, median seconds per phase: " + ", ".join(f"{n} {v:.1f}" for n, v in medians.items()))
            print_phase_cpu(by_tool[tool], tool)
        for out in outs.values():
            shutil.rmtree(out, ignore_errors=True)

        if args.big_repeat:
            if not args.corpus:
                corpus.unlink()
            big, source = work / "big.jsonl", args.corpus or Path(args.source)
            size = throughput.make_corpus(source, args.big_repeat, big)
            print(f"\nbig corpus: {size / 1e9:.2f} GB ({args.big_repeat} x {source.name})")
            limit = limits_now(big, args.tokenizer, args.ceiling_mb, workers, size // args.big_repeat)
            load = os.getloadavg()[0]
            mill = run_tokenmill(args, checkouts[0], big, outs["tokenmill"], cap)
            rate = size / 1e6 / mill["wall_s"]
            print(json.dumps({"load": load, **{k: round(v) for k, v in limit.items()}, **mill}))
            both, ceiling = limit["parse+encode limit"], limit["encoder ceiling"]
            print(f"tokenmill: {mill['wall_s']:.1f} s = {rate:.0f} MB/s = {rate / both:.2f} of the {both:.0f} MB/s "
                  f"parse+encode limit and {rate / ceiling:.2f} of the {ceiling:.0f} MB/s encoder ceiling measured "
                  f"just before; largest process {mill['peak_process_gb']:.2f} GB, "
                  f"tree {mill['peak_tree_gb']:.2f} GB")  # fmt: skip
            shutil.rmtree(outs["tokenmill"], ignore_errors=True)
            if args.without_megatron:
                return
            load = os.getloadavg()[0]
            meg = run_megatron(args, big, outs["megatron"], cap)
            print(json.dumps({"load": load, **meg}))
            outcome = f"killed by the watchdog: {meg['killed']}" if meg["killed"] else f"exit {meg['exit']}"
            print(f"Megatron: {meg['wall_s']:.1f} s, {outcome}; largest process {meg['peak_process_gb']:.2f} GB")


if __name__ == "__main__":
    if not SHARED.is_dir():  # the benchmarks' corpora and tokenizers; the tests read tests/data
        raise SystemExit(f"bench/megatron.py reads the corpora and tokenizers of {SHARED}, which is missing")
    main()
