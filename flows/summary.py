"""What a run of the main flow says when it ends: its summary (the command prints it, a deployment's run returns it),
its last log lines and its summary artifact."""

from __future__ import annotations

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact

from tasks.tokenize import TokenizeTotals
from tokenmill.config import TokenmillConfig


def published_summary(config: TokenmillConfig, shards: int, totals: TokenizeTotals, run: dict, published: dict) -> dict:
    """The summary of a run that published a version (`published`: what publish returned), logged and kept as the
    run's summary artifact."""
    logger = get_run_logger()
    manifest = published["manifest"]
    summary = {
        "output": config.output.path,
        "published": published["published"],
        "shards": shards,
        "shards_reused": totals.reused,
        "shards_redone": list(totals.redone),
        "files_rejected": list(totals.files_rejected),
        **manifest["counts"],
        "splits": manifest["splits"],
        "packing": manifest["packing"],
        "mix": manifest.get("mix"),
        **run,
    }
    logger.info(
        "published %s (%s files copied, %s already there): %s documents in, %s tokenized, %s rejected, "
        "%s tokens, %s shards in %.1f s",  # the counts as the terminal's summary gives them
        published["published"]["url"],
        *(f"{n:,}" for n in (published["published"]["copied"], published["published"]["skipped"],
          summary["documents_in"], summary["documents_out"], summary["documents_rejected"], summary["tokens"], shards)),
        summary["flow_seconds"],
    )  # fmt: skip
    if deleted := published["published"]["deleted"]:
        logger.info("deleted %d old versions (output.publish.keep_versions): %s", len(deleted), ", ".join(deleted))
    create_markdown_artifact(published["report"], key="tokenmill-summary", description="Run summary")
    return summary


def unchanged_summary(config: TokenmillConfig, done: dict, seconds: float) -> dict:
    """The summary of a run over an input and config that an already published version was made from."""
    manifest, published = done["manifest"], done["published"]
    get_run_logger().info(
        "nothing to do: version %s at %s was made from this input (%d files), config and tokenizer; LATEST names it",
        manifest["version"], published["url"], len(manifest["inputs"]["files"]),
    )  # fmt: skip
    return {
        "output": config.output.path,
        "published": published,
        "unchanged": True,
        "shards": manifest["shards"],
        "shards_reused": manifest["shards"],
        "shards_redone": [],
        **manifest["counts"],
        "splits": manifest["splits"],
        "packing": manifest["packing"],
        "mix": manifest.get("mix"),
        "flow_seconds": round(seconds, 2),
    }


def restarts_said(restarted: list[dict]) -> str:
    """What a run says of its workers that their nanny restarted for memory (`flows.cluster.largest_process`)."""
    largest = max(event["rss"] for event in restarted) / 1e6
    return (
        f"Dask workers restarted by their nanny for passing 95% of dask.memory_limit: {len(restarted)} (the largest at "
        f"{largest:,.0f} MB); their tasks ran again on the workers that took their place. What bounds a worker's "
        "memory: docs/troubleshooting.md"
    )
