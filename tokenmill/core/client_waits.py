"""Waits on the flow's Dask client that end when the client can no longer answer: Dask's own blocking calls wait on
its event loop without end, and one made as a run closed its client never returned (the run never exited). Used on
the flow's side (`tasks/shards.py`, `flows/cluster.py`); in the library, beside `tries`, because the workers unpickle
`flows.cluster`'s plugin and must not import Prefect (which `tasks/` does). Takes the client as it is given: no Dask
import."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Coroutine

ALIVE_CHECK_S = 0.1  # a wait on the flow's Dask client looks this often at whether the client still runs


class Unanswered(Exception):
    """What `on_client_loop` raises where the client can no longer answer: its loop closed or stopped, or it closed."""


def loop_runs(client) -> bool:
    """Whether the client's event loop runs: a closing client's loop still settles its futures (cancelled), and what
    waits on them with it; a stopped loop settles nothing more."""
    return client.loop.asyncio_loop.is_running()


def client_runs(client) -> bool:
    """Whether `client` is connected, or reconnecting, and its event loop runs."""
    return client.status in ("running", "connecting") and loop_runs(client)


def on_client_loop(client, coroutine: Coroutine, alive: Callable[[object], bool] = loop_runs):
    """`coroutine` run on a Dask client's event loop, its result waited for here; Unanswered once `alive(client)` no
    longer holds (looked at every ALIVE_CHECK_S). Dask's own blocking calls wait on that loop without end: one made
    as a run closed its client never returned, and the run never exited."""
    try:
        pending = asyncio.run_coroutine_threadsafe(coroutine, client.loop.asyncio_loop)
    except RuntimeError:  # its loop is closed
        coroutine.close()
        raise Unanswered() from None
    while True:
        try:
            return pending.result(timeout=ALIVE_CHECK_S)
        except concurrent.futures.TimeoutError:
            if not alive(client):
                pending.cancel()
                raise Unanswered() from None
