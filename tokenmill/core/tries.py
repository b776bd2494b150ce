"""A shard stage's work as a Dask task runs it: each shard of a bundle tried on its own, failures kept as values;
how tasks travel sealed (the flow's waits on its client are `tokenmill/core/client_waits.py`).

It runs on the workers, which must not import Prefect (about 1.2 s of CPU per worker, at the start of every
run), and the flow's cluster module uses it (the workers unpickle that module's plugin): it lives here, beside
the library functions it calls, not in `tasks/` or `flows/`. Standard library only.
"""

from __future__ import annotations

import pickle
import resource
import sys
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass

SHARD_RETRIES = 2  # per shard and stage, on the worker that runs it; and per Dask task, if its worker dies


@dataclass(frozen=True)
class Failed:
    """A shard's stage that failed on every try, in a Dask task's results: later stages pass it on."""

    error: str


@dataclass(frozen=True)
class EachShard:
    """A Dask task's work: `work(context, item, *args)` for each item of a bundle of shards, each tried
    1 + SHARD_RETRIES times; a shard that still fails is `Failed` and the others go on."""

    work: Callable
    context: object  # what the stage uses of the run
    args: tuple = ()
    whole_chain: bool = False  # given the bundles of every stage before: each item the tuple of a shard's results

    def __call__(self, *bundles: list) -> list:
        """The bundle's results; a shard that failed before is passed on."""
        if not self.whole_chain:
            return [item if isinstance(item, Failed) else self._tried(item) for item in bundles[0]]
        chains = zip(*bundles, strict=True)
        return [next((r for r in chain if isinstance(r, Failed)), None) or self._tried(chain) for chain in chains]

    def _tried(self, item):
        error = None
        for _ in range(1 + SHARD_RETRIES):
            try:
                return self.work(self.context, item, *self.args)
            except Exception as e:  # a shard's work is safe to run again (see tokenmill.core.commits)
                error = e
        return Failed(f"{type(error).__name__}: {error}")


@dataclass(frozen=True)
class Raised:
    """What a call on a worker raised, returned as its value (`caught`): a task that raises is logged by the worker
    with its whole traceback ("Compute Failed"), which a LocalCluster's worker prints on the run's terminal; the
    flow raises the error again itself, as the one failure."""

    error: Exception


def caught(work: Callable, *args):
    """`work(*args)`, or a `Raised` of what it raised (an error that cannot be pickled back, as its words)."""
    try:
        return work(*args)
    except Exception as e:
        try:
            pickle.dumps(e)
        except Exception:
            e = RuntimeError(f"{type(e).__name__}: {e}")
        return Raised(e)


class Sealed:
    """`work(*args, *more)`, with `work` and `args` pickled here and unpickled only where it runs. Dask's scheduler
    unpickles every task it is sent: tasks holding tokenmill's functions, config (pydantic models) and tokenizer
    made it import tokenmill's stages, pydantic, pyarrow and the encoders (0.5 s of CPU as every run starts);
    sealed, they are bytes to it, and this module (standard library only) is all it imports.

    Sealed with them is the key that signs commit markers (`tokenmill.core.signing.marker_key`), which the workers have
    no other way to get: the work runs with it."""

    def __init__(self, work: Callable, *args):
        from tokenmill.core.signing import marker_key  # in the flow's process, which imports the library anyway

        self.pickled = pickle.dumps((work, args, marker_key()), protocol=pickle.HIGHEST_PROTOCOL)
        self.__name__ = getattr(work, "__name__", type(work).__name__)  # Dask names unkeyed tasks after it

    def __call__(self, *more):
        from tokenmill.core.signing import with_marker_key  # on a worker, which runs the library's work

        work, args, key = pickle.loads(self.pickled)
        with with_marker_key(key):
            return work(*args, *(pickle.loads(m.pickled) if isinstance(m, Parcel) else m for m in more))


class Parcel:
    """A task's argument pickled here and unpickled only where the task runs (`Sealed` opens it), for the reason
    `Sealed` gives: a bundle of the plan's shards (`tokenmill.core.plan.Shard`) made the scheduler import tokenmill's
    plan, pyarrow and pydantic."""

    def __init__(self, value):
        self.pickled = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def peak_rss() -> int:
    """This process's largest resident memory so far, in bytes: Linux's VmHWM. Not ru_maxrss, which a process keeps
    from the one that started it (across exec: `tokenmill run` from a notebook holding 4 GB said 4 GB)."""
    with suppress(OSError), open("/proc/self/status", "rb") as status:
        for line in status:
            if line.startswith(b"VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
