# syntax=docker/dockerfile:1
# Images for infra/compose.yaml and infra/k8s/. Build from the repository root:
#
#   docker build -f infra/tokenmill.Dockerfile --target prefect-base -t tokenmill-prefect:3.8.8 .
#   docker build -f infra/tokenmill.Dockerfile --target tokenmill    -t tokenmill:0.1.0 .
#
# (infra/compose.yaml does both with `docker compose -f infra/compose.yaml build`.)
# Files kept out of the build context: infra/tokenmill.Dockerfile.dockerignore (BuildKit).

ARG PREFECT_IMAGE=prefecthq/prefect:3.8.8-python3.11

# --- prefect-base: the Prefect server image -------------------------------------------------
# prefect 3.8.8 allows fastapi and SQLAlchemy releases that break it (fastapi >= 0.151: client
# calls get 422; >= 0.155: the server does not import; SQLAlchemy 2.1: cron schedules never
# create runs). Re-pin them whatever the upstream image happened to resolve.
FROM ${PREFECT_IMAGE} AS prefect-base
RUN uv pip install --no-cache "prefect==3.8.8" "fastapi==0.150.0" "sqlalchemy[asyncio]==2.0.58" \
    && prefect version

# --- tokenmill: Prefect worker, Dask scheduler and Dask workers ------------------------------
# One environment for all of them: the Dask scheduler unpickles task graphs, so client,
# scheduler and workers must have the same Python, dask/distributed and libraries.
FROM prefect-base AS tokenmill
WORKDIR /opt/tokenmill
COPY . .
RUN uv pip install --no-cache . \
        "prefect==3.8.8" "fastapi==0.150.0" "sqlalchemy[asyncio]==2.0.58" \
        "dask[distributed]==2026.8.0" \
    && python -c "import tokenmill, distributed, bokeh; print('tokenmill image ok')"
# The pull step of deployments/prefect.yaml changes into this directory before each flow run.
ENV TOKENMILL_ROOT=/opt/tokenmill
