"""The `tokenmill` command line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
import yaml
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from tokenmill.config import TokenmillConfig, load_config

app = typer.Typer(
    help="tokenmill: a raw text corpus in, training-ready tokens out (a Prefect flow on Dask).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
server_app = typer.Typer(help="The local Prefect server tokenmill starts when PREFECT_API_URL is not set.")
app.add_typer(server_app, name="server")
console = Console()

SetOption = Annotated[
    list[str],
    typer.Option("--set", help="Override a config key, e.g. --set pack.seq_len=4096 (repeatable; YAML values)."),
]


def _load(config: Path, overrides: list[str]) -> TokenmillConfig:
    try:
        return load_config(config, overrides)
    except ValidationError as e:
        lines = [f"  {'.'.join(map(str, err['loc'])) or '(top level)'}: {err['msg']}" for err in e.errors()]
        raise _fail(f"{config}: invalid configuration\n" + "\n".join(lines), code=2) from None
    except (OSError, ValueError, yaml.YAMLError) as e:
        raise _fail(f"{config}: {e}", code=2) from None


def _fail(message: str, code: int = 1) -> typer.Exit:
    console.print(f"[red]error:[/red] {message}", highlight=False)
    return typer.Exit(code)


@app.command()
def run(config: Path, overrides: SetOption = []) -> None:  # noqa: B006 (typer reads the default)
    """Run the whole flow (partition, tokenizer, tokenize, pack, validate, publish) for CONFIG.yaml."""
    cfg = _load(config, overrides)
    from flows.server import ensure_api

    api_url = ensure_api()
    console.print(f"Prefect API: {api_url.removesuffix('/api')} (UI), Dask: {cfg.dask.address or 'LocalCluster'}")
    from flows.main import corpus_to_tokens
    from flows.runtime import task_runner_for

    try:
        summary = corpus_to_tokens.with_options(task_runner=task_runner_for(cfg.dask))(config=cfg)
    except Exception as e:  # the flow's logs above hold the details; end with the reason, not a traceback
        raise _fail(f"run failed: {e}") from None
    print_summary(summary)


def print_summary(summary: dict) -> None:
    console.print(f"\n[bold]Dataset written to {summary['output']}[/bold]")
    console.print(
        f"{summary['shards']} shards ({summary['shards_reused']} reused), "
        f"{summary['documents_in']:,} documents in, {summary['documents_out']:,} tokenized, "
        f"{summary['documents_rejected']:,} rejected, {summary['tokens']:,} tokens"
    )
    table = Table(
        "split", "documents", "tokens", "sequences", "real tokens", "pad tokens", "utilization",
        "padded layout: sequences", "padded layout: utilization",
    )  # fmt: skip
    everything = {"documents": summary["documents_out"], "tokens": summary["tokens"], "packing": summary["packing"]}
    for split, s in [*summary["splits"].items(), ("all", everything)]:
        p, padded = s["packing"], s["packing"]["padded_layout"]
        table.add_row(
            split, f"{s['documents']:,}", f"{s['tokens']:,}", f"{p['sequences']:,}", f"{p['real_tokens']:,}",
            f"{p['pad_tokens']:,}", _percent(p["utilization"]), f"{padded['sequences']:,}",
            _percent(padded["utilization"]),
        )  # fmt: skip
    console.print(table)
    console.print(
        f"tokenize stage: {summary['tokenize_mb_per_s']} MB/s of input; "
        f"whole flow: {summary['flow_seconds']} s ({summary['bytes_in'] / 1e6 / summary['flow_seconds']:.2f} MB/s)"
    )


def _percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction:.2%}"


@app.command()
def check(config: Path, overrides: SetOption = []) -> None:  # noqa: B006
    """Validate CONFIG.yaml and print it with every default filled in."""
    cfg = _load(config, overrides)
    console.print(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), highlight=False)


@server_app.command("start")
def server_start(port: Annotated[int, typer.Option(help="Port; default a free one.")] = 0) -> None:
    """Start (or find) the local Prefect server and print its API URL."""
    from flows.server import running_server, start_server

    state = running_server() or start_server(port or None)
    console.print(f"PREFECT_API_URL={state['api_url']}", highlight=False)


@server_app.command("stop")
def server_stop() -> None:
    """Stop the local Prefect server tokenmill started."""
    from flows.server import stop_server

    console.print("stopped" if stop_server() else "no tokenmill-started server is running")


@server_app.command("status")
def server_status() -> None:
    """Say whether the local Prefect server is running, and where."""
    from flows.server import running_server

    state = running_server()
    console.print(f"running: {state['api_url']} (log {state['log']})" if state else "not running", highlight=False)
