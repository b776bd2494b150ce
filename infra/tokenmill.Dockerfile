# syntax=docker/dockerfile:1
# Images for infra/compose.yaml and infra/k8s/. Build from the repository root:
#
#   docker build -f infra/tokenmill.Dockerfile --target prefect-base -t tokenmill-prefect:3.8.8 .
#   docker build -f infra/tokenmill.Dockerfile --target tokenmill    -t tokenmill:0.1.0 .
#
# (infra/compose.yaml does both with `docker compose -f infra/compose.yaml build`.)
# The build context is an allow-list (infra/tokenmill.Dockerfile.dockerignore, read by BuildKit), and only the
# paths named below are copied: no key, certificate or .env reaches an image.

# Python 3.11 on Debian slim, by digest: a tag can be re-pushed, a digest cannot. The digest is the one
# public repositories pin for this tag (maribakulj/Picarones, Dockerfile); prefecthq/prefect's 3.8.8-python3.11
# image is this base plus prefect, but no public repository pins it by digest.
ARG PYTHON_IMAGE=python:3.11.13-slim@sha256:9bffe4353b925a1656688797ebc68f9c525e79b1d377a764d232182a519eeec4

# --- prefect-base: the Prefect server image -------------------------------------------------
# prefect 3.8.8 allows fastapi and SQLAlchemy releases that break it (fastapi >= 0.151: client
# calls get 422; >= 0.155: the server does not import; SQLAlchemy 2.1: cron schedules never
# create runs). Pin them.
FROM ${PYTHON_IMAGE} AS prefect-base
RUN pip install --no-cache-dir "prefect==3.8.8" "fastapi==0.150.0" "sqlalchemy[asyncio]==2.0.58" \
    && prefect version
# Not root: uid 10001, the runAsUser of infra/k8s. HOME holds PREFECT_HOME (~/.prefect); Kubernetes mounts an
# emptyDir there, since the root file system is read-only.
RUN useradd --uid 10001 --user-group --create-home --home-dir /home/tokenmill --shell /usr/sbin/nologin tokenmill
ENV HOME=/home/tokenmill
USER 10001:10001

# --- tokenmill: Prefect worker, Dask scheduler and Dask workers ------------------------------
# One environment for all of them: the Dask scheduler unpickles task graphs, so client,
# scheduler and workers must have the same Python, dask/distributed and libraries.
FROM prefect-base AS tokenmill
USER root
WORKDIR /opt/tokenmill
# Owned by root: the processes that run it cannot change the code they run.
COPY pyproject.toml README.md ./
COPY tokenmill tokenmill
COPY tasks tasks
COPY flows flows
COPY deployments deployments
COPY examples examples
RUN pip install --no-cache-dir . \
        "prefect==3.8.8" "fastapi==0.150.0" "sqlalchemy[asyncio]==2.0.58" \
        "dask[distributed]==2026.8.0" \
    && python -c "import tokenmill, distributed, bokeh; print('tokenmill image ok')" \
    && install -d -o 10001 -g 10001 out
# The pull step of deployments/prefect.yaml changes into this directory before each flow run; relative
# `out/...` outputs land in out/, the one directory here its user may write (compose mounts a volume there).
ENV TOKENMILL_ROOT=/opt/tokenmill
USER 10001:10001
