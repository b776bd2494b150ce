"""The Prefect flows that wire tokenmill's DAG (docs/architecture.md) and the runtime they need."""

import os

# numpy's OpenBLAS starts a thread per core as numpy is imported, which spins for 0.1 s of CPU before it sleeps, in
# each of a run's processes (the command's, the LocalCluster's, the workers' forkserver): a tenth of a core-second
# each, on a small run's start-up, which the cores bound. tokenmill multiplies no matrices. Dask sets the same for
# the workers it spawns, which workers forked from a forkserver never see. A user's own setting stays.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# Prefect's SDK sends usage events to its analytics service (Amplitude) when imported in an interactive terminal,
# as a `tokenmill run` is, unless DO_NOT_TRACK is set: runs go on clusters that allow no such traffic, and the
# server tokenmill starts has Prefect's analytics off too (`flows.server`). A user's own setting stays.
os.environ.setdefault("DO_NOT_TRACK", "1")
