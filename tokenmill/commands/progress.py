"""A terminal progress bar per stage, counting shard commit markers as they appear in the output.

It watches the output store, not Prefect or Dask, so it shows exactly what is durably done, wherever
the workers run. Used by the CLI when stdout is a terminal.
"""

from __future__ import annotations

import threading
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tokenmill.core import layout
from tokenmill.core.commits import STAGES
from tokenmill.core.plan import Plan
from tokenmill.io.storage import Store

POLL_SECONDS = 1.0
POLL_SHARE = 0.05  # listing the markers may take at most this share of the time (100,000 markers: ~1 s a listing)


def committed_counts(store: Store) -> tuple[dict[str, int], dict[str, int]]:
    """(shards committed per stage, shards expected per stage) as the output shows them now."""
    if (plan := Plan.read(store)) is None:
        return {}, {}
    inputs = len(plan.shards)
    outputs = plan.shuffled_shards or inputs
    expected = {stage: inputs if stage == "scatter" else outputs for stage in STAGES}
    done = {}
    for stage in STAGES:
        files = store.list(layout.markers(stage))
        if files:
            done[stage] = len(files)
    return done, expected


class ShardProgress:
    """Context manager: bars for the stages of the run writing to `output`, refreshed every second."""

    def __init__(self, output: str, console: Console):
        self.store = Store(output)
        self.progress = Progress(
            TextColumn("{task.description:>9}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=console, transient=False,
        )  # fmt: skip
        self.bars: dict[str, int] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def _refresh(self) -> None:
        done, expected = committed_counts(self.store)
        for stage, count in done.items():
            if stage not in self.bars:
                self.bars[stage] = self.progress.add_task(stage, total=expected[stage])
            self.progress.update(self.bars[stage], completed=count)

    def _watch(self) -> None:
        interval = POLL_SECONDS
        while not self.stop.wait(interval):
            started = time.perf_counter()
            try:
                self._refresh()
            except Exception:  # a listing racing a write: the next poll sees it
                continue
            interval = max(POLL_SECONDS, (time.perf_counter() - started) / POLL_SHARE)

    def __enter__(self) -> ShardProgress:
        self.progress.start()
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
        try:
            self._refresh()
        finally:
            self.progress.stop()
