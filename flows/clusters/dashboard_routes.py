"""The HTTP routes of a tokenmill scheduler's dashboard server (Dask's `distributed.scheduler.http.routes`): Dask's own
read-only pages (the info pages, JSON counts, Prometheus metrics, health, static files), without `/eventstream`, whose
websocket adds a plugin to the scheduler for anyone who opens it (it takes no credential; on a login node anyone
reaches 127.0.0.1), and without the proxy to other ports."""

from __future__ import annotations

from distributed.http.scheduler import info

routes: list[tuple] = [route for route in info.routes if route[0] != "eventstream"]
