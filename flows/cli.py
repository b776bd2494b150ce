"""The `tokenmill` command line: part of the application, beside the flows it runs."""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import functools
import gc
import logging
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Annotated

import typer
import yaml
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from tokenmill.config import TokenmillConfig, load_config

app = typer.Typer(
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
)
server_app = typer.Typer(help="The local Prefect server tokenmill starts when PREFECT_API_URL is not set.")
app.add_typer(server_app, name="server")
console = Console(soft_wrap=True)  # messages name paths: never break them across lines

SetOption = Annotated[
    list[str],
    typer.Option("--set", help="Override a config key, e.g. --set pack.seq_len=4096 (repeatable; YAML values)."),
]
DebugOption = Annotated[
    bool, typer.Option("--debug", help="Show the tracebacks of failures on the terminal (the Prefect UI keeps them).")
]


class WithoutTraceback(logging.Formatter):
    """A console handler's formatter that leaves tracebacks out: a failure is one line on the terminal (what
    failed and why), the run's last line says what to do, and the whole traceback stays in the run's logs in the
    Prefect UI (and on the terminal with --debug). The record is restored for the handlers after this one."""

    def __init__(self, formatter: logging.Formatter):
        super().__init__()
        self.formatter = formatter

    def format(self, record: logging.LogRecord) -> str:
        saved = record.exc_info, record.exc_text, record.stack_info
        record.exc_info = record.exc_text = record.stack_info = None
        try:
            return self.formatter.format(record)
        finally:
            record.exc_info, record.exc_text, record.stack_info = saved


def tracebacks_off_the_terminal() -> None:
    """Every console handler Prefect's logging set up (its own loggers', and the root's, which the others reach)
    formats without tracebacks (`WithoutTraceback`)."""
    from prefect.logging.handlers import PrefectConsoleHandler

    loggers = [
        logging.getLogger(),
        *(v for v in logging.Logger.manager.loggerDict.values() if isinstance(v, logging.Logger)),
    ]
    for handler in {h for logger in loggers for h in logger.handlers if isinstance(h, PrefectConsoleHandler)}:
        if not isinstance(handler.formatter, WithoutTraceback):
            handler.setFormatter(WithoutTraceback(handler.formatter or logging.Formatter()))


def _load(config: Path, overrides: list[str]) -> TokenmillConfig:
    try:
        return load_config(config, overrides)
    except ValidationError as e:
        lines = [f"  {'.'.join(map(str, err['loc'])) or '(top level)'}: {err['msg']}" for err in e.errors()]
        raise _fail(f"{config}: invalid configuration\n" + "\n".join(lines), code=2) from None
    except (OSError, ValueError, yaml.YAMLError) as e:
        raise _fail(f"{config}: {e}", code=2) from None


def _interactive() -> bool:
    return console.is_terminal and not os.environ.get("CI")


def progress_bars(output: str):
    """Bars of committed shards per stage on a terminal; nothing in CI or when piped."""
    if not _interactive():
        return contextlib.nullcontext()
    from tokenmill.commands.progress import ShardProgress

    return ShardProgress(output, console)


def _fail(message: str, code: int = 1) -> typer.Exit:
    console.print(f"[red]error:[/red] {message}", highlight=False)
    return typer.Exit(code)


def _version(shown: bool) -> None:
    if shown:
        from tokenmill import __version__

        console.print(f"tokenmill {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print tokenmill's version and exit.")
    ] = False,
) -> None:
    """tokenmill: a raw text corpus in, training-ready tokens out (a Prefect flow on Dask)."""
    # `kill -USR1 <pid>` prints every thread's stack to stderr and the command goes on: what a command that seems
    # stuck is doing, without a debugger (the tests send it to a run that outlives its timeout).
    faulthandler.register(signal.SIGUSR1, all_threads=True)


# `tokenmill run --help`: the config's sections, from the model itself (docs/configuration.md has every key).
RUN_HELP = (
    "Run the whole flow (partition, tokenizer, tokenize, pack, validate, publish) for CONFIG.yaml.\n\n"
    "CONFIG.yaml's sections (`tokenmill check CONFIG.yaml` prints every key with its default; docs/configuration.md "
    "describes each):\n\n"
    + "\n\n".join(f"{name}: {field.description}" for name, field in TokenmillConfig.model_fields.items())
)


@app.command(help=RUN_HELP)
def run(config: Path, overrides: SetOption = [], debug: DebugOption = False) -> None:  # noqa: B006 (typer reads it)
    cfg = _load(config, overrides)
    if _interactive():  # the bars replace Prefect's per-task log lines on the terminal (the UI keeps them)
        os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "WARNING")
    from flows.clusters import local
    from flows.startup import without_collector

    # The cluster's process first, as soon as the config is read: it boots on the other core while this one
    # finds the Prefect server and imports Prefect (its workers run library code only, never Prefect's).
    with ends_promptly(), local.local_cluster_started_early(cfg.dask, cfg.tokenizer) as connect:
        from flows.server import ensure_api, supervised, ui_url
        from tokenmill.stages.partition import PlanAhead

        api_url = ensure_api()
        scheduler = cfg.dask.scheduler() or ("SLURM jobs" if cfg.dask.slurm else "LocalCluster")
        console.print(f"Prefect UI: {ui_url(api_url)}, Dask: {scheduler}", highlight=False)
        # The partition stage's threads are known now: it plans while Prefect imports, and the flow takes the plan.
        ahead = PlanAhead.start(cfg, local.threads(cfg.dask)) if scheduler == "LocalCluster" else None
        with supervised(api_url):
            with without_collector():
                from flows.main import corpus_to_tokens

            if not debug:
                tracebacks_off_the_terminal()
            try:
                connect()
                with progress_bars(cfg.output.path), heartbeats_only_if_asked():
                    state = corpus_to_tokens(config=cfg, plan_ahead=ahead, return_state=True)
            except Exception as e:  # the flow's logs above hold the details; end with the reason, not a traceback
                raise _fail(f"run failed: {failure_message(e, api_url)}") from None
            summary, link = outcome(state, "run", api_url)
    print_summary(summary, link)
    # With Prefect, Dask, pandas and matplotlib loaded, the garbage collector's passes over the whole heap
    # at interpreter exit took 0.6-1 s; frozen objects are skipped (exit handlers and flushing still run).
    gc.freeze()


@contextlib.contextmanager
def heartbeats_only_if_asked():
    """A flow run here sends Prefect's flow-run heartbeats (for an automation that marks a run whose process died
    as crashed) only where PREFECT_FLOWS_HEARTBEAT_FREQUENCY, or a Prefect profile, asks for them: their thread
    sleeps in 1 s steps and Prefect waits for it as the run ends, half a second on average added to every
    `tokenmill run`. Deployments' runs (run by a worker, or `tokenmill serve`) keep Prefect's default."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, get_current_settings, temporary_settings

    if "heartbeat_frequency" in get_current_settings().flows.model_fields_set:
        yield
        return
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield


def failure_message(error: Exception, api_url: str) -> str:
    """The reason a run failed; an unreachable Prefect API, one that refused this process's credentials, or one
    that lost a result, is said as such, with its URL."""
    import httpx
    from prefect.exceptions import MissingResult

    chain, cause = [], error
    while cause is not None and cause not in chain:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    if lost := next((c for c in chain if isinstance(c, MissingResult)), None):  # seen after a server restart
        return (
            f"the Prefect API at {api_url} no longer had a task's result, as when the server restarts during a run "
            f"(Prefect: {lost}); the shards committed so far are kept: run the same command again and it reuses "
            "every one of them"
        )
    refused = next((c for c in chain if isinstance(c, httpx.HTTPStatusError) and c.response.status_code == 401), None)
    if refused is not None:
        return (
            f"the Prefect API at {api_url} asks for a user and password and this process gave none that it accepts: "
            "set PREFECT_API_AUTH_STRING=user:password (the server's PREFECT_SERVER_API_AUTH_STRING); nothing was run"
        )
    if unreachable := next((c for c in chain if isinstance(c, httpx.TransportError)), None):
        reason = f"{type(unreachable).__name__}: {str(unreachable) or 'no answer'}"
        return (
            f"the Prefect API at {api_url} was unreachable ({reason}); "
            "the shards committed so far are kept: run the same command again and it reuses every one of them"
        )
    return str(error)


# Prefect's exit handlers deliver the run's last events and logs to its API: well under a second when it answers.
EXIT_GRACE_S = 10.0


@contextlib.contextmanager
def ends_promptly():
    """A command whose process ends at most EXIT_GRACE_S after the block (its cluster closed, its message
    printed): with the Prefect API unreachable, Prefect's exit handlers keep reconnecting for each buffered
    event, about 7 s apiece (a run was still at it more than 8 minutes after its flow failed)."""
    code = 1
    try:
        yield
        code = 0
    except typer.Exit as e:
        code = e.exit_code
        raise
    finally:

        def leave() -> None:
            print(
                f"tokenmill: exiting without waiting longer for the Prefect API ({EXIT_GRACE_S:.0f} s)", file=sys.stderr
            )
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

        timer = threading.Timer(EXIT_GRACE_S, leave)
        timer.daemon = True  # it does not hold the process up: a prompt exit just ends it
        timer.start()


def outcome(state, what: str, api_url: str) -> tuple[dict, str | None]:
    """The flow's summary and the run's page in the Prefect UI; a failed run ends the command with its reason
    and that page, last, where a person looks."""
    link = run_page(state.state_details.flow_run_id)
    try:
        return state.result(), link
    except Exception as e:
        again = "Fix the cause and run the same command again: committed shards are reused."
        page = f"\nThe run in the Prefect UI: {link}" if link else ""
        raise _fail(f"{what} failed: {failure_message(e, api_url)}\n{again}{page}") from None


def run_page(flow_run_id) -> str | None:
    """The UI page of the flow run that holds the DAG's tasks, logs and artifacts: the run's one subflow run where
    it has one (rerun-shards runs corpus-to-tokens as its subflow), else the run itself."""
    if flow_run_id is None:
        return None
    import httpx
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId
    from prefect.utilities.urls import url_for

    try:
        with get_client(sync_client=True) as client:
            children = client.read_flow_runs(
                flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id]))
            )
    except httpx.TransportError:  # the API is gone: the failure message says so
        return None
    return url_for("flow-run", obj_id=str(children[0].id if len(children) == 1 else flow_run_id))


def print_summary(summary: dict, link: str | None) -> None:
    published = summary["published"]
    if summary.get("unchanged"):
        console.print(
            f"\n[bold]Nothing to do: {published['url']} was made from this input and config[/bold]", highlight=False
        )
        console.print(f"(LATEST names version {published['version']}; 0 files copied)", highlight=False)
    else:
        console.print(f"\n[bold]Dataset published to {published['url']}[/bold]", highlight=False)
        console.print(
            f"({published['copied']} files copied, {published['skipped']} already there; built in {summary['output']})",
            highlight=False,
        )
    if published.get("deleted"):
        console.print(f"deleted old versions (keep_versions): {', '.join(published['deleted'])}", highlight=False)
    console.print(
        f"{summary['shards']} shards ({summary['shards_reused']} reused), "
        f"{summary['documents_in']:,} documents in, {summary['documents_out']:,} tokenized, "
        f"{summary['documents_rejected']:,} rejected, {summary['tokens']:,} tokens"
    )
    for reason in summary.get("shards_redone", []):
        console.print(f"[yellow]redone:[/yellow] {reason}", highlight=False)
    for why in summary.get("files_rejected", []):
        console.print(f"[yellow]quarantined:[/yellow] {why}", highlight=False)
    if mix := summary.get("mix"):  # a row per source; the splits of all of them below
        from tokenmill.stages.report import summary_rows

        rows = summary_rows(mix)
        cells = [[f"{v:,}" if isinstance(v, int) else str(v) for v in row.values()] for row in rows]
        print_table(list(rows[0]), cells, title=f"the mix: {mix['total_tokens']:,} {mix['split']} tokens drawn")
    # Metrics down, splits across: stays readable in 80 columns, however many stats there are.
    everything = {"documents": summary["documents_out"], "tokens": summary["tokens"], "packing": summary["packing"]}
    columns = {**({} if mix else summary["splits"]), "all": everything}
    metrics = {
        "documents": lambda s: f"{s['documents']:,}",
        "tokens": lambda s: f"{s['tokens']:,}",
        "packed sequences": lambda s: f"{s['packing']['sequences']:,}",
        "real tokens": lambda s: f"{s['packing']['real_tokens']:,}",
        "pad tokens": lambda s: f"{s['packing']['pad_tokens']:,}",
        "utilization": lambda s: _percent(s["packing"]["utilization"]),
        "padded layout: sequences": lambda s: f"{s['packing']['padded_layout']['sequences']:,}",
        "padded layout: utilization": lambda s: _percent(s["packing"]["padded_layout"]["utilization"]),
    }
    if chats := [s for s in summary["splits"].values() if "supervised_tokens" in s]:  # conversations, pairs
        everything |= {key: sum(s[key] for s in chats) for key in ("supervised_tokens", "too_long", "tokens_cut")}
        everything["supervised_share"] = everything["supervised_tokens"] / max(1, sum(s["tokens"] for s in chats))
        metrics |= {
            "supervised tokens (loss)": _where_held("supervised_tokens", "{:,}".format),
            "supervised share": _where_held("supervised_share", _percent),
            "too long": _where_held("too_long", "{:,}".format),  # pack.too_long, or a pair's preference.too_long
            "tokens cut": _where_held("tokens_cut", "{:,}".format),
        }
    print_table(["", *columns], [[name, *(show(s) for s in columns.values())] for name, show in metrics.items()])
    if summary.get("unchanged"):
        console.print(f"whole flow: {summary['flow_seconds']} s")
    else:
        from tokenmill.stages.report import tokenize_rate

        console.print(
            f"{tokenize_rate(summary, summary['shards'])}; whole flow: {summary['flow_seconds']} s "
            f"({summary['bytes_in'] / 1e6 / summary['flow_seconds']:.2f} MB/s); largest process: "
            f"{summary['largest_process_mb']:,} MB (peak resident memory, of the flow and the Dask workers)"
        )
        if restarted := summary.get("workers_restarted_for_memory"):
            console.print(
                f"[yellow]Dask workers restarted for passing 95% of dask.memory_limit: {restarted}[/yellow] (the "
                "run's log says more; docs/troubleshooting.md)"
            )
    if link:
        console.print(f"\n[bold]The run in the Prefect UI: {link}[/bold]", highlight=False)


LOG_WIDTH = 400  # the widest a table is printed where the output is no terminal


def print_table(header: list[str], rows: list[list[str]], title: str | None = None) -> None:
    """A table with no cell cut short (Rich ends a cell that does not fit with "…": a mix's token count showed as
    "701,691,3…"): a log file (no terminal: a SLURM job's, CI's, which Rich lays out in 80 columns) gets the table
    at its full width, and a terminal too narrow for it wraps a number onto a second line rather than cut it."""
    table = Table(title=title)
    for name in header:
        table.add_column(name, overflow="fold")
    for row in rows:
        table.add_row(*row)
    if console.is_terminal:
        console.print(table)
    else:  # Rich prints no wider than its console
        full = console.measure(table, options=console.options.update_width(LOG_WIDTH)).maximum
        Console(soft_wrap=True, width=max(console.width, full)).print(table)


def _where_held(key: str, show: Callable) -> Callable[[dict], str]:
    """A metric of a split's summary that only some splits have (a split of conversations or pairs), "-" elsewhere."""
    return lambda split: show(split[key]) if key in split else "-"


def _percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction:.2%}"


@app.command()
def check(config: Path, overrides: SetOption = []) -> None:  # noqa: B006
    """Validate CONFIG.yaml and print it with every default filled in."""
    cfg = _load(config, overrides)
    console.print(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), highlight=False)


@app.command()
def rerun(
    output: Annotated[str, typer.Argument(help="The output path (local or s3://) of an earlier run.")],
    shards: Annotated[
        list[int], typer.Option("--shard", help="A shard to redo (repeatable); none: the uncommitted.")
    ] = [],  # noqa: B006
    config: Annotated[
        Path | None,
        typer.Option(
            help="The run's config: the rerun runs it, once checked to define the dataset in OUTPUT; none: the one "
            "stored in OUTPUT, on a LocalCluster, with this environment's S3 endpoint and credentials."
        ),
    ] = None,
    debug: DebugOption = False,
) -> None:
    """Redo shards of an earlier run, then validate and publish again. The run's config is read from OUTPUT, but
    for its cluster, S3 endpoints and credentials, which are this command's: whoever can write OUTPUT must not
    choose where code runs or where credentials go. With --config, nothing is taken from OUTPUT."""
    from flows.server import ensure_api
    from flows.startup import without_collector
    from tokenmill.commands.runs import load_run_config, taken_from

    given = _load(config, []) if config else None
    try:
        run_config, stored = load_run_config(output, given)
    except (OSError, ValueError) as e:
        raise _fail(str(e)) from None
    api_url = ensure_api()
    with without_collector():
        from flows.rerun import cluster_of, rerun_shards

    console.print(f"{taken_from(output, stored)}; the cluster: {cluster_of(run_config.dask)}", highlight=False)

    if not debug:
        tracebacks_off_the_terminal()
    with ends_promptly():
        try:
            state = rerun_shards(output=output, shard_ids=shards or None, config=given, return_state=True)
        except Exception as e:
            raise _fail(f"rerun failed: {failure_message(e, api_url)}") from None
        print_summary(*outcome(state, "rerun", api_url))


@app.command()
def serve(
    config: Path,
    overrides: SetOption = [],  # noqa: B006
    name: Annotated[str, typer.Option(help="Deployment name.")] = "tokenmill",
    cron: Annotated[str | None, typer.Option(help='Schedule, e.g. "0 2 * * *" (UTC); none: runs on demand.')] = None,
) -> None:
    """Serve CONFIG as Prefect deployments from this process until interrupted: `corpus-to-tokens/NAME`
    (on the cron schedule, with CONFIG as its parameter) and `rerun-shards/NAME` (for targeted reruns)."""
    cfg = _load(config, overrides)
    from flows.server import ensure_api, ui_url

    if secrets := cfg.secrets():
        raise _fail(
            f"{config}: {', '.join(secrets)}: a deployment's parameters are stored with secrets masked, so its runs "
            "would not have them. Give them in the environment `tokenmill serve` runs in (AWS_ACCESS_KEY_ID, "
            "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE), and leave them out of the config"
        )
    ui = ui_url(ensure_api())
    console.print(f"Prefect UI: {ui}; the deployments (Run, Custom run, Retry): {ui}/deployments", highlight=False)
    from prefect.deployments.runner import EntrypointType
    from prefect.runner import Runner

    from flows.main import corpus_to_tokens
    from flows.rerun import rerun_shards

    async def serving(storage: str) -> None:
        # Flows added to the runner (not deployments) run in a process spawned with this one's sys.path: a deployment
        # would run as `python -m prefect.engine`, which imports `flows` from the working directory first (a Prefect
        # project's own `flows/` package, in place of tokenmill's)
        runner = Runner(pause_on_shutdown=True)
        # Its runs' storage directory: Prefect's is made under `runner_storage` in the temporary directory, a fixed
        # name any user of the host can make first (a link there had the runner make its directory where the link
        # pointed; a directory of another user's, mode 0755, stops it starting). Ours is new, mode 0700: set as its
        # attribute, which Prefect's Runner takes no argument for (Prefect is pinned; the served test plants the link).
        runner._tmp_dir = Path(storage)
        module = EntrypointType.MODULE_PATH  # the flows are importable wherever tokenmill is installed
        parameters = {"config": cfg.model_dump(mode="json")}
        await runner.aadd_flow(corpus_to_tokens, name=name, cron=cron, parameters=parameters, entrypoint_type=module)
        # this config, never the one stored in the output (docs/security.md)
        parameters = {"output": cfg.output.path, **parameters}
        await runner.aadd_flow(rerun_shards, name=name, parameters=parameters, entrypoint_type=module)
        when = f'on "{cron}" (UTC)' if cron else "on demand"
        console.print(
            f"Serving corpus-to-tokens/{name} ({when}) and rerun-shards/{name} until Ctrl-C; a run now: "
            f"prefect deployment run 'corpus-to-tokens/{name}'",
            highlight=False,
        )
        await runner.start()

    with tempfile.TemporaryDirectory(prefix="tokenmill-serve-", ignore_cleanup_errors=True) as storage:
        run_until_interrupted(functools.partial(serving, storage))


STOP_GRACE_S = 30.0


def run_until_interrupted(serving: Callable[[], Coroutine], grace: float = STOP_GRACE_S) -> None:
    """Run the coroutine `serving()` makes until it returns or Ctrl-C stops it, for sure. As with asyncio.run, the
    first Ctrl-C cancels its task once (Prefect's runner then pauses the deployments and returns), but with Prefect's
    runner that cancellation sometimes went missing (its task group can swallow it: seen three times in one test
    run on a loaded machine, where `tokenmill serve` served on until a second Ctrl-C). So the first Ctrl-C also
    starts a timer: if the process still runs `grace` s later, it says so and exits. A second Ctrl-C raises
    KeyboardInterrupt at once."""
    running: dict = {}

    async def main() -> None:
        running.update(task=asyncio.current_task(), loop=asyncio.get_running_loop())
        await serving()

    def give_up() -> None:
        print(f"tokenmill: still running {grace:.0f} s after Ctrl-C; exiting", file=sys.stderr, flush=True)
        os._exit(0)

    def interrupted(signum, frame) -> None:
        if timer.is_alive() or "task" not in running:
            raise KeyboardInterrupt
        timer.start()
        running["loop"].call_soon_threadsafe(running["task"].cancel)

    timer = threading.Timer(grace, give_up)
    timer.daemon = True
    previous = signal.signal(signal.SIGINT, interrupted)  # asyncio.run keeps a handler that is not the default
    try:
        asyncio.run(main())
    except (KeyboardInterrupt, asyncio.CancelledError):
        console.print("stopped")
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)


@app.command()
def inspect(
    path: Annotated[
        str,
        typer.Argument(
            help="A published version, the directory of a dataset's versions "
            "(LATEST is followed), or a build directory; local or s3://."
        ),
    ],
    verify: Annotated[bool, typer.Option("--verify", help="Check every file's size and sha256.")] = False,
    doc: Annotated[
        str | None,
        typer.Option("--doc", help="A document's id: print where it came from and its text, decoded from its tokens."),
    ] = None,
) -> None:
    """Print what a published dataset holds; with --verify, check it against its manifest; with --doc, one
    document's origin and text."""
    from tokenmill.commands.verify import NotADataset, document_lines, find_documents, open_dataset, summary_lines
    from tokenmill.commands.verify import verify as check
    from tokenmill.io.storage import Planted

    try:
        dataset = open_dataset(path)
    except (NotADataset, Planted) as e:
        raise _fail(str(e)) from None
    if doc is not None:
        if not (found := find_documents(dataset, doc)):
            raise _fail(f"{dataset.store.url}: no document with id {doc!r} in its documents tables")
        for document in found:
            for line in document_lines(dataset, document):
                console.print(line, highlight=False, markup=False, emoji=False)
        return
    for line in summary_lines(dataset):
        console.print(line, highlight=False)
    if verify:
        if problems := check(dataset):
            raise _fail("verification failed:\n" + "\n".join(f"  - {p}" for p in problems))
        console.print(f"verified: all {len(dataset.manifest['files'])} files match the manifest", highlight=False)


@app.command()
def diff(
    old: Annotated[str, typer.Argument(help="A published version (or a dataset's directory: its LATEST).")],
    new: Annotated[str, typer.Argument(help="Another published version, local or s3://.")],
) -> None:
    """List the input files added, changed and removed between two published versions, and the counts' change."""
    from tokenmill.commands.verify import NotADataset, diff_lines, open_dataset

    try:
        lines = diff_lines(open_dataset(old), open_dataset(new))
    except NotADataset as e:
        raise _fail(str(e)) from None
    for line in lines:
        console.print(line, highlight=False)


@app.command()
def certs(
    directory: Annotated[Path, typer.Argument(help="Where to write them (a new directory, or one without ca.pem).")],
    host: Annotated[
        list[str], typer.Option(help="A scheduler or worker host name or IP the certificates name (repeatable).")
    ] = [],  # noqa: B006 (typer reads it)
    days: Annotated[int, typer.Option(help="How long they are valid.")] = 365,
) -> None:
    """Make the certificates of a Dask cluster that only tokenmill's processes can use (mutual TLS): an authority,
    and a certificate for the scheduler, the workers and the flow's client, each signed by it."""
    from tokenmill.commands.certs import make_certificates, usage

    try:
        written = make_certificates(directory, host, days)
    except (FileExistsError, PermissionError) as e:
        raise _fail(str(e)) from None
    console.print(f"wrote {', '.join(p.name for p in written)} in {directory}", highlight=False)
    for line in usage(directory):
        console.print(line, highlight=False, soft_wrap=True)


@server_app.command("start")
def server_start(port: Annotated[int, typer.Option(help="Port; default a free one.")] = 0) -> None:
    """Start (or find) the local Prefect server and say where its UI and API are."""
    from flows.server import running_server, start_server

    state = running_server() or start_server(port or None)
    _print_server(state)


@server_app.command("stop")
def server_stop() -> None:
    """Stop the local Prefect server tokenmill started (and wait until it has exited)."""
    from flows.server import stop_server

    console.print("stopped" if stop_server() else "no tokenmill-started server is running")


@server_app.command("status")
def server_status() -> None:
    """Say whether the local Prefect server is running, and where its UI and API are."""
    from flows.server import running_server

    if state := running_server():
        _print_server(state)
    else:
        console.print("not running (tokenmill run starts it; or tokenmill server start)")


def _print_server(state: dict) -> None:
    from flows.server import auth_file, ui_url

    console.print(f"Prefect UI: {ui_url(state['api_url'])}", highlight=False)
    console.print(f"PREFECT_API_URL={state['api_url']}", highlight=False)
    console.print(f'PREFECT_API_AUTH_STRING="$(cat {auth_file()})"  (the UI asks once for that line)', highlight=False)
    console.print(f"log: {state['log']}", highlight=False)
