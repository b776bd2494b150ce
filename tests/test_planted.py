"""The bucket is data: whoever can write the output location (a group-writable project directory, a shared bucket)
can plant files there, and the owner's next run must neither delete nor overwrite a file outside it, nor publish a
file because it lies there, nor drop or repeat a document because a stored plan says so. Each case plants what the
issue found, runs what the owner runs next, and checks the victim, the secret and the documents; locally and, where
the case is about the bucket, on the S3 server (moto)."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import boto3
import httpx
import pytest
import yaml

from tokenmill.core import layout

from .conftest import REPO, TOKENMILL
from .test_security import other_user  # noqa: F401 (a fixture)

SECRET = b"a secret of whoever runs tokenmill next, never to be published\n"


def run_args(out: str, *more: str) -> list[str]:
    """gpt2_run's config (examples/gpt2.yaml in four shards) with its output at `out`."""
    return ["run", "examples/gpt2.yaml", "--set", f"output.path={out}", "--set", "partition.shard_size=1MB", *more]


def plant_shard_naming(plan: dict, files: dict) -> tuple[dict, dict]:
    """plan.json with one more shard, and that shard's tokenize marker listing `files`: the next run's plan has no such
    shard, so it discards what the marker lists."""
    extra = {**plan["shards"][-1], "shard_id": len(plan["shards"]), "source": "planted"}
    marker = {"key": "planted", "result": {}, "files": files}
    return {**plan, "shards": [*plan["shards"], extra]}, marker


def test_a_marker_naming_a_file_outside_the_output_removes_nothing_and_stops_the_run_naming_it(
    gpt2_run, run_cli, tmp_path
):
    out, victim = tmp_path / "out", tmp_path / "victim"
    shutil.copytree(gpt2_run, out)
    victim.write_bytes(SECRET)
    plan, marker = plant_shard_naming(json.loads((out / "plan.json").read_text()), {"../victim": {"bytes": 1}})
    (out / "plan.json").write_text(json.dumps(plan))
    planted = out / "_commits/tokenize/shard-00004.json"
    planted.write_text(json.dumps(marker))

    refused = run_cli(*run_args(str(out)), check=False)
    said = refused.stdout + refused.stderr
    assert refused.returncode == 1 and victim.read_bytes() == SECRET, said
    assert f"{planted} names '../victim', a path outside {out}" in said and "Nothing to do" not in said, said
    assert "Traceback" not in refused.stdout, refused.stdout
    # Another file of the dataset listed as the shard's (its config, removed by the discard) is refused the same way
    planted.write_text(json.dumps({**marker, "files": {"_work/config.json": {"bytes": 1}}}))
    refused = run_cli(*run_args(str(out)), check=False)
    assert refused.returncode == 1 and "'_work/config.json', which is not a file of shard 00004" in refused.stdout
    assert (out / "_work/config.json").exists()


def test_on_s3_a_marker_naming_an_object_outside_the_output_removes_nothing(gpt2_run, run_cli, s3_server):
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="shared")
    for path in gpt2_run.rglob("*"):
        if path.is_file():
            s3.upload_file(str(path), "shared", f"team/out/{path.relative_to(gpt2_run)}")
    s3.put_object(Bucket="shared", Key="team/victim", Body=SECRET)
    plan = json.loads((gpt2_run / "plan.json").read_text())
    plan, marker = plant_shard_naming(plan, {"../victim": {"bytes": 1}})
    s3.put_object(Bucket="shared", Key="team/out/plan.json", Body=json.dumps(plan).encode())
    s3.put_object(Bucket="shared", Key="team/out/_commits/tokenize/shard-00004.json", Body=json.dumps(marker).encode())

    refused = run_cli(*run_args("s3://shared/team/out"), check=False)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "s3://shared/team/out/_commits/tokenize/shard-00004.json names '../victim'" in refused.stdout
    assert s3.get_object(Bucket="shared", Key="team/victim")["Body"].read() == SECRET


PLANTED_SHARD = 2


def plant_tokens(read, write, shard: int = PLANTED_SHARD) -> tuple[str, bytes]:
    """What a writer of the output location can do to a committed shard, with `read`/`write` (a relative path's
    bytes): its `.bin` replaced by tokens of theirs, and its tokenize marker altered to record them (size and sha256,
    its signature kept). A run that took the marker would skip the shard and publish their tokens. The `.bin`'s
    name and its honest bytes."""
    rel = f"megatron/train/shard-{shard:05d}.bin"
    honest = read(rel)
    theirs = honest[::-1]  # the same size, other tokens
    write(rel, theirs)
    done = json.loads(read(f"_commits/tokenize/shard-{shard:05d}.json"))
    done["files"][rel] = {"bytes": len(theirs), "sha256": hashlib.sha256(theirs).hexdigest()}
    write(f"_commits/tokenize/shard-{shard:05d}.json", json.dumps(done).encode())
    return rel, honest


def signed_by_this_user(marker: bytes, rel: str) -> bool:
    """Whether a marker's signature is this user's (the key in $TOKENMILL_HOME or ~/.tokenmill), computed here
    from the key file as `tokenmill.core.signing` documents it."""
    from tokenmill.core import signing

    done = json.loads(marker)
    signature = done.pop("signature", "")
    return hmac.compare_digest(signature, signing.marker_signature(rel, done))


def local_files(out: Path):
    return (lambda rel: (out / rel).read_bytes()), (lambda rel, data: (out / rel).write_bytes(data))


ENTRY_POINTS = ["run", "rerun", "rerun --config", "scheduled deployment"]


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_a_planted_marker_makes_no_run_skip_work_or_publish_their_files(
    gpt2_run, run_cli, prefect_api, prefect_client, dask_cluster, tmp_path, entry
):
    """A committed shard's tokens replaced and its marker altered to record them (`plant_tokens`), links to a secret
    in `mix/` and `tokenizer/`, and the plan's cut moved, in a copy of gpt2_run; then each way the owner runs next:
    `tokenmill run`, `rerun` without and with `--config` (redoing another shard), a scheduled run of a served
    deployment. The altered marker is refused, naming it: its shard is made again, the honest tokens are
    published; the secret is nowhere; every document is there once; the markers are signed by this user."""
    out, secret, published = tmp_path / "out", tmp_path / "secret", tmp_path / "published"
    shutil.copytree(gpt2_run, out)
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    rel, honest = plant_tokens(*local_files(out))
    (out / "mix").mkdir()
    (out / "mix/leak.txt").symlink_to(secret)
    (out / "tokenizer/leak.jinja").symlink_to(secret)
    plan = json.loads((out / "plan.json").read_text())
    cut = next(s for s in plan["shards"] if s["pieces"][0]["end"] is not None)
    cut["pieces"][0]["end"] //= 2
    (out / "plan.json").write_text(json.dumps(plan))
    refused = f"{out}/_commits/tokenize/shard-{PLANTED_SHARD:05d}.json is not signed with your tokenmill key"
    config = tmp_path / "gpt2.yaml"  # examples/gpt2.yaml as gpt2_run ran it, publishing elsewhere
    given = yaml.safe_load((REPO / "examples/gpt2.yaml").read_text())
    given["partition"]["shard_size"], given["output"]["publish"] = "1MB", {"path": str(published)}
    config.write_text(yaml.safe_dump(given))

    if entry == "run":
        said = run_cli("run", str(config), "--set", f"output.path={out}").stdout
    elif entry == "rerun":  # the stored config (its publish location is the output's own)
        said = run_cli("rerun", str(out), "--shard", "1").stdout
    elif entry == "rerun --config":
        said = run_cli("rerun", str(out), "--config", str(config), "--shard", "1").stdout
    else:
        said = scheduled_run(config, out, prefect_api, prefect_client, dask_cluster, tmp_path)
    assert refused in said, said
    assert (out / rel).read_bytes() == honest and not (out / rel).is_symlink()
    marker = (out / f"_commits/tokenize/shard-{PLANTED_SHARD:05d}.json").read_bytes()
    assert signed_by_this_user(marker, f"_commits/tokenize/shard-{PLANTED_SHARD:05d}.json")
    root = (out if entry == "rerun" else published) / "demo-gpt2"
    version = root / (root / "LATEST").read_text().strip()
    manifest = json.loads((version / "manifest.json").read_text())
    honest_manifest = json.loads((gpt2_run / "manifest.json").read_text())
    assert manifest["files"] == honest_manifest["files"] and manifest["counts"] == honest_manifest["counts"]
    assert (version / rel).read_bytes() == honest
    assert not [p for p in version.rglob("*") if p.is_file() and SECRET.strip() in p.read_bytes()]
    assert (
        json.loads((out / "plan.json").read_text())["shards"]
        == json.loads((gpt2_run / "plan.json").read_text())["shards"]
    )


def scheduled_run(config: Path, out: Path, prefect_api, prefect_client, dask_cluster, tmp_path) -> str:
    """`tokenmill serve CONFIG --cron "* * * * *"` until its first scheduled run has ended: that run's log lines."""
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId, LogFilter, LogFilterFlowRunId

    from .conftest import served_process, stop
    from .test_operations import deployment_named, every_page, final_state, wait_for

    name = f"planted-{tmp_path.name}"
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "TOKENMILL_DASK_ADDRESS": dask_cluster}
    log = tmp_path / "serve.log"
    server = served_process([*TOKENMILL, "serve", str(config), "--set", f"output.path={out}", "--name", name,
                             "--cron", "* * * * *"], env, log)  # fmt: skip
    try:
        deployment = wait_for(lambda: deployment_named(prefect_client, f"corpus-to-tokens/{name}"), 120, "it")
        of_deployment = DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id]))

        def started():
            runs = prefect_client.read_flow_runs(deployment_filter=of_deployment)
            return next((r for r in runs if r.state is not None and not r.state.is_scheduled()), None)

        run = wait_for(started, 150, "the deployment's first scheduled run")
        assert run.auto_scheduled, run
        for schedule in prefect_client.read_deployment_schedules(deployment.id):  # no second run on the same output
            prefect_client.update_deployment_schedule(deployment.id, schedule.id, active=False)
        for later in prefect_client.read_flow_runs(deployment_filter=of_deployment):
            if later.state is not None and later.state.is_scheduled():
                prefect_client.delete_flow_run(later.id)
        state = final_state(prefect_client, run.id)
        assert state.is_completed(), f"{state.message}\n{log.read_text()[-3000:]}"
        of_run = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id]))

        def logged() -> str:  # the run's process sends its last logs after its final state
            said = "\n".join(line.message for line in every_page(prefect_client.read_logs, log_filter=of_run))
            return said if "is not signed" in said else ""

        return wait_for(logged, 60, "the run's log")
    finally:
        stop(server, log=log)


def test_on_s3_a_planted_marker_makes_no_run_skip_work_or_publish_their_files(gpt2_run, run_cli, s3_server, tmp_path):
    """`plant_tokens` on the S3 server: the run refuses the altered marker, naming it, makes the shard again, and
    publishes the honest tokens."""
    s3, prefix = boto3.client("s3"), f"{tmp_path.name}/out"
    s3.create_bucket(Bucket="shared")
    for path in gpt2_run.rglob("*"):
        if path.is_file():
            s3.upload_file(str(path), "shared", f"{prefix}/{path.relative_to(gpt2_run)}")

    def read(rel: str) -> bytes:
        return s3.get_object(Bucket="shared", Key=f"{prefix}/{rel}")["Body"].read()

    rel, honest = plant_tokens(read, lambda rel, data: s3.put_object(Bucket="shared", Key=f"{prefix}/{rel}", Body=data))
    published = tmp_path / "published"
    said = run_cli(*run_args(f"s3://shared/{prefix}", "--set", f"output.publish.path={published}")).stdout
    marker = f"_commits/tokenize/shard-{PLANTED_SHARD:05d}.json"
    assert f"s3://shared/{prefix}/{marker} is not signed with your tokenmill key" in said, said
    assert read(rel) == honest and signed_by_this_user(read(marker), marker)
    version = published / "demo-gpt2" / (published / "demo-gpt2/LATEST").read_text().strip()
    assert (version / rel).read_bytes() == honest


def test_the_workers_sign_with_the_key_the_flow_sends(gpt2_run, run_cli, tmp_path, monkeypatch):
    """The session's Dask cluster was started before this run's key existed, and its workers have no
    TOKENMILL_HOME: the run (TOKENMILL_HOME of its own) sends them the key with its tasks, so every marker they
    write bears the run's signature, and a second run takes every shard as committed. Unsigned markers (an output
    of a tokenmill before markers were signed) are redone once, each named, then taken."""
    monkeypatch.setenv("TOKENMILL_HOME", str(tmp_path / "home"))
    out = tmp_path / "out"
    run_cli(*run_args(str(out)))
    markers = sorted((out / "_commits").rglob("*.json"))
    assert len(markers) >= 8  # tokenize and pack, 4 shards each
    assert all(signed_by_this_user(m.read_bytes(), str(m.relative_to(out))) for m in markers)
    assert "4 shards (3 reused)" in run_cli("rerun", str(out), "--shard", "0").stdout
    for marker in markers:  # as a tokenmill before markers were signed wrote them
        done = json.loads(marker.read_text())
        del done["signature"]
        marker.write_text(json.dumps(done))
    first = run_cli(*run_args(str(out), "--set", f"output.publish.path={tmp_path / 'published'}")).stdout
    assert first.count("is not signed with your tokenmill key") >= 4, first
    second = run_cli(*run_args(str(out), "--set", f"output.publish.path={tmp_path / 'again'}")).stdout
    assert "not signed" not in second and "4 shards (4 reused)" in second, second


def test_a_directory_link_planted_in_the_output_is_never_written_through(gpt2_run, run_cli, tmp_path):
    """`megatron/train` replaced by a link to another dataset's directory: the rerun of a shard refuses it, naming
    it, and the other dataset's files are as they were."""
    out, other = tmp_path / "out", tmp_path / "other"
    shutil.copytree(gpt2_run, out)
    shutil.copytree(gpt2_run, other)
    (other / "megatron/train/shard-00000.bin").write_bytes(SECRET)
    before = {p: p.read_bytes() for p in (other / "megatron/train").iterdir()}
    shutil.rmtree(out / "megatron/train")
    (out / "megatron/train").symlink_to(other / "megatron/train")
    given = tmp_path / "given.yaml"
    given.write_text((REPO / "examples/gpt2.yaml").read_text().replace("shard_size: 64MB", "shard_size: 1MB"))

    refused = run_cli("rerun", str(out), "--config", str(given), "--shard", "0", check=False)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert f"{out}/megatron/train is a symbolic link, where tokenmill keeps a directory of its own" in refused.stdout
    assert {p: p.read_bytes() for p in (other / "megatron/train").iterdir()} == before


def test_a_link_in_place_of_a_committed_file_is_replaced_never_followed(gpt2_run, run_cli, tmp_path):
    """A committed shard's `.bin` replaced by a link to a file of the owner's: the shard is redone (the run says
    why), its file written in place of the link; the linked file is untouched."""
    out, secret = tmp_path / "out", tmp_path / "secret"
    shutil.copytree(gpt2_run, out)
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    bin_file = out / "megatron/train/shard-00001.bin"
    honest = bin_file.read_bytes()
    bin_file.unlink()
    bin_file.symlink_to(secret)

    result = run_cli(*run_args(str(out), "--set", f"output.publish.path={tmp_path / 'published'}"))
    assert "megatron/train/shard-00001.bin was replaced by a link or a special file" in result.stdout, result.stdout
    assert not bin_file.is_symlink() and bin_file.read_bytes() == honest
    assert secret.read_bytes() == SECRET


@pytest.mark.parametrize("where", ["local", "s3"])
def test_only_what_the_run_made_is_published(gpt2_run, run_cli, s3_server, tmp_path, where):
    """Links to the owner's secret planted as `mix/leak.txt` and `tokenizer/leak.jinja`, and a regular
    `mix/megatron/train.args` naming another prefix, in a run that is no mixture: the published version holds exactly
    the files the run made, the manifest lists those, and the secret's bytes are nowhere in it."""
    out, secret = tmp_path / "out", tmp_path / "secret"
    shutil.copytree(gpt2_run, out)
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    (out / "mix/megatron").mkdir(parents=True)
    (out / "mix/leak.txt").symlink_to(secret)
    (out / "tokenizer/leak.jinja").symlink_to(secret)
    (out / "mix/megatron/train.args").write_text("1.0 s3://elsewhere/their-data\n")
    root = str(tmp_path / "published") if where == "local" else f"s3://datasets/planted-{tmp_path.name}"
    if where == "s3":
        boto3.client("s3").create_bucket(Bucket="datasets")

    run_cli(*run_args(str(out), "--set", f"output.publish.path={root}"))
    manifest = json.loads((out / "manifest.json").read_text())
    listed = {f["path"] for f in manifest["files"]}
    assert not [p for p in listed if "leak" in p or p.startswith("mix/")], sorted(listed)
    assert listed == {f["path"] for f in json.loads((gpt2_run / "manifest.json").read_text())["files"]}
    version = f"demo-gpt2/{manifest['version']}"
    if where == "local":
        published = {str(p.relative_to(Path(root) / version)): p for p in (Path(root) / version).rglob("*")}
        files = {rel: p.read_bytes() for rel, p in published.items() if p.is_file() or p.is_symlink()}
        assert not any(p.is_symlink() for p in published.values())
    else:
        s3, prefix = boto3.client("s3"), f"{root.removeprefix('s3://datasets/')}/{version}/"
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket="datasets", Prefix=prefix)["Contents"]]
        files = {k.removeprefix(prefix): s3.get_object(Bucket="datasets", Key=k)["Body"].read() for k in keys}
    report = {p for p in files if p == "report.md" or (p.startswith("report/") and p not in listed)}  # not data
    # Megatron's data-args files, written at publish by name: they name where the version lies, so not in its manifest
    data_args = {layout.MEGATRON_TRAIN_ARGS, layout.MEGATRON_PER_SPLIT_ARGS}
    assert set(files) - {"manifest.json"} - report - data_args == listed and data_args <= set(files)
    assert not [rel for rel, data in files.items() if SECRET.strip() in data]
    verified = run_cli("inspect", f"{root}/demo-gpt2", "--verify")
    assert "Traceback" not in verified.stdout
    if where == "local":  # a link put in a published file's place is no file published, whatever it points at
        (Path(root) / version / "stats.json").unlink()
        (Path(root) / version / "stats.json").symlink_to(out / "stats.json")
        refused = run_cli("inspect", f"{root}/demo-gpt2", "--verify", check=False)
        assert refused.returncode == 1 and "stats.json: a link or special file" in refused.stdout, refused.stdout


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_planted_plan_that_cuts_a_file_elsewhere_drops_and_repeats_no_document(
    gpt2_run, run_cli, s3_server, tmp_path, where
):
    """plan.json rewritten with its key kept and the cut of the one file larger than a shard moved (the first piece
    ending early, so a run that took it would lose the documents between): the run cuts the file again, as its
    config's inputs give it, and every document is in the dataset once."""
    honest = json.loads((gpt2_run / "plan.json").read_text())
    planted = json.loads(json.dumps(honest))
    cut = [s for s in planted["shards"] if s["pieces"][0]["end"] is not None]
    assert len(cut) == 2, planted["shards"]  # wikitext2_raw_test.jsonl (1.3 MB) in two pieces
    cut[0]["pieces"][0]["end"] //= 2
    cut[0]["bytes"] = cut[0]["pieces"][0]["end"]
    # nothing committed: every shard is made from the plan the run takes
    kept = [p for p in gpt2_run.rglob("*") if p.is_file() and "_commits" not in p.parts]
    if where == "local":
        out = str(tmp_path / "out")
        for path in kept:
            (Path(out) / path.relative_to(gpt2_run)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, Path(out) / path.relative_to(gpt2_run))
        (Path(out) / "plan.json").write_text(json.dumps(planted))
    else:
        s3, out = boto3.client("s3"), f"s3://shared/{tmp_path.name}/out"
        s3.create_bucket(Bucket="shared")
        for path in kept:
            s3.upload_file(str(path), "shared", f"{tmp_path.name}/out/{path.relative_to(gpt2_run)}")
        s3.put_object(Bucket="shared", Key=f"{tmp_path.name}/out/plan.json", Body=json.dumps(planted).encode())

    run_cli(*run_args(out, "--set", f"output.publish.path={tmp_path / 'published'}"))
    read = (lambda rel: (Path(out) / rel).read_bytes()) if where == "local" else (
        lambda rel: s3.get_object(Bucket="shared", Key=f"{tmp_path.name}/out/{rel}")["Body"].read()
    )  # fmt: skip
    assert json.loads(read("plan.json")) == honest
    counts = json.loads(read("manifest.json"))["counts"]
    assert counts == json.loads((gpt2_run / "manifest.json").read_text())["counts"]


def test_the_store_keeps_every_path_inside_and_follows_no_link(tmp_path):
    """The library's part: `Store.path` refuses a path out of the store, `stored_path` and `stored_name` name the file
    a path was read from, and a local store neither reads through a link nor removes what one points at."""
    from tokenmill.io.storage import Planted, Store

    store, victim = Store(tmp_path / "out"), tmp_path / "victim"
    victim.write_bytes(SECRET)
    for rel in ("../victim", "/etc/passwd", "a/../../victim", ".", "a/..", "a\\..\\b"):
        with pytest.raises(Planted):
            store.path(rel)
    assert store.path("a/./b//c") == f"{tmp_path}/out/a/b/c"
    with pytest.raises(Planted, match=r"out/LATEST names '\.\./x', which is no version"):
        store.stored_name("../x", "LATEST")
    with pytest.raises(Planted, match=r"out/_commits/x.json names '\.\./victim', a path outside"):
        store.stored_path("../victim", "_commits/x.json")
    store.write_bytes("mine/file", b"mine")
    (tmp_path / "out/link").symlink_to(victim)
    with pytest.raises(Planted, match="is a symbolic link, where tokenmill keeps a file of its own"):
        store.read_bytes("link")
    os.mkfifo(tmp_path / "out/fifo")
    with pytest.raises(Planted, match="is not a regular file"):
        store.read_bytes("fifo")  # refused at once, not a read that waits for a writer
    store.write_bytes("link", b"written in place of the link")
    assert victim.read_bytes() == SECRET and (tmp_path / "out/link").read_bytes() == b"written in place of the link"
    (tmp_path / "out/dir").symlink_to(tmp_path)
    with pytest.raises(Planted, match="out/dir is a symbolic link"):
        store.write_bytes("dir/victim", b"overwritten")
    store.remove_tree("dir")
    assert victim.read_bytes() == SECRET and not (tmp_path / "out/dir").exists()


# Run by the other user with Debian's Python: an HTTP server on the port given that answers 200 to everything (as a
# Prefect server's health check does) and writes down each request's Authorization header.
SQUATTER = """
import http.server, sys

class Answer(http.server.BaseHTTPRequestHandler):
    def answer(self):
        with open(sys.argv[2], "a") as log:
            log.write(f"{self.command} {self.path} {self.headers.get('Authorization')}\\n")
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(b"true")

    do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = answer

    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Answer).serve_forever()
"""


def test_a_user_listening_on_the_recorded_port_of_the_local_server_gets_no_password(other_user, tmp_path):  # noqa: F811
    """The local server tokenmill started has stopped; another user of the host listens on the port it recorded, and
    answers its health check. The next `tokenmill run` sends nothing there: it starts its own server, on another
    port, with a new secret."""
    from flows.server import free_port

    from .conftest import TOKENMILL, run_or_show_stacks
    from .test_security import SYSTEM_PYTHON

    home, shared = tmp_path / "prefect-home", Path(f"/tmp/tokenmill-squat-{tmp_path.name}")
    home.mkdir(mode=0o700)
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    port, heard = free_port(), shared / "heard"
    squatter = subprocess.Popen(["runuser", "-u", other_user, "--", SYSTEM_PYTHON, "-c", SQUATTER, str(port),
                                 str(heard)], start_new_session=True)  # fmt: skip
    try:
        api = f"http://127.0.0.1:{port}/api"
        deadline = time.monotonic() + 30
        while not heard.exists():
            assert time.monotonic() < deadline and squatter.poll() is None, "the other user's server did not start"
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(f"{api}/health", timeout=1)
            time.sleep(0.2)
        heard.unlink()
        old = "tokenmill:the-secret-of-the-server-that-stopped"
        (home / "tokenmill-server-auth").write_text(old + "\n")
        (home / "tokenmill-server-auth").chmod(0o600)
        (home / "tokenmill-server.json").write_text(json.dumps({"api_url": api, "pid": squatter.pid, "auth": "file"}))
        config = tmp_path / "nothing.yaml"  # a run that fails at its first stage: the server is what is looked at
        config.write_text(json.dumps({"name": "nothing", "input": {"paths": [str(tmp_path / "none-*.jsonl")]},
                                      "tokenizer": {"path": str(REPO / "examples/tokenizers/gpt2/tokenizer.json")},
                                      "output": {"path": str(tmp_path / "out")}}))  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "TOKENMILL_DASK"))}
        env["PREFECT_HOME"] = str(home)
        ran = run_or_show_stacks([*TOKENMILL, "run", str(config)], env)
        try:
            assert "matches no file" in ran.stdout + ran.stderr, ran.stdout + ran.stderr
            assert f":{port}" not in ran.stdout.splitlines()[0], ran.stdout
            assert not heard.exists() or "Basic" not in heard.read_text(), heard.read_text()
            assert (home / "tokenmill-server-auth").read_text().strip() != old
        finally:
            run_or_show_stacks([*TOKENMILL, "server", "stop"], env)
    finally:
        os.killpg(squatter.pid, signal.SIGTERM)
        squatter.wait(30)
        shutil.rmtree(shared, ignore_errors=True)


def test_certs_refuses_a_directory_of_another_users_and_replaces_no_file(other_user, tmp_path):  # noqa: F811
    """`tokenmill certs DIR` into a directory another user made, with a 0666 `ca-key.pem` of theirs waiting there: it
    refuses, writing nothing; in a directory of one's own, a link planted under a key's name is not written through;
    keys are made in a directory of mode 0700."""
    from .conftest import TOKENMILL

    theirs = Path(f"/tmp/tokenmill-certs-{tmp_path.name}")
    for command in (["mkdir", "-m", "777", str(theirs)], ["touch", str(theirs / "ca-key.pem")],
                    ["chmod", "666", str(theirs / "ca-key.pem")]):  # fmt: skip
        subprocess.run(["runuser", "-u", other_user, "--", *command], check=True)
    try:
        refused = subprocess.run([*TOKENMILL, "certs", str(theirs)], capture_output=True, text=True)
        assert refused.returncode == 1 and f"{theirs} belongs to another user" in refused.stdout, refused
        assert (theirs / "ca-key.pem").read_bytes() == b"" and sorted(os.listdir(theirs)) == ["ca-key.pem"]
    finally:
        shutil.rmtree(theirs)
    mine, victim = tmp_path / "certs", tmp_path / "victim"
    victim.write_bytes(SECRET)
    mine.mkdir(mode=0o755)
    (mine / "worker-key.pem").symlink_to(victim)
    refused = subprocess.run([*TOKENMILL, "certs", str(mine)], capture_output=True, text=True)
    assert refused.returncode == 1 and "worker-key.pem exists already" in refused.stdout, refused
    assert victim.read_bytes() == SECRET and (mine.stat().st_mode & 0o777) == 0o700
    made = subprocess.run([*TOKENMILL, "certs", str(tmp_path / "new")], capture_output=True, text=True)
    assert made.returncode == 0 and ((tmp_path / "new").stat().st_mode & 0o777) == 0o700, made


def test_a_scratch_link_another_user_planted_truncates_nothing(other_user, prefect_api, tmp_path):  # noqa: F811
    """Dask's scratch space is by default a fixed name in the temporary directory, which any user of the host can make
    first: another user's `dask-scratch-space/global.lock` linked to a 0600 file of the run's user. A run on a
    LocalCluster keeps its scratch in a directory of its own (mode 0700, removed after the run): the file is intact,
    and nothing of the run is left there."""
    from .conftest import TOKENMILL, run_or_show_stacks

    shared_tmp, victim = Path(f"/tmp/tokenmill-tmp-{tmp_path.name}"), tmp_path / "victim"
    victim.write_bytes(SECRET)
    victim.chmod(0o600)
    shared_tmp.mkdir(mode=0o1777)
    shared_tmp.chmod(0o1777)
    try:
        for command in (["mkdir", "-m", "777", str(shared_tmp / "dask-scratch-space")],
                        ["ln", "-s", str(victim), str(shared_tmp / "dask-scratch-space/global.lock")]):  # fmt: skip
            subprocess.run(["runuser", "-u", other_user, "--", *command], check=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TOKENMILL_DASK", "DASK_TEMPORARY"))}
        env |= {"PREFECT_API_URL": prefect_api, "TMPDIR": str(shared_tmp)}
        ran = run_or_show_stacks([*TOKENMILL, *run_args(str(tmp_path / "out"), "--set", "dask.n_workers=2")], env)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert victim.read_bytes() == SECRET
        assert [p.name for p in shared_tmp.iterdir() if p.stat().st_uid == os.getuid()] == []  # its scratch went
    finally:
        shutil.rmtree(shared_tmp, ignore_errors=True)


def test_a_planted_run_config_is_not_taken_by_a_rerun_without_its_config(gpt2_run, run_cli, tmp_path):
    """`_work/config.json` rewritten (its signature kept) so that the input is a 0600 file of whoever reruns, as plain
    text: a rerun given only the output refuses it, naming it; the secret is nowhere under the output and LATEST
    stays. The run's own stored config, signed by the run, is taken."""
    out, secret = tmp_path / "out", tmp_path / "secret.txt"
    shutil.copytree(gpt2_run, out)
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    stored = json.loads((out / "_work/config.json").read_text())
    assert (out / "_work/config.json.hmac").exists()  # the run signed what it stored
    stored["input"]["paths"], stored["input"]["format"] = [str(secret)], "auto"
    (out / "_work/config.json").write_text(json.dumps(stored))
    latest = (out / "demo-gpt2/LATEST").read_bytes()

    refused = run_cli("rerun", str(out), "--shard", "1", check=False)
    assert refused.returncode == 1 and "_work/config.json is not signed with your tokenmill key" in refused.stdout
    assert not [p for p in out.rglob("*") if p.is_file() and SECRET.strip() in p.read_bytes()]
    assert (out / "demo-gpt2/LATEST").read_bytes() == latest
    shutil.copy(gpt2_run / "_work/config.json", out / "_work/config.json")
    assert "4 shards (3 reused)" in run_cli("rerun", str(out), "--shard", "1").stdout


def test_a_named_key_that_is_missing_or_not_a_key_stops_the_run_and_none_is_made(
    gpt2_run, run_cli, tmp_path, monkeypatch
):
    """`TOKENMILL_STATE_KEY` names the key (infra/ mounts it from a Secret). Where that file is missing, none is made
    there (a new key would have every shard of the user's outputs made again) and a rerun stops, naming the file and
    how to make one; empty, not hex, or short, it stops too. Named, the user's own key is taken: the rerun takes the
    run's signed config and its markers."""
    from tokenmill.core.signing import key_path

    out, named = tmp_path / "out", tmp_path / "keys" / "state-key"
    shutil.copytree(gpt2_run, out)
    latest = (out / "demo-gpt2/LATEST").read_bytes()
    own = key_path().read_text()  # the key gpt2_run signed with, in this environment's TOKENMILL_HOME
    monkeypatch.setenv("TOKENMILL_STATE_KEY", str(named))

    missing = run_cli("rerun", str(out), "--shard", "1", check=False)
    assert missing.returncode == 1, missing.stdout
    assert f"{named}: no such file, and TOKENMILL_STATE_KEY names it" in missing.stdout
    assert f"openssl rand -hex 32 > {named}" in missing.stdout and not named.parent.exists()
    named.parent.mkdir(mode=0o700)
    for text, said in (("", "holds 0 characters"), ("not a key\n", "holds 9 characters that are not hex"),
                       ("ab" * 15, "holds 30 characters")):  # fmt: skip
        named.write_text(text)
        named.chmod(0o600)
        refused = run_cli("rerun", str(out), "--shard", "1", check=False)
        assert refused.returncode == 1 and f"{named}: not a tokenmill key" in refused.stdout, refused.stdout
        assert said in refused.stdout
    assert (out / "demo-gpt2/LATEST").read_bytes() == latest
    named.write_text(own)
    assert "4 shards (3 reused)" in run_cli("rerun", str(out), "--shard", "1").stdout


def test_a_previous_version_naming_a_directory_outside_is_not_pruned(gpt2_run, run_cli, tmp_path):
    """`keep_versions` deletes the versions of LATEST's lineage past the newest N, as each manifest names the one
    before it: a published manifest rewritten to name `../../victim` as its previous version stops the run, naming
    the manifest, and the directory there (a dataset's look-alike) is intact."""
    out, victim = tmp_path / "out", tmp_path / "victim"
    shutil.copytree(gpt2_run, out)
    victim.mkdir()
    (victim / "manifest.json").write_text("{}")
    (victim / "data.bin").write_bytes(SECRET)
    version = (out / "demo-gpt2/LATEST").read_text().strip()
    manifest = out / "demo-gpt2" / version / "manifest.json"
    published = json.loads(manifest.read_text())
    published["lineage"]["previous_version"] = "../../victim"
    manifest.write_text(json.dumps(published))

    refused = run_cli(*run_args(str(out), "--set", "output.publish.keep_versions=1"), check=False)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert f"{manifest} names '../../victim', which is no version" in refused.stdout, refused.stdout
    assert (victim / "data.bin").read_bytes() == SECRET


def test_a_version_directory_linked_elsewhere_in_the_publish_location_is_never_written_through(
    gpt2_run, run_cli, tmp_path
):
    """The version a run publishes has a name known in advance (a hash of what it holds): planted in a shared publish
    location as a link to another directory, the publish refuses it, naming it, and that directory is untouched."""
    out, published, other = tmp_path / "out", tmp_path / "published", tmp_path / "other"
    shutil.copytree(gpt2_run, out)
    other.mkdir()
    (other / "stats.json").write_bytes(SECRET)
    version = (gpt2_run / "demo-gpt2/LATEST").read_text().strip()
    (published / "demo-gpt2").mkdir(parents=True)
    (published / "demo-gpt2" / version).symlink_to(other)

    refused = run_cli(*run_args(str(out), "--set", f"output.publish.path={published}"), check=False)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert f"{published}/demo-gpt2/{version} is a symbolic link" in refused.stdout, refused.stdout
    assert sorted(os.listdir(other)) == ["stats.json"] and (other / "stats.json").read_bytes() == SECRET
