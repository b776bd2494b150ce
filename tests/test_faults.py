"""Faults at the library level (no Prefect): files damaged after their commit are noticed and redone
byte-identically; a full disk fails the write naming the file and leaves nothing under its name, whether the file
goes through the page cache or past it."""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from tokenmill.config import TokenmillConfig
from tokenmill.core.commits import check, land, lift
from tokenmill.core.layout import marker, renumbered
from tokenmill.io import direct
from tokenmill.io.direct import UncachedFile, in_page_cache
from tokenmill.io.storage import StorageError, Store
from tokenmill.stages.pack import Packing, pack_shard
from tokenmill.stages.partition import load_or_plan
from tokenmill.stages.tokenize import Tokenizing, tokenize_shard
from tokenmill.stages.train_tokenizer import install_pretrained

from .conftest import (
    EXAMPLES,
    GATED_RUN,
    REPO,
    TOKENIZERS,
    TOKENMILL,
    alive_in_session,
    as_a_terminal_job,
    gated_news,
)

PAGE = mmap.PAGESIZE


def small_config(out: Path) -> TokenmillConfig:
    return TokenmillConfig.model_validate(
        {
            "name": "faults",
            "input": {"paths": [str(EXAMPLES / "data" / "*.jsonl*")], "id_field": "id"},
            "partition": {"shard_size": "1MB"},
            "tokenizer": {"path": str(TOKENIZERS / "gpt2" / "tokenizer.json")},
            "pack": {"mode": "concat", "seq_len": 1024},
            "output": {"path": str(out), "formats": ["megatron", "packed", "llmc"]},
        }
    )


def build(config: TokenmillConfig, shard_ids=None):
    plan, _ = load_or_plan(config)
    tokenizer = install_pretrained(config)
    shards = [s for s in plan.shards if shard_ids is None or s.shard_id in shard_ids]
    tokenized = [tokenize_shard(Tokenizing.of(config, tokenizer), shard) for shard in shards]
    return tokenized, [pack_shard(Packing.of(config, tokenizer), t) for t in tokenized]


def data_files(out: Path) -> dict[str, bytes]:
    skip = ("_commits", "_work", "tokenizer")
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()
            and not str(p.relative_to(out)).startswith(skip)}  # fmt: skip


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("faults") / "out"
    build(small_config(out), shard_ids={0, 1})
    return out


def damage(path: Path, how: str) -> None:
    if how == "bit flip":
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
    elif how == "truncated":
        path.write_bytes(path.read_bytes()[:-2])
    else:
        path.unlink()


@pytest.mark.parametrize(
    "rel, how, stage, says",
    [
        ("megatron/train/shard-00001.bin", "bit flip", "tokenize", "changed content (sha256 differs)"),
        ("megatron/train/shard-00001.bin", "deleted", "tokenize", "was deleted"),
        ("megatron/train/shard-00001.idx", "truncated", "tokenize", "changed size"),
        ("packed/train/shard-00001.tokens.npy", "bit flip", "pack", "changed content"),
        ("llmc/train/shard-00001-0000.bin", "deleted", "pack", "was deleted"),
    ],
)
def test_a_file_damaged_after_its_commit_is_noticed_and_redone_byte_identically(built, tmp_path, rel, how, stage, says):
    out = tmp_path / "out"
    shutil.copytree(built, out)
    before = data_files(out)
    damage(out / rel, how)
    tokenized, packed = build(small_config(out), shard_ids={0, 1})
    results = {"tokenize": tokenized, "pack": packed}[stage]
    assert [r.reused for r in results] == [True, False]  # shard 0 untouched, shard 1 redone
    assert results[1].redone.startswith(f"{stage} shard 00001: {rel} {says}")
    assert results[1].redone.endswith(" since its commit; redoing the shard")
    assert data_files(out) == before


def aged(path: Path, seconds: int = 3600) -> None:
    """`path` modified `seconds` earlier, as a nightly run finds the files of the night before."""
    mtime = path.stat().st_mtime_ns - seconds * 10**9
    os.utime(path, ns=(mtime, mtime))


def changed_keeping_its_stamp(path: Path) -> None:
    """A byte of `path` flipped in place, its modification time put back (as only its owner or root can)."""
    kept = path.stat()
    with open(path, "r+b") as f:
        f.seek(kept.st_size // 2)
        byte = f.read(1)
        f.seek(kept.st_size // 2)
        f.write(bytes([byte[0] ^ 0x01]))
    os.utime(path, ns=(kept.st_atime_ns, kept.st_mtime_ns))


def test_trusting_stamps_a_kept_file_is_read_once_then_only_when_its_stamp_changes(tmp_path):
    """`output.reuse_check: stamp`: a run reads each kept file once and records its stamp (inode, size, modification
    time, owner); later runs read only the files whose stamp changed: a file touched is read and kept, one written
    to is read and its shard made again. A byte changed in place with the modification time put back keeps the
    stamp, so such a run does not see it (it reads no file whose stamp is unchanged); the default, sha256, does."""
    out = tmp_path / "out"
    stamping = small_config(out)
    stamping.output.reuse_check = "stamp"
    build(stamping, shard_ids={0, 1})
    before = data_files(out)
    for path in filter(Path.is_file, out.rglob("*")):
        aged(path)
    assert all(r.reused for results in build(stamping, shard_ids={0, 1}) for r in results)
    store = Store(out)
    markers = {(stage, i): store.read_json(marker(stage, i)) for stage in ("tokenize", "pack") for i in (0, 1)}
    for m in markers.values():
        assert set(m["stamps"]) == set(m["files"])
        for rel, stamp in m["stamps"].items():
            status = (out / rel).stat()
            assert stamp == {"bytes": status.st_size, "inode": status.st_ino, "mtime_ns": status.st_mtime_ns,
                             "uid": status.st_uid}  # fmt: skip

    touched, written = out / "megatron/train/shard-00000.idx", out / "megatron/train/shard-00001.bin"
    aged(touched, 60)
    damage(written, "bit flip")
    tokenized, _ = build(stamping, shard_ids={0, 1})
    assert [r.reused for r in tokenized] == [True, False]
    assert tokenized[1].redone.startswith("tokenize shard 00001: megatron/train/shard-00001.bin changed content")
    restamped = store.read_json(marker("tokenize", 0))["stamps"]["megatron/train/shard-00000.idx"]
    assert restamped["mtime_ns"] == touched.stat().st_mtime_ns

    changed_keeping_its_stamp(out / "megatron/train/shard-00000.bin")
    assert all(r.reused for results in build(stamping, shard_ids={0, 1}) for r in results)
    tokenized, _ = build(small_config(out), shard_ids={0, 1})  # sha256
    assert [r.reused for r in tokenized] == [False, True]
    assert tokenized[0].redone.startswith("tokenize shard 00000: megatron/train/shard-00000.bin changed content")
    assert data_files(out) == before


def test_trusting_stamps_a_shard_given_another_id_is_not_read_again(tmp_path):
    """A shard renumbered (a file landed before it: `commits.lift`, then `land`) keeps its files' stamps under its
    new id, as a rename keeps what they hold: a run that trusts stamps does not read them again (a byte changed in
    place with the modification time put back goes unseen, as for any stamped file)."""
    out = tmp_path / "out"
    config = small_config(out)
    config.output.reuse_check = "stamp"
    build(config, shard_ids={0, 1})
    for path in filter(Path.is_file, out.rglob("*")):
        aged(path)
    build(config, shard_ids={0, 1})  # the stamps recorded
    store = config.output.store()
    before = {stage: store.read_json(marker(stage, 1)) for stage in ("tokenize", "pack")}
    land(store, lift(store, {1: 7}))
    for stage, old in before.items():
        moved = store.read_json(marker(stage, 7))
        assert moved["stamps"] == {renumbered(rel, 1, 7): stamp for rel, stamp in old["stamps"].items()}
        assert set(moved["stamps"]) == set(moved["files"])
    changed_keeping_its_stamp(out / "megatron/train/shard-00007.bin")
    assert check(store, "tokenize", 7, before["tokenize"]["key"]).result is not None
    assert check(Store(out), "tokenize", 7, before["tokenize"]["key"]).redone.startswith(
        "tokenize shard 00007: megatron/train/shard-00007.bin changed content"
    )


def test_markers_record_every_file_with_size_and_sha256(built):
    # The .bin and the packed rows are hashed as they are written (`Store.writing_file`), the rest read back.
    store = Store(built)
    recorded = store.read_json(marker("tokenize", 1))["files"]
    assert set(recorded) == {f"megatron/train/shard-00001.{ext}" for ext in ("bin", "idx", "docs.parquet")}
    packed = store.read_json(marker("pack", 1))["files"]
    assert {"packed/train/shard-00001.tokens.npy", "llmc/train/shard-00001-0000.bin"} <= set(packed)
    for rel, entry in (recorded | packed).items():
        assert entry == {"bytes": store.size(rel), "sha256": store.sha256(rel)}


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs: room for the tokenizer (3.6 MB) and not for a shard's files. Skipped where mount is not
    allowed (it needs root, which the test environment has)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


def test_disk_full_mid_shard_names_the_file_leaves_no_partial_file_and_the_rerun_is_identical(built, small_disk):
    out = small_disk / "out"
    with pytest.raises(StorageError) as failure:
        build(small_config(out), shard_ids={0, 1})
    message = str(failure.value)
    assert message.startswith(f"writing {out}/megatron/train/shard-0000")
    assert message.endswith("failed: No space left on device (ENOSPC)")
    assert [p for p in out.rglob("*") if p.is_file() and ".tmp-" in p.name] == []  # no partial file left
    failed_shard = int(message.split("shard-")[1][:5])
    assert not (out / marker("tokenize", failed_shard)).exists()  # not committed: the rerun redoes it

    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)  # space freed
    build(small_config(out), shard_ids={0, 1})
    assert data_files(out) == data_files(built)


def cached_pages(path: Path) -> int:
    """How many of a file's pages the page cache holds."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        return sum(in_page_cache(f, page, min(page + PAGE, size)) for page in range(0, size, PAGE))


@pytest.mark.parametrize("sizes", [[], [1], [4095, 1], [UncachedFile.BUFFER], [3, 2 * UncachedFile.BUFFER + 5, 7]])
def test_a_file_the_run_does_not_read_again_is_written_whole_past_the_page_cache(tmp_path, sizes):
    store, pieces = Store(tmp_path), [os.urandom(n) for n in sizes]
    for read_again in (True, False):
        record: dict = {}
        with store.writing_file(f"{read_again}.bin", record, read_again=read_again) as f:
            for piece in pieces:
                f.write(piece)
        data = b"".join(pieces)
        assert record == {f"{read_again}.bin": {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}}
        path = tmp_path / f"{read_again}.bin"
        assert cached_pages(path) == (-(-len(data) // PAGE) if read_again else 0)
        assert path.read_bytes() == data


@pytest.fixture
def ramfs(tmp_path):
    """A ramfs, which refuses O_DIRECT. Skipped where mount is not allowed (it needs root)."""
    mount = tmp_path / "ramfs"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "ramfs", "ramfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a ramfs here (needs root)")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


def test_where_the_file_system_refuses_o_direct_the_file_goes_through_the_cache(ramfs):
    data = os.urandom(UncachedFile.BUFFER + 12345)
    with pytest.raises(OSError, match="Invalid argument"):
        os.close(os.open(ramfs / "probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT))
    record: dict = {}
    with Store(ramfs).writing_file("rows.npy", record, read_again=False) as f:
        f.write(data)
    assert (ramfs / "rows.npy").read_bytes() == data
    assert record["rows.npy"]["sha256"] == hashlib.sha256(data).hexdigest()


def test_an_o_direct_read_the_file_system_refuses_is_read_mapped(tmp_path, monkeypatch):
    """A file system may take O_DIRECT at open and refuse a read's alignment (EINVAL): here memory one byte off the
    page, which this disk's file system refuses as one with larger blocks refuses a page. The read says so (None),
    and `range_reader` reads the same bytes mapped."""
    data = os.urandom(3 * PAGE * 1000 + 123)
    path = tmp_path / "tokens.bin"
    path.write_bytes(data)
    with open(path, "rb") as f:
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # not cached: the reads go to the disk
        assert not in_page_cache(f, 0, len(data))
        descriptor = direct.open_direct(str(path))
        assert descriptor is not None
        try:
            aligned = direct.private_buffer(4 * PAGE)
            assert direct.read_direct(descriptor, aligned, PAGE + 5, 2 * PAGE) == (PAGE, PAGE)
            assert bytes(aligned[:PAGE]) == data[PAGE : 2 * PAGE]
            assert direct.read_direct(descriptor, memoryview(aligned)[1:], 0, PAGE) is None
        finally:
            os.close(descriptor)
        off_the_page = direct.private_buffer
        monkeypatch.setattr(direct, "private_buffer", lambda size: off_the_page(size + PAGE)[1:])
        with direct.range_reader(f, 2 * PAGE) as read:
            for start, stop in [(0, 2 * PAGE), (5, PAGE + 7), (len(data) - 200, len(data))]:
                assert bytes(read(start, stop)) == data[start:stop]


def test_a_full_disk_fails_a_write_past_the_cache_naming_the_file_and_leaves_nothing(small_disk):
    store = Store(small_disk)
    with pytest.raises(StorageError) as failure, store.writing_file("litdata/shard.bin", {}, read_again=False) as f:
        f.write(os.urandom(3 * UncachedFile.BUFFER))
    assert str(failure.value) == f"writing {small_disk}/litdata/shard.bin failed: No space left on device (ENOSPC)"
    assert [p for p in small_disk.rglob("*") if p.is_file()] == []


def test_the_local_server_tokenmill_started_comes_back_on_the_same_port_if_it_dies(tmp_path, monkeypatch):
    import signal
    import time

    from flows import server

    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    state = server.start_server()
    monkeypatch.setenv("TOKENMILL_LOCAL_SERVER", state["api_url"])
    try:
        with server.supervised(state["api_url"]):
            os.killpg(state["pid"], signal.SIGKILL)
            deadline = time.monotonic() + server.START_TIMEOUT_S + 10
            # The supervisor records the new server once it answers: wait for the record, not just the answer.
            while not (restarted := server.running_server()) or restarted["pid"] == state["pid"]:
                assert time.monotonic() < deadline, "the supervisor did not restart the server"
                time.sleep(0.5)
            assert restarted["api_url"] == state["api_url"]  # same URL: same port, same database
    finally:
        server.stop_server()


def test_workers_that_die_as_the_local_cluster_starts_fail_the_run_with_a_message(run_cli, tmp_path, monkeypatch):
    """Every worker process dies as it starts (a preload that exits, as a kill or the OOM killer would): the
    start is tried once more, then the run ends saying so, with no traceback."""
    dies = tmp_path / "dies_on_start.py"
    dies.write_text("import os\nos._exit(1)\n")
    monkeypatch.setenv("DASK_DISTRIBUTED__WORKER__PRELOAD", f"['{dies}']")
    result = run_cli("run", "examples/demo.yaml", "--set", f"output.path={tmp_path / 'out'}", check=False,
                     local_cluster=True)  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert "error: run failed: the local Dask cluster could not start, twice" in result.stdout
    assert "a worker process died as it started" in result.stdout and "run the same command again" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_a_result_the_prefect_api_lost_in_a_restart_is_said_plainly():
    """The fault campaign's server kind once ended in Prefect's own words only ("State data is missing ...")."""
    from prefect.exceptions import MissingResult

    from flows.cli import failure_message

    try:
        try:
            raise MissingResult("State data is missing. Typically, this occurs when result persistence is disabled")
        except MissingResult as e:
            raise RuntimeError("the flow failed") from e
    except RuntimeError as e:
        message = failure_message(e, "http://127.0.0.1:4200/api")
    assert message.startswith("the Prefect API at http://127.0.0.1:4200/api no longer had a task's result")
    assert "State data is missing" in message and "run the same command again" in message


@pytest.mark.parametrize("body, code", [("raise typer.Exit(3)", 3), ("pass", 0)])
def test_a_command_ends_soon_after_its_work_whatever_prefect_still_waits_for(body, code):
    """With the Prefect API gone, Prefect's exit handlers reconnect for each of the run's buffered events (about
    7 s each: a run was still at it more than 8 minutes after its flow failed). A thread
    that never ends stands for them here: it holds the interpreter's exit just as they do."""
    script = (
        "import threading, time, typer\nfrom flows import cli\ncli.EXIT_GRACE_S = 1\n"
        "threading.Thread(target=time.sleep, args=(300,)).start()\n"
        f"with cli.ends_promptly():\n    {body}\n"
    )
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == code, done.stderr
    assert time.monotonic() - started < 60  # not the 300 s the thread would hold it
    assert "tokenmill: exiting without waiting longer for the Prefect API (1 s)" in done.stderr


SERVING = """
import asyncio, sys
from flows.cli import run_until_interrupted

async def serving(swallow):
    print("serving", flush=True)
    while True:
        try:
            await asyncio.sleep(0.1)
        except asyncio.CancelledError:
            if not swallow:  # Prefect's runner: it pauses the deployments, and returns
                return
            # as Prefect's runner did when its task group swallowed the cancellation

run_until_interrupted(lambda: serving(sys.argv[1] == "swallow"), grace=2)
"""


@pytest.mark.parametrize("runner", ["returns", "swallow"])
def test_tokenmill_serve_exits_on_one_ctrl_c_even_where_the_runner_loses_it(runner):
    """`tokenmill serve` runs Prefect's runner in `run_until_interrupted`: one Ctrl-C cancels it (which then stops
    at once); where the runner swallows that, the process still exits, `grace` seconds later, saying so."""
    import signal

    process = subprocess.Popen(
        [sys.executable, "-c", SERVING, runner], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert process.stdout.readline() == "serving\n"
    interrupted = time.monotonic()
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0
    if runner == "returns":
        assert err == ""  # stopped before the timer
    else:
        assert time.monotonic() - interrupted >= 2 and err == "tokenmill: still running 2 s after Ctrl-C; exiting\n"


@pytest.mark.parametrize("cluster_first", [False, True], ids=["at once", "the cluster's processes first"])
def test_ctrl_c_mid_run_ends_the_run_and_its_cluster_at_once(prefect_api, tmp_path, cluster_first):
    """Ctrl-C reaches the run's whole process group: the flow's process, its LocalCluster's and the workers. The
    run ends within seconds, marked Crashed, exit 130, leaving no process behind nor anything in its temporary
    directory, and says nothing but that: no traceback or warning of a library's. The run is held with its shards
    waiting at a gate (`Gate`), not by its length. On a loaded machine the signal can reach the cluster's processes
    well before the flow's: then the flow's Dask client is reconnecting as it closes (Dask logged the reconnection's
    cancellation with a traceback), and multiprocessing's resource tracker warned of the nannies' semaphores whenever
    the cluster's process ended at Ctrl-C. (Once, by hand, a cluster that ignored Ctrl-C left a shard group waiting
    on a closed Dask client and the run hung; that race did not recur to be tested here.)"""
    import signal

    # its own temporary directory, to see what the run leaves there: short, since a forkserver's socket goes in it
    temporary = Path(tempfile.mkdtemp(prefix="tm-"))
    env = {k: v for k, v in os.environ.items() if k != "TOKENMILL_DASK_ADDRESS"} | {"PREFECT_API_URL": prefect_api}
    env["TMPDIR"] = str(temporary)
    with gated_news(tmp_path) as gate:
        run = subprocess.Popen(
            [*TOKENMILL, "run", "examples/gpt2.yaml", "--set", f"output.path={tmp_path / 'out'}",
             "--set", f"input.paths=[{gate.url}]", *GATED_RUN],
            cwd=REPO, env=gate.env(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
            preexec_fn=as_a_terminal_job,
        )  # fmt: skip
        gate.reached(run)  # its shards being tokenized, waiting at the gate
        if cluster_first:
            for process in psutil.Process(run.pid).children(recursive=True):
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.send_signal(signal.SIGINT)
            time.sleep(1)
        os.killpg(run.pid, signal.SIGINT)
        started = time.monotonic()
        rest = run.communicate(timeout=60)[0]
    assert run.returncode == 130 and time.monotonic() - started < 30, rest
    assert "Execution was aborted by an interrupt signal" in rest
    assert "Traceback" not in rest and "Warning" not in rest, rest
    deadline = time.monotonic() + 30  # the cluster's processes end as their stdin closes: soon, not at once
    while (left := alive_in_session(run.pid)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, left
    left_behind = os.listdir(temporary)  # the forkserver's directory was (a pymp-* with its socket, at each Ctrl-C)
    shutil.rmtree(temporary)
    assert not left_behind, left_behind
