"""What a person sees, in a real browser: Debian's chromium, driven by Playwright (its Python package; its own
browser download is not used). The flow-run page that `tokenmill run` prints, Retry pressed on a failed
deployment run, the deployment's "Custom run" form, and the Dask dashboard of a running flow. Every page is
saved as a screenshot under the test's temp dir; a failing test lists them (tests/conftest.py).

`TOKENMILL_SCREENSHOT=docs/flow-run.png pytest tests/test_ui.py -k run_page` also writes the README's
picture of a run's graph."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import dask
import pytest

from flows.server import ui_url

from .conftest import (
    EXAMPLES,
    GATED_RUN,
    REPO,
    TOKENIZERS,
    TOKENMILL,
    dataset_files,
    gated_news,
    served_process,
    stop,
)
from .test_operations import block, committed, deployment_named, every_page, final_state, unblock, wait_for

CHROMIUM = Path("/usr/bin/chromium")
# Headless and quiet: without the background-networking flags Chromium keeps calling Google's services, which
# a closed network answers with a flood of errors.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
UI_TIMEOUT_MS = 60_000  # a page of the UI on a loaded 2-core machine


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.skip(f"no browser: {CHROMIUM} is missing (`make chromium` installs Debian's chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is missing: pip install -e '.[test]'")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


class Browsing:
    """A browser window for one test; `shot` saves what its page shows now (listed when the test fails)."""

    def __init__(self, context, folder: Path):
        self.context, self.folder, self.paths = context, folder, []
        self.page = context.new_page()

    def shot(self, name: str, page=None) -> None:
        path = self.folder / f"{len(self.paths):02d}-{name}.png"
        try:
            (page or self.page).screenshot(path=path)
            self.paths.append(str(path))
        except Exception as e:  # a closed page: say so instead of hiding the test's own failure
            self.paths.append(f"{path} (not taken: {type(e).__name__})")


@pytest.fixture
def ui(browser, tmp_path, prefect_api):  # the server's password, which prefect_api sets in the environment
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.set_default_timeout(UI_TIMEOUT_MS)
    # Signed in, as the UI keeps it once asked (the sign-in itself: test_the_ui_asks_for_the_servers_password_once)
    password = json.dumps(os.environ["PREFECT_API_AUTH_STRING"])
    context.add_init_script(f"window.localStorage.setItem('prefect-password', btoa({password}))")
    yield Browsing(context, tmp_path / "screenshots")
    context.close()


def printed_link(stdout: str) -> str:
    """The run's page, from the last line `tokenmill run` printed."""
    last = stdout.strip().splitlines()[-1]
    assert last.startswith("The run in the Prefect UI: "), stdout[-2000:]
    return last.removeprefix("The run in the Prefect UI: ")


ERROR_TOASTS = ("Oops. Something went wrong", "Authentication failed", "Try it now")  # Prefect's, on a refused call


def sign_in(page, line: str) -> None:
    """Give tokenmill's sign-in page (flows/server.py: SIGN_IN) the line of the server's auth file."""
    page.get_by_placeholder("tokenmill:...").fill(line)
    page.get_by_role("button", name="Sign in").click()


def test_the_ui_asks_for_the_servers_password_once(browser, prefect_api, tmp_path):
    """Anyone on the host can open 127.0.0.1: the local server's UI asks for the line of its auth file (readable by
    its user only), refuses a wrong one, and once given the right one shows the runs, and keeps it."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.set_default_timeout(UI_TIMEOUT_MS)
    ui = Browsing(context, tmp_path / "screenshots")
    page = ui.page
    try:
        page.goto(f"{ui_url(prefect_api)}/runs")
        page.get_by_text("tokenmill-server-auth").wait_for()  # says which file holds the line
        ui.shot("asked")
        sign_in(page, "tokenmill:not-the-password")
        page.get_by_text("Refused: that is not this server's line.").wait_for()
        ui.shot("refused")
        assert page.evaluate("window.localStorage.getItem('prefect-password')") is None  # refused, not kept
        sign_in(page, os.environ["PREFECT_API_AUTH_STRING"])
        page.get_by_text("Work Pools", exact=True).first.wait_for()  # the app's own menu: the runs page
        assert page.evaluate("window.localStorage.getItem('prefect-password')")  # kept
        page.goto(f"{ui_url(prefect_api)}/runs")  # a visit after signing in is not asked again
        page.get_by_text("Work Pools", exact=True).first.wait_for()
        page.get_by_text("Runs", exact=True).first.wait_for()
        ui.shot("signed-in")
        assert page.url.endswith("/runs") and page.get_by_placeholder("tokenmill:...").count() == 0
    finally:
        context.close()


def test_the_printed_link_in_a_fresh_browser_asks_once_then_shows_the_run(browser, gpt2_run, prefect_api, tmp_path):
    """The last line `tokenmill run` prints, opened as a new user clicks it (a fresh browser, nothing kept): asked for
    the line once, then that run's page, at that address, without Prefect's error toasts; opened again, not asked."""
    link = printed_link((gpt2_run.parent / "stdout.txt").read_text())
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.set_default_timeout(UI_TIMEOUT_MS)
    ui = Browsing(context, tmp_path / "screenshots")
    page = ui.page
    try:
        page.goto(link)
        page.get_by_placeholder("tokenmill:...").wait_for()
        ui.shot("asked")
        sign_in(page, os.environ["PREFECT_API_AUTH_STRING"])
        page.get_by_text("corpus-to-tokens", exact=True).first.wait_for()  # the flow's run
        page.get_by_text("Completed", exact=True).first.wait_for()
        page.wait_for_timeout(3000)  # a toast comes with the answer to a refused call, after the page is drawn
        ui.shot("run")
        assert page.url == link
        assert [toast for toast in ERROR_TOASTS if page.get_by_text(toast).count()] == []
        page.goto(link)
        page.get_by_text("corpus-to-tokens", exact=True).first.wait_for()
        assert page.get_by_placeholder("tokenmill:...").count() == 0  # kept: not asked again
    finally:
        context.close()


def test_run_page_that_tokenmill_run_prints_shows_the_state_shard_tasks_and_summary(gpt2_run, prefect_api, ui):
    link = printed_link((gpt2_run.parent / "stdout.txt").read_text())
    assert re.fullmatch(re.escape(ui_url(prefect_api)) + r"/runs/flow-run/[0-9a-f-]{36}", link), link
    page = ui.page
    page.goto(link)
    page.get_by_text("corpus-to-tokens", exact=True).first.wait_for()  # the flow's run
    page.get_by_text("Completed", exact=True).first.wait_for()
    page.locator(".flow-run-graphs canvas").first.wait_for()
    page.wait_for_timeout(2000)  # the graph draws its nodes after the page has loaded
    ui.shot("run")
    if readme_picture := os.environ.get("TOKENMILL_SCREENSHOT"):
        graph = page.locator(".flow-run-graphs").bounding_box()
        top = {"x": graph["x"] - 16, "y": 0, "width": graph["width"] + 32, "height": graph["y"] + graph["height"] + 8}
        page.screenshot(path=REPO / readme_picture, clip=top)

    page.get_by_text("Task Runs", exact=True).click()
    for group in ("shards 00000-00001", "shards 00002-00003"):  # a task run per cluster thread (2), 2 shards each
        page.get_by_text(f"tokenize[{group}]", exact=True).wait_for()
    ui.shot("task-runs")

    page.get_by_text("Artifacts", exact=True).click()
    page.get_by_text("tokenmill-summary", exact=True).click()
    manifest = json.loads((gpt2_run / "manifest.json").read_text())
    page.get_by_text(f"{manifest['counts']['tokens']:,} tokens", exact=False).first.wait_for()
    # its three plots are drawn (inline: the report file's relative links would lead nowhere here)
    drawn = "() => Array.from(document.images).filter(i => i.complete && i.naturalWidth > 0).map(i => i.alt)"
    page.wait_for_function(f"({drawn})().length >= 3")
    assert set(page.evaluate(drawn)) >= {"document_lengths", "tokens_per_shard", "utilization"}
    ui.shot("summary-artifact")


def test_a_mixture_run_page_shows_its_sources_in_the_task_runs_and_the_mix_in_the_summary(run_cli, tmp_path, ui):
    """Two sources from examples/data: the run's task runs name their sources, its Logs tab shows what the flow
    logged (at INFO, as a user's run logs), and its summary artifact shows the mix, a row per source, beside its
    plot."""
    corpora = EXAMPLES / "data"
    config = {
        "name": "mix-ui",
        "sources": [
            {"name": "news", "input": {"paths": [str(corpora / "web_scrapinghub_aeb.jsonl.gz")]}, "weight": 2},
            {"name": "web", "input": {"paths": [str(corpora / "web_dclm_annotated.jsonl.gz")]}, "weight": 1},
        ],
        "split": {"train": 0.9, "val": 0.1},
        "tokenizer": {"path": str(TOKENIZERS / "gpt2" / "tokenizer.json")},
        "output": {"path": str(tmp_path / "out")},
        "dask": {"groups_per_stage": 1},  # one task run over both sources' shards
    }
    path = tmp_path / "mix.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    page = ui.page
    page.goto(printed_link(run_cli("run", str(path), log_level="INFO").stdout))
    page.get_by_text("Completed", exact=True).first.wait_for()
    page.get_by_text("Logs", exact=True).first.click()
    page.get_by_text("planned 2 shards of", exact=False).first.wait_for()
    page.get_by_text("tokenizer: vocab 50257, EOD id 50256", exact=False).first.wait_for()
    ui.shot("mixture-logs")
    page.get_by_text("Task Runs", exact=True).click()
    page.get_by_text("tokenize[shards 00000-00001: news, web]", exact=True).wait_for()
    ui.shot("mixture-task-runs")
    page.get_by_text("Artifacts", exact=True).click()
    page.get_by_text("tokenmill-summary", exact=True).click()
    page.get_by_text("The mix: ", exact=False).first.wait_for()
    for row in ("weight 2", "weight 1"):
        page.get_by_role("cell", name=row, exact=True).wait_for()
    drawn = "() => Array.from(document.images).filter(i => i.complete && i.naturalWidth > 0).map(i => i.alt)"
    page.wait_for_function(f"({drawn})().includes('mix')")
    ui.shot("mixture-summary")


def runs_building(client, output: Path) -> list:
    """The flow runs whose config builds in `output`, of all the session server's (a read returns a page of them,
    in the order of their random ids; a rerun-shards run without --config has its config None)."""
    return [
        r
        for r in every_page(client.read_flow_runs)
        if (r.parameters.get("config") or {}).get("output", {}).get("path") == str(output)
    ]


def dashboard_link(client, output: Path) -> str | None:
    """The Dask dashboard that the run building `output` left as its link artifact, once it has."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    runs = runs_building(client, output)
    if not runs:
        return None
    of_runs = ArtifactFilterFlowRunId(any_=[r.id for r in runs])
    artifacts = client.read_artifacts(
        artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["dask-dashboard"]), flow_run_id=of_runs)
    )
    found = artifacts and re.search(r"\((http://[^)]+)\)", artifacts[0].data)
    return found[1] if found else None


# What the dashboard's page holds, read from its Bokeh documents: the workers and the progress bars' task names.
DASHBOARD_CONTENT = """() => {
  const found = {worker: [], name: []};
  for (const doc of (window.Bokeh ? Bokeh.documents : []))
    for (const model of doc._all_models.values())
      if (model.type === 'ColumnDataSource') {
        const data = model.data instanceof Map ? Object.fromEntries(model.data) : model.data;
        for (const column of ['worker', 'name']) if (Array.isArray(data[column])) found[column].push(...data[column]);
      }
  return found;
}"""


def test_dask_dashboard_of_a_running_flow_shows_workers_and_shard_progress_and_its_tabs_spill_nothing(
    prefect_api, prefect_client, ui, tmp_path
):
    """The dashboard's Bokeh server lives in the LocalCluster's process, whose stderr is the `tokenmill run`
    terminal: closing the dashboard's tab used to print two Bokeh AssertionError tracebacks there, and a tab
    open at the run's end a tornado CancelledError traceback (`flows.clusters.local_process.close_dashboard`).
    One tab is closed mid-run, others open and close while the run goes on, one stays open across the run's end.
    bench/dashboard_tabs.py repeats this scenario 20 times. The run's shard waits at a gate (`Gate`) while the
    dashboard is watched, however slowly a loaded machine's browser draws it (a run of a given length ended, once,
    before the dashboard was drawn); then the gate opens and the run ends, a tab still open."""
    out = tmp_path / "out"
    stdout, stderr = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    gate = gated_news(tmp_path)
    command = [*TOKENMILL, "run", "examples/gpt2.yaml", "--set", f"output.path={out}",
               "--set", f"input.paths=[{gate.url}]", *GATED_RUN, "--set", "dask.n_workers=2"]  # fmt: skip
    env = gate.env({**os.environ, "PREFECT_API_URL": prefect_api})
    with open(stdout, "w") as out_file, open(stderr, "w") as err_file:
        run = subprocess.Popen(command, cwd=REPO, env=env, stdout=out_file, stderr=err_file, start_new_session=True)
    try:
        link = wait_for(lambda: dashboard_link(prefect_client, out) or run.poll() is not None, 180, "the dashboard")
        gate.reached(run)  # the shard is being tokenized, and waits
        held = ui.context.new_page()  # open across the run's end
        held.goto(link.replace("/status", "/workers"), wait_until="commit")
        tab = ui.context.new_page()
        tab.goto(link)

        def shows_shards():
            content = tab.evaluate(DASHBOARD_CONTENT)
            workers = {w for w in content["worker"] if "://" in w}  # their addresses (a plot's placeholder aside)
            return len(workers) == 2 and any("tokenize" in n for n in content["name"]) and content

        content = wait_for(shows_shards, 180, "the dashboard to show both workers and the tokenize shards")
        ui.shot("dashboard", tab)
        tab.close()  # as a person closes it, mid-run
        for _ in range(3):  # and glances at it again, a few times while the run goes on
            tab = ui.context.new_page()
            tab.goto(link, wait_until="commit")
            tab.wait_for_timeout(700)
            tab.close()
        assert run.poll() is None, "the run ended while its shard waited at the gate"
        gate.open()
        assert run.wait(600) == 0, stderr.read_text()
        held.close()
    finally:
        gate.open()
        if run.poll() is None:
            stop(run, signal.SIGTERM)
    errors = stderr.read_text()
    assert "Traceback" not in errors and "Error" not in errors, errors
    assert printed_link(stdout.read_text())
    assert {n for n in content["name"] if "tokenize" in n}, content


def test_closing_the_dashboard_closes_its_open_tabs_and_waits_for_their_handlers(ui):
    """`close_dashboard`, as a run's end calls it before its cluster's event loop ends: a tab that shows the
    dashboard is told the server is going away, and no websocket or handler of it is left to be cancelled."""
    from bokeh.server.tornado import BokehTornado
    from playwright.sync_api import Error as PlaywrightError

    from flows.clusters.local import local_cluster_kwargs
    from flows.clusters.local_process import attach_dashboard, close_dashboard, remove_scratch, start_local_cluster
    from tokenmill.config import DaskConfig

    # The cluster's scratch space is made Dask's temporary directory in this process, as in the cluster's own:
    # restored after, and removed as the cluster's process removes it when it ends.
    with dask.config.set({"temporary-directory": dask.config.get("temporary-directory", None)}):
        cluster = start_local_cluster(local_cluster_kwargs(DaskConfig(n_workers=1)), None)
        try:
            attach_dashboard(cluster)
            pages = [a for a in cluster.scheduler.http_application.applications if isinstance(a, BokehTornado)]
            tabs = [ui.context.new_page() for _ in range(3)]
            for tab, path in zip(tabs, ("/status", "/workers", "/individual-progress"), strict=True):
                tab.goto(cluster.dashboard_link.replace("/status", path))
            wait_for(lambda: sum(len(a._clients) for a in pages) == 3, 120, "three tabs connected")
            close_dashboard(cluster)
            assert [c for a in pages for c in a._clients] == []
            with pytest.raises(PlaywrightError):  # no new tab is taken
                ui.context.new_page().goto(cluster.dashboard_link, timeout=10_000)
        finally:
            cluster.close()
            remove_scratch()


def test_dashboard_filter_drops_only_bokehs_assertion_on_a_detached_session():
    """The record the dashboard test provokes, made deterministically: Bokeh's own `ServerConnection.session` on a
    connection whose session was detached raises the AssertionError; any other error passes the filter."""
    import logging

    from bokeh.server.connection import ServerConnection

    from flows.clusters.local_process import ClosedDashboardTab

    def record_of(action) -> logging.LogRecord:
        try:
            action()
        except AssertionError:
            return logging.LogRecord("tornado.application", logging.ERROR, __file__, 0, "Uncaught", (), sys.exc_info())
        raise AssertionError("no error raised")

    detached = ServerConnection.__new__(ServerConnection)
    detached._session = None  # what client_lost() leaves behind
    filter_ = ClosedDashboardTab()
    assert not filter_.filter(record_of(lambda: detached.session))

    def elsewhere():
        raise AssertionError("another error of the dashboard")

    assert filter_.filter(record_of(elsewhere))
    assert filter_.filter(
        logging.LogRecord("tornado.application", logging.ERROR, __file__, 0, "no exception", (), None)
    )
    assert ClosedDashboardTab in {type(f) for f in logging.getLogger("tornado.application").filters}


def test_worker_filter_drops_only_a_heartbeat_the_closing_scheduler_cut_off():
    """The record a loaded machine made once at a run's end (a worker's heartbeat as the scheduler closed), as
    `distributed.worker` logs it: dropped; the same words with another cause, or other errors, pass. The workers
    of the LocalCluster `tokenmill run` starts have it (their forkserver installs it)."""
    import logging

    from distributed import Client
    from distributed.comm.core import CommClosedError

    from flows.clusters.local import local_cluster_process
    from flows.clusters.local_process import HEARTBEAT_FAILED, ClosedScheduler
    from tokenmill.config import DaskConfig

    def record_of(error: Exception, message: str = HEARTBEAT_FAILED + ".") -> logging.LogRecord:
        try:
            raise error
        except Exception:
            return logging.LogRecord("distributed.worker", logging.ERROR, __file__, 0, message, (), sys.exc_info())

    cut_off = CommClosedError("in <TCP (closed) ConnectionPool.heartbeat_worker>: Stream is closed")
    filter_ = ClosedScheduler()
    assert not filter_.filter(record_of(cut_off))
    assert filter_.filter(record_of(OSError("Timed out trying to connect")))
    assert filter_.filter(record_of(cut_off, "Unexpected exception during heartbeat. Closing worker."))

    def worker_filters() -> list[str]:
        return [type(f).__name__ for f in logging.getLogger("distributed.worker").filters]

    with local_cluster_process(DaskConfig(n_workers=1)) as started:
        running = started()
        with Client(running.address, security=running.security) as client:
            assert list(client.run(worker_filters).values()) == [["ClosedScheduler"]]


@pytest.fixture(scope="module")
def served(prefect_api, dask_cluster, tmp_path_factory):
    """`tokenmill serve` of examples/gpt2.yaml (4 shards) as deployment `ui`, its runs on the session's cluster."""
    out = tmp_path_factory.mktemp("served") / "out"
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "TOKENMILL_DASK_ADDRESS": dask_cluster}
    log = out.parent / "serve.log"
    server = served_process(
        [*TOKENMILL, "serve", "examples/gpt2.yaml", "--set", "partition.shard_size=1MB",
         "--set", f"output.path={out}", "--name", "ui"], env, log,
    )  # fmt: skip
    yield out
    stop(server, log=log)


def submit(page, deployment_id) -> None:
    """Press the run form's Submit and see the server create the run. A 503 is Prefect's "retry" (its SQLite was
    busy; the page shows only "Oops. Something went wrong"): a person presses Submit again, and so does this, once.
    Any other refusal fails here, with the server's answer and its log, not after a wait for a run that is not
    coming."""
    from flows.server import private_home

    def the_create_call(response) -> bool:
        return response.request.method == "POST" and response.url.endswith(f"{deployment_id}/create_flow_run")

    for attempt in (1, 2):
        with page.expect_response(the_create_call) as answer:
            page.get_by_role("button", name="Submit", exact=True).click()
        if (response := answer.value).ok:
            return
        if response.status != 503 or attempt == 2:
            log = (private_home() / "tokenmill-server.log").read_text(errors="replace")[-4000:]
            pytest.fail(f"the server refused the run: {response.status} {response.text()}\nits log ends:\n{log}")
        page.wait_for_timeout(2000)


def served_deployment(client):
    return wait_for(lambda: deployment_named(client, "corpus-to-tokens/ui"), 120, "the served deployment")


def test_retry_pressed_in_the_ui_redoes_only_the_failed_shard(served, gpt2_run, prefect_api, prefect_client, ui):
    out = served
    blocked = out / "megatron/train/shard-00001.bin"
    block(blocked)  # before the deployment's first run in `out`: shard 1 cannot be written
    deployment = served_deployment(prefect_client)
    run = prefect_client.create_flow_run_from_deployment(deployment.id, parameters=deployment.parameters)
    assert final_state(prefect_client, run.id).is_failed()
    before = committed(out, "tokenize")
    assert len(before) == 3

    unblock(blocked)  # the person fixed the cause, opens the failed run and presses Retry
    page = ui.page
    page.goto(f"{ui_url(prefect_api)}/runs/flow-run/{run.id}")
    page.get_by_text("Failed", exact=True).first.wait_for()
    ui.shot("failed-run")
    page.get_by_role("button", name="Retry", exact=True).first.click()
    dialog = page.locator(".p-modal")
    dialog.get_by_text(f"Retry {prefect_client.read_flow_run(run.id).name}?").wait_for()
    ui.shot("retry-dialog")
    dialog.get_by_role("button", name="Retry", exact=True).click()

    wait_for(lambda: not prefect_client.read_flow_run(run.id).state.is_failed(), 120, "the retry to start")
    assert final_state(prefect_client, run.id).is_completed()
    page.reload()
    page.get_by_text("Completed", exact=True).first.wait_for()
    ui.shot("retried-run")

    after = committed(out, "tokenize")
    assert set(after) == set(before) | {"shard-00001.json"}
    assert {k: after[k] for k in before} == before  # the three committed shards were reused, not redone
    retried, fresh = dataset_files(out), dataset_files(gpt2_run)
    assert json.loads(retried.pop("manifest.json")) == json.loads(fresh.pop("manifest.json"))
    assert retried == fresh


def test_custom_run_form_shows_the_config_and_runs_it_with_a_changed_field(
    served, prefect_api, prefect_client, ui, tmp_path
):
    deployment = served_deployment(prefect_client)
    page = ui.page
    page.goto(f"{ui_url(prefect_api)}/deployments/deployment/{deployment.id}")
    page.get_by_role("button", name="Run", exact=True).click()
    page.get_by_text("Custom run", exact=True).click()
    # The config parameter as a form: a field per setting, with the model's descriptions and the served values.
    from tokenmill.config import InputConfig, PartitionConfig, TokenmillConfig

    for model, field in ((TokenmillConfig, "name"), (InputConfig, "paths"), (PartitionConfig, "shard_size")):
        page.get_by_text(model.model_fields[field].description, exact=True).first.wait_for()
    page.get_by_text("Seq Len (Optional)", exact=True).wait_for()
    texts = page.locator("textarea")
    fields = {texts.nth(i).input_value(): texts.nth(i) for i in range(texts.count())}
    assert {"demo-gpt2", "examples/data/*.jsonl*", str(served)} <= set(fields), sorted(fields)
    ui.shot("custom-run-form")

    elsewhere = tmp_path / "custom"
    fields[str(served)].fill(str(elsewhere))  # one changed field: where the dataset is built
    submit(page, deployment.id)
    run = wait_for(lambda: runs_building(prefect_client, elsewhere), 180, "the run submitted from the form")[0]
    assert run.parameters["config"]["output"]["path"] == str(elsewhere)
    assert final_state(prefect_client, run.id).is_completed()
    page.goto(f"{ui_url(prefect_api)}/runs/flow-run/{run.id}")
    page.get_by_text("Completed", exact=True).first.wait_for()
    ui.shot("custom-run")
    manifest = json.loads((elsewhere / "manifest.json").read_text())
    assert manifest["name"] == "demo-gpt2" and manifest["counts"]["documents_in"] == 742
