"""Static checks of the deployment and infrastructure files (deployments/, infra/).

No Docker engine or Kubernetes cluster runs where these tests run, so the compose file and the
manifests are checked by their structure: they parse, they reference only what exists, every
published port is bound to 127.0.0.1, every image is pinned, and prefect.yaml is accepted by
prefect's own models and carries parameters that tokenmill's config model accepts.
Offline and fast; optional validators (a compose binary, check-jsonschema's vendored
compose-spec schema, kubernetes-validate) are used only when they are installed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
INFRA = REPO / "infra"
DEPLOYMENTS = REPO / "deployments"
COMPOSE = INFRA / "compose.yaml"
K8S = INFRA / "k8s"
K8S_OPERATOR = INFRA / "k8s-operator"
OPERATOR_CRDS = Path(__file__).resolve().parent / "schemas" / "dask-kubernetes"  # see its SOURCE.md
PREFECT_YAML = DEPLOYMENTS / "prefect.yaml"
DOCKERFILE = INFRA / "tokenmill.Dockerfile"

RERUN = "flows.rerun:rerun_shards"
POOL = "tokenmill-process"
ENTRYPOINT = "flows.main:corpus_to_tokens"
CODE_DIR = "/opt/tokenmill"  # WORKDIR of the tokenmill image; TOKENMILL_ROOT everywhere
TOKENMILL_UID = 10001  # the images' USER, the pods' runAsUser
MINIO_INIT = INFRA / "minio"  # MinIO's one-shot setup: init.sh and the tokenmill user's policy.json
MINIO_INIT_DIR = "/etc/tokenmill/minio"  # where compose and Kubernetes mount it

EXPECTED_SERVICES = {
    "postgres",
    "prefect-server",
    "prefect-worker",
    "dask-scheduler",
    "dask-worker",
    "minio",
    "minio-init",
}


def yaml_files() -> list[Path]:
    return sorted([*INFRA.rglob("*.yaml"), *INFRA.rglob("*.yml"), *DEPLOYMENTS.rglob("*.yaml")])


def load_all(path: Path) -> list:
    with path.open() as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def load_one(path: Path) -> dict:
    docs = load_all(path)
    assert len(docs) == 1, f"{path}: expected one YAML document, found {len(docs)}"
    return docs[0]


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::([-?])([^}]*))?\}")
# The variables compose refuses to start without (`${VAR:?message}`): every password, and where the certificates are.
REQUIRED = {"POSTGRES_PASSWORD", "MINIO_ROOT_PASSWORD", "TOKENMILL_S3_SECRET_KEY", "TOKENMILL_PREFECT_AUTH",
            "TOKENMILL_CERTS"}  # fmt: skip


def interpolate(value: str) -> str:
    """Compose interpolation with every variable unset: `${VAR:-default}` -> default, a required `${VAR:?message}`
    -> `<VAR>`, `$$` -> `$`."""

    def repl(m: re.Match) -> str:
        name, kind, rest = m.groups()
        assert kind, f"${{{name}}} has neither a default nor a message saying it is required"
        return rest if kind == "-" else f"<{name}>"

    return _VAR.sub(repl, value.replace("$$", "\0")).replace("\0", "$")


BUILT = {"tokenmill", "tokenmill-prefect"}  # built by infra/tokenmill.Dockerfile: no digest before the build
DIGEST = re.compile(r"^[^@\s]+:[^@\s]+@sha256:[0-9a-f]{64}$")  # name:tag@sha256:<64 hex>


def assert_pinned(image: str, where: str) -> None:
    """Pinned by digest (a tag can be re-pushed), or one of the images built here, by its version."""
    name, _, tag = image.partition("@")[0].rpartition(":")
    if name in BUILT:
        assert re.fullmatch(r"\d+(\.\d+)+", tag), f"{where}: built image {image!r} is not pinned to a version"
    else:
        assert DIGEST.match(image), f"{where}: image {image!r} is not pinned by digest (name:tag@sha256:...)"


# --- every file -----------------------------------------------------------------------------------


def test_every_yaml_file_parses():
    files = yaml_files()
    assert COMPOSE in files and PREFECT_YAML in files
    assert any(p.parent == K8S for p in files)
    for path in files:
        assert load_all(path), f"{path} is empty"


# --- compose --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict:
    return load_one(COMPOSE)


def test_compose_has_the_services(compose):
    assert EXPECTED_SERVICES <= set(compose["services"])
    assert compose["services"]["dask-worker"]["deploy"]["replicas"] == 2


def test_compose_has_no_default_password_it_refuses_to_start_without_one(compose):
    """Every password is `${VAR:?message}`: compose stops with the message where one is unset, rather than start with
    a password everyone knows. Everything else has a default; no secret is written in the file."""
    text = COMPOSE.read_text()
    interpolate(text)  # raises on a ${VAR} with neither
    required = {name for name, kind, _ in _VAR.findall(text) if kind == "?"}
    assert required == REQUIRED
    assert not [name for name, kind, _ in _VAR.findall(text) if name in REQUIRED and kind != "?"]
    secret = re.compile(r"PASSWORD|SECRET|AUTH_STRING|MC_HOST|CONNECTION_URL")
    for name, svc in compose["services"].items():
        for key, value in svc.get("environment", {}).items():
            if secret.search(key):
                assert re.search(r"<(" + "|".join(REQUIRED) + r")>", interpolate(value)), (
                    f"{name}: {key} is not required"
                )


def test_compose_depends_on_names_services_with_matching_checks(compose):
    services = compose["services"]
    for name, svc in services.items():
        deps = svc.get("depends_on", {})
        deps = {d: {"condition": "service_started"} for d in deps} if isinstance(deps, list) else deps
        for dep, spec in deps.items():
            assert dep in services, f"{name} depends on unknown service {dep!r}"
            assert dep != name
            condition = spec.get("condition", "service_started")
            if condition == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits for {dep} to be healthy; it has no healthcheck"
            elif condition == "service_completed_successfully":
                assert services[dep].get("restart", "no") == "no", f"{dep} is a one-shot job; it must not restart"
            else:
                assert condition == "service_started", f"{name}: unknown condition {condition!r}"


def test_compose_long_running_services_have_healthchecks(compose):
    for name, svc in compose["services"].items():
        if svc.get("restart", "no") != "no":
            test = svc.get("healthcheck", {}).get("test")
            assert test, f"{name} has no healthcheck"


def test_compose_ports_bound_to_loopback(compose):
    published = []
    for name, svc in compose["services"].items():
        assert svc.get("network_mode") != "host", f"{name}: host networking bypasses the port bindings"
        for port in svc.get("ports", []):
            if isinstance(port, dict):
                host_ip = port.get("host_ip")
            else:
                parts = interpolate(str(port)).split(":")
                host_ip = parts[0] if len(parts) == 3 else None
            assert host_ip == "127.0.0.1", f"{name}: port {port!r} is not bound to 127.0.0.1"
            published.append(port)
    assert len(published) >= 5  # prefect 4200, dask 8786 + 8787, minio 9000 + 9001


def test_external_clusters_keep_dasks_housekeeping_as_the_local_cluster_does(compose):
    """compose's and Kubernetes' Dask workers run with the housekeeping rates tokenmill's own LocalCluster sets
    (flows.dask_settings.HOUSEKEEPING: its profiler, tick and system monitor cost 9% of a run's CPU at Dask's defaults),
    and their schedulers with those a scheduler runs (the tick and the system monitor)."""
    from flows.dask_settings import HOUSEKEEPING

    wanted = {f"DASK_{key.upper().replace('.', '__').replace('-', '_')}": v for key, v in HOUSEKEEPING.items()}
    for_scheduler = {name: v for name, v in wanted.items() if "__WORKER__" not in name}
    assert len(wanted) == 3 and len(for_scheduler) == 2
    services = compose["services"]
    assert wanted.items() <= {k: str(v) for k, v in services["dask-worker"]["environment"].items()}.items()
    assert for_scheduler.items() <= {k: str(v) for k, v in services["dask-scheduler"]["environment"].items()}.items()
    containers = {
        c["name"]: {e["name"]: e.get("value") for e in c.get("env", [])}
        for doc in load_all(K8S / "40-dask.yaml")
        if doc["kind"] == "Deployment"
        for c in doc["spec"]["template"]["spec"]["containers"]
    }
    assert wanted.items() <= containers["worker"].items()
    assert for_scheduler.items() <= containers["scheduler"].items()


def test_external_schedulers_know_a_shards_task_is_long_as_the_local_clusters_does(compose):
    """compose's and both Kubernetes schedulers take a shard's task for long before one has ended, as tokenmill's own
    scheduler does (flows.dask_settings.SHARD_DURATIONS: else a run of two shards put both on one worker, at times):
    the variable Dask reads gives those durations, beside Dask's own."""
    import dask

    from flows.dask_settings import SHARD_DURATIONS

    name = "DASK_DISTRIBUTED__SCHEDULER__DEFAULT_TASK_DURATIONS"
    wanted = {key.rsplit(".", 1)[1]: value for key, value in SHARD_DURATIONS.items()}
    for where, settings in scheduler_dashboard_settings(compose).items():
        ((key, found),) = dask.config.collect_env({name: settings[name]})["distributed"]["scheduler"].items()
        assert key.replace("_", "-") == "default-task-durations" and found == wanted, where  # merged into Dask's


def scheduler_dashboard_settings(compose: dict) -> dict[str, dict[str, str]]:
    """The Dask settings in the environment of each scheduler infra/ starts (compose's, interpolated with every variable
    unset; Kubernetes'; the operator's), by where it is."""
    k8s = {
        c["name"]: {e["name"]: e.get("value") for e in c.get("env", [])}
        for doc in load_all(K8S / "40-dask.yaml")
        if doc["kind"] == "Deployment"
        for c in doc["spec"]["template"]["spec"]["containers"]
    }["scheduler"]
    (operator,) = [doc for p in sorted(K8S_OPERATOR.glob("*.yaml")) for doc in load_all(p)]
    operator_env = operator["spec"]["scheduler"]["spec"]["containers"][0]["env"]
    found = {
        "compose": {k: interpolate(str(v)) for k, v in compose["services"]["dask-scheduler"]["environment"].items()},
        "k8s": k8s,
        "k8s-operator": {e["name"]: e.get("value") for e in operator_env},
    }
    return {where: {k: v for k, v in env.items() if k.startswith("DASK_")} for where, env in found.items()}


ROUTES_ENV = "DASK_DISTRIBUTED__SCHEDULER__HTTP__ROUTES"
ORIGINS_ENV = "DASK_DISTRIBUTED__SCHEDULER__DASHBOARD__BOKEH_APPLICATION__ALLOW_WEBSOCKET_ORIGIN"


def test_the_schedulers_infra_starts_serve_read_only_pages_to_their_own_origin(compose):
    """Each scheduler infra/ starts has tokenmill's dashboard routes (`flows.clusters.DASHBOARD_ROUTES`: no
    `/eventstream`, no proxy, no HTTP API) and takes websockets of pages of its dashboard's port only (8787, where
    compose publishes it and `kubectl port-forward` forwards it). tests/test_security.py starts a scheduler with
    these settings and knocks."""
    import ast

    from flows.clusters import DASHBOARD_ROUTES

    for where, env in scheduler_dashboard_settings(compose).items():
        assert ast.literal_eval(env[ROUTES_ENV]) == DASHBOARD_ROUTES, where
        assert ast.literal_eval(env[ORIGINS_ENV]) == ["127.0.0.1:8787", "localhost:8787"], where


def test_compose_images_pinned(compose):
    for name, svc in compose["services"].items():
        assert "image" in svc, f"{name} has no image"
        assert_pinned(interpolate(svc["image"]), f"compose service {name}")
        if "build" in svc:
            assert (REPO / svc["build"]["dockerfile"]).is_file()


def test_compose_tokenmill_containers_agree_with_deployment(compose):
    services = compose["services"]
    worker_cmd = services["prefect-worker"]["command"]
    assert worker_cmd[:3] == ["prefect", "worker", "start"]
    assert worker_cmd[worker_cmd.index("--pool") + 1] == POOL
    for name in ("prefect-worker", "dask-worker"):
        env = services[name]["environment"]
        assert env["TOKENMILL_ROOT"] == CODE_DIR
        assert env["TOKENMILL_DASK_ADDRESS"] == "tls://dask-scheduler:8786"
        assert env["AWS_ENDPOINT_URL"] == "http://minio:9000"
    assert "prefect server start" in " ".join(services["prefect-server"]["command"])
    db_url = interpolate(services["prefect-server"]["environment"]["PREFECT_API_DATABASE_CONNECTION_URL"])
    assert db_url.startswith("postgresql+asyncpg://") and "@postgres:5432/" in db_url
    init = services["minio-init"]
    assert init["entrypoint"] == ["/bin/sh", f"{MINIO_INIT_DIR}/init.sh"] and init["volumes"] == [
        f"./minio:{MINIO_INIT_DIR}:ro"
    ]


def test_dockerfile_pins_match_the_project():
    text = DOCKERFILE.read_text()
    (base,) = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.M)
    assert DIGEST.match(base) and base.startswith("python:3.11."), base
    assert re.findall(r"^FROM (\S+)", text, re.M) == ["${PYTHON_IMAGE}", "prefect-base"]  # no other base
    assert f"WORKDIR {CODE_DIR}" in text and f"ENV TOKENMILL_ROOT={CODE_DIR}" in text
    pyproject = (REPO / "pyproject.toml").read_text()
    for pin in ('"prefect==3.8.8"', '"fastapi==0.150.0"', '"sqlalchemy[asyncio]==2.0.58"'):
        assert pin in pyproject, f"pyproject.toml no longer pins {pin}: update infra/tokenmill.Dockerfile too"
        assert pin in text, f"infra/tokenmill.Dockerfile does not pin {pin}"


def test_the_images_run_as_the_non_root_user_the_manifests_name():
    """Each stage ends as uid 10001 (numeric, so Kubernetes' runAsNonRoot can check it), the runAsUser of every
    tokenmill pod."""
    stages = re.split(r"^FROM ", DOCKERFILE.read_text(), flags=re.M)[1:]
    assert len(stages) == 2
    for stage in stages:
        users = re.findall(r"^USER (\S+)$", stage, re.M)
        assert users and users[-1] == f"{TOKENMILL_UID}:{TOKENMILL_UID}", stage.splitlines()[0]


# --- the image's build context ------------------------------------------------------------------------------------

PLANTED = ["ca-key.pem", "ca.pem", ".env", "infra/.env", "infra/certs/ca-key.pem", "infra/certs/worker-key.pem",
           "secrets/s3.txt", "server.key", "flows/leaked.key", "examples/.env", "tokenmill/secrets/token",
           "examples/certs/ca-key.pem"]  # fmt: skip


def build_context(root: Path) -> set[str]:
    """The files `docker build -f infra/tokenmill.Dockerfile <root>` sends, by docker-py's implementation of the
    .dockerignore rules (BuildKit reads the ignore file named after the Dockerfile)."""
    from docker.utils.build import exclude_paths

    ignore = (root / "infra" / "tokenmill.Dockerfile.dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in ignore if line.strip() and not line.strip().startswith("#")]
    return {p for p in exclude_paths(str(root), patterns, "infra/tokenmill.Dockerfile") if (root / p).is_file()}


def test_the_image_build_context_holds_no_key_certificate_or_env_file(tmp_path):
    """A copy of the repository with keys, certificates, .env files and a secrets/ directory planted where people
    leave them (`tokenmill certs` at the root, infra/certs, infra/.env): none is in the context, and everything
    the Dockerfile copies is."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    files = [f for f in tracked.decode().split("\0") if f and (REPO / f).is_file()]
    for f in [*files, *PLANTED]:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        if f in files:
            shutil.copyfile(REPO / f, tmp_path / f)
        else:
            (tmp_path / f).write_text("secret\n")
    context = build_context(tmp_path)
    assert not context & set(PLANTED), sorted(context & set(PLANTED))
    assert not [f for f in context if re.search(r"(\.pem|\.key|\.env)$", f)]
    copied = [src for line in re.findall(r"^COPY (?!--from)(.+)$", DOCKERFILE.read_text(), re.M)
              for src in line.split()[:-1]]  # fmt: skip
    assert copied and "." not in copied  # named paths, never the whole context
    for src in copied:
        wanted = {f for f in files if f == src or f.startswith(f"{src}/")}
        assert wanted and wanted <= context, f"{src}: {sorted(wanted - context)[:5]} not in the build context"
    assert {f.split("/")[0] for f in context} <= {*copied, "infra"}  # nothing else, but the Dockerfile itself


BUCKET = "tokenmill"
BUCKET_ACTIONS = {"s3:GetBucketLocation", "s3:ListBucket", "s3:ListBucketMultipartUploads"}
OBJECT_ACTIONS = {"s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload",
                  "s3:ListMultipartUploadParts"}  # fmt: skip


def test_tokenmills_minio_user_is_allowed_its_bucket_only():
    """policy.json allows listing the bucket and reading, writing and deleting its objects, nothing else: no
    wildcard action, no other bucket, no admin action; init.sh makes that bucket and attaches the policy to the
    user whose keys tokenmill's containers get."""
    policy = json.loads((MINIO_INIT / "policy.json").read_text())
    granted = {}
    for statement in policy["Statement"]:
        assert statement["Effect"] == "Allow" and set(statement) == {"Effect", "Action", "Resource"}
        for resource in statement["Resource"]:
            granted.setdefault(resource, set()).update(statement["Action"])
    assert granted == {f"arn:aws:s3:::{BUCKET}": BUCKET_ACTIONS, f"arn:aws:s3:::{BUCKET}/*": OBJECT_ACTIONS}
    script = (MINIO_INIT / "init.sh").read_text()
    assert f"mc mb --ignore-existing local/{BUCKET}\n" in script
    assert 'mc admin policy create local tokenmill-bucket "$here/policy.json"' in script
    assert 'mc admin user add local "$TOKENMILL_S3_ACCESS_KEY" "$TOKENMILL_S3_SECRET_KEY"' in script
    assert 'mc admin policy attach local tokenmill-bucket --user "$TOKENMILL_S3_ACCESS_KEY"' in script


def test_compose_gives_minios_root_credentials_to_minio_and_its_setup_only(compose):
    """tokenmill's containers hold the bucket-only user's keys; MINIO_ROOT_* reach MinIO and minio-init alone."""
    services = compose["services"]
    for name, svc in services.items():
        env = {k: interpolate(str(v)) for k, v in svc.get("environment", {}).items()}
        root = [k for k in env if "<MINIO_ROOT_PASSWORD>" in env[k]]
        assert bool(root) == (name in {"minio", "minio-init"}), name
    for name in ("prefect-worker", "dask-worker"):
        env = {k: interpolate(str(v)) for k, v in services[name]["environment"].items()}
        assert (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]) == ("tokenmill", "<TOKENMILL_S3_SECRET_KEY>")
    init = {k: interpolate(v) for k, v in services["minio-init"]["environment"].items()}
    assert (init["TOKENMILL_S3_ACCESS_KEY"], init["TOKENMILL_S3_SECRET_KEY"]) == (
        "tokenmill",
        "<TOKENMILL_S3_SECRET_KEY>",
    )


def _compose_binary() -> list[str] | None:
    for cmd in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(cmd[0]):
            try:
                out = subprocess.run([*cmd, "version"], capture_output=True, text=True, timeout=20)
            except (OSError, subprocess.TimeoutExpired):
                continue
            if out.returncode == 0 and re.search(r"v2\.", out.stdout):
                return cmd
    return None


def test_compose_config_with_real_compose_if_installed():
    cmd = _compose_binary()
    if cmd is None:
        pytest.skip("no Compose v2 binary (docker compose / docker-compose) installed")
    env = os.environ | {name: "placeholder" for name in REQUIRED}
    out = subprocess.run([*cmd, "-f", str(COMPOSE), "config", "--quiet"], capture_output=True, text=True, timeout=60,
                         env=env)  # fmt: skip
    assert out.returncode == 0, out.stderr


def test_compose_against_compose_spec_schema_if_installed(compose):
    pytest.importorskip("check_jsonschema")
    import importlib.resources

    import jsonschema

    schema_file = importlib.resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    schema = json.loads(schema_file.read_text())
    jsonschema.validate(compose, schema)


# --- prefect.yaml ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prefect_project() -> dict:
    return load_one(PREFECT_YAML)


def deployment(prefect_project: dict, entrypoint: str) -> dict:
    matches = [d for d in prefect_project["deployments"] if d.get("entrypoint") == entrypoint]
    assert len(matches) == 1
    return matches[0]


@pytest.fixture(scope="module")
def nightly(prefect_project) -> dict:
    return deployment(prefect_project, ENTRYPOINT)


def test_prefect_yaml_nightly_deployment(prefect_project, nightly):
    assert nightly["entrypoint"] == ENTRYPOINT
    assert nightly["work_pool"]["name"] == POOL
    from prefect.flows import load_flow_from_entrypoint

    assert load_flow_from_entrypoint(ENTRYPOINT).name == "corpus-to-tokens"  # a module path: importable anywhere
    pull = nightly.get("pull", prefect_project.get("pull"))
    assert pull == [{"prefect.deployments.steps.set_working_directory": {"directory": "{{ $TOKENMILL_ROOT }}"}}]
    assert list(nightly["parameters"]) == ["config"]


def test_prefect_yaml_accepted_by_prefect_deploy_model(prefect_project):
    models = pytest.importorskip("prefect.cli.deploy._models")  # what `prefect deploy` validates with
    model = models.PrefectYamlModel.model_validate(prefect_project)
    assert [(d.name, d.entrypoint) for d in model.deployments] == [("nightly", ENTRYPOINT), ("nightly", RERUN)]


def test_prefect_yaml_rerun_shards_deployment_redoes_the_nightly_dataset(prefect_project, nightly):
    """As `tokenmill serve` does: `rerun-shards/nightly` beside `corpus-to-tokens/nightly`, on the same pool,
    pointed at the nightly run's output with the nightly config (so nothing is taken from the output), on demand."""
    rerun = deployment(prefect_project, RERUN)
    assert rerun["name"] == nightly["name"] and rerun["work_pool"] == nightly["work_pool"]
    config = nightly["parameters"]["config"]
    assert rerun["parameters"] == {"output": config["output"]["path"], "shard_ids": None, "config": config}
    assert not rerun.get("schedules")
    from flows.rerun import rerun_shards
    from tokenmill.config import TokenmillConfig

    validated = rerun_shards.validate_parameters(rerun["parameters"])  # as the server will
    assert validated == rerun["parameters"] | {"config": TokenmillConfig.model_validate(config)}


def test_prefect_yaml_cron_schedule_is_valid(nightly):
    schedules_mod = pytest.importorskip("prefect.client.schemas.schedules")
    assert nightly["schedules"], "no schedule"
    for item in nightly["schedules"]:
        assert item.get("active", True) is True
        schedule = schedules_mod.CronSchedule(cron=item["cron"], timezone=item.get("timezone"))
        assert schedule.timezone == "UTC"


def test_prefect_yaml_parameters_validate_against_config_model(nightly):
    config_mod = pytest.importorskip("tokenmill.config")
    config = config_mod.TokenmillConfig.model_validate(nightly["parameters"]["config"])
    # The deployment runs the demo (examples/demo.yaml) into its own output directory.
    demo_file = REPO / "examples" / "demo.yaml"
    if demo_file.exists():
        demo = config_mod.TokenmillConfig.model_validate(yaml.safe_load(demo_file.read_text()))
        assert config.model_dump(exclude={"output"}) == demo.model_dump(exclude={"output"}), (
            "deployments/prefect.yaml's config drifted from examples/demo.yaml"
        )


# --- kubernetes -----------------------------------------------------------------------------------

CLUSTER_SCOPED = {"Namespace"}
WORKLOADS = {"Deployment", "StatefulSet", "Job", "DaemonSet"}


@pytest.fixture(scope="module")
def manifests() -> list[tuple[str, dict]]:
    docs = [(p.name, doc) for p in sorted(K8S.glob("*.yaml")) for doc in load_all(p)]
    assert docs
    return docs


def _pod_specs(manifests):
    for fname, doc in manifests:
        if doc["kind"] in WORKLOADS:
            yield fname, doc, doc["spec"]["template"]


def test_k8s_manifests_have_identity(manifests):
    seen = set()
    for fname, doc in manifests:
        assert doc.get("apiVersion"), f"{fname}: no apiVersion"
        assert doc.get("kind"), f"{fname}: no kind"
        name = doc.get("metadata", {}).get("name")
        assert name, f"{fname}: {doc['kind']} has no metadata.name"
        if doc["kind"] not in CLUSTER_SCOPED:
            assert doc["metadata"].get("namespace") == "tokenmill", f"{fname}: {doc['kind']}/{name} namespace"
        key = (doc["kind"], name)
        assert key not in seen, f"duplicate {key}"
        seen.add(key)
    kinds = {k for k, _ in seen}
    assert {"Namespace", "Service", "Deployment", "StatefulSet", "Job"} <= kinds


def test_k8s_images_pinned_and_selectors_match(manifests):
    for fname, doc, template in _pod_specs(manifests):
        labels = template["metadata"]["labels"]
        if "selector" in doc["spec"]:
            for key, value in doc["spec"]["selector"]["matchLabels"].items():
                assert labels.get(key) == value, f"{fname}: {doc['metadata']['name']} selector != pod labels"
        for c in template["spec"]["containers"]:
            assert_pinned(c["image"], f"{fname}: container {c['name']}")


def test_k8s_services_reach_named_ports(manifests):
    pods = [(template["metadata"]["labels"], template["spec"]) for _, _, template in _pod_specs(manifests)]
    for fname, doc in manifests:
        if doc["kind"] != "Service":
            continue
        selector = doc["spec"]["selector"]
        targets = [spec for labels, spec in pods if all(labels.get(k) == v for k, v in selector.items())]
        assert targets, f"{fname}: Service {doc['metadata']['name']} selects no pod"
        port_names = {p["name"] for spec in targets for c in spec["containers"] for p in c.get("ports", [])}
        for port in doc["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            if isinstance(target, str):
                assert target in port_names, f"{fname}: targetPort {target!r} is not a container port name"


_K8S_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")  # $(VAR) expansion in env values, command, args


def test_k8s_env_references_are_defined_first(manifests):
    for fname, _, template in _pod_specs(manifests):
        for c in template["spec"]["containers"]:
            defined = set()
            for var in c.get("env", []):
                for ref in _K8S_REF.findall(str(var.get("value", ""))):
                    assert ref in defined, f"{fname}: {c['name']} uses $({ref}) before defining it"
                defined.add(var["name"])
            for ref in _K8S_REF.findall(" ".join(c.get("command", []) + c.get("args", []))):
                assert ref in defined, f"{fname}: {c['name']} command uses undefined $({ref})"


def test_k8s_tokenmill_containers_agree_with_deployment(manifests):
    by_name = {doc["metadata"]["name"]: template for _, doc, template in _pod_specs(manifests)}
    worker = by_name["prefect-worker"]["spec"]["containers"][0]
    assert worker["command"][worker["command"].index("--pool") + 1] == POOL
    env = {e["name"]: e.get("value") for e in worker["env"]}
    assert env["TOKENMILL_ROOT"] == CODE_DIR
    assert env["PREFECT_API_URL"] == "http://prefect-server:4200/api"
    assert env["TOKENMILL_DASK_ADDRESS"] == "tls://dask-scheduler:8786"
    assert by_name["dask-worker"]["spec"]["containers"][0]["command"][2] == "tls://dask-scheduler:8786"


# --- locked down: Dask over mutual TLS, the Prefect server behind basic auth, k8s NetworkPolicies ---------------

TLS_FLAGS = ("--tls-ca-file", "--tls-cert", "--tls-key")
CLIENT_TLS = ("DASK_DISTRIBUTED__COMM__TLS__CA_FILE", "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT",
              "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY")  # fmt: skip


def role_files(role: str) -> list[str]:
    """The files of `tokenmill certs` a process of `role` shows, in TLS_FLAGS' order."""
    from tokenmill.commands.certs import ROLES

    assert role in ROLES
    return ["ca.pem", f"{role}.pem", f"{role}-key.pem"]


def tls_paths(command: list[str]) -> list[str]:
    return [command[command.index(flag) + 1] for flag in TLS_FLAGS]


def test_compose_dask_speaks_only_mutual_tls_each_process_with_its_own_certificate(compose):
    """The scheduler listens for TLS only; it, each worker and the flow's client (the Prefect worker's flows) show
    their own certificate from `tokenmill certs infra/certs`, mounted read-only, and no container mounts another
    role's key."""
    services = compose["services"]

    def mounted(name: str) -> dict[str, str]:
        """Path in the container -> file of infra/certs, for the certificates a service mounts."""
        volumes = [interpolate(v).split(":") for v in services[name].get("volumes", [])]
        volumes = [v for v in volumes if v[0].startswith("<TOKENMILL_CERTS>/")]
        assert all(v[2:] == ["ro"] for v in volumes), name
        return {v[1]: v[0].removeprefix("<TOKENMILL_CERTS>/") for v in volumes}

    scheduler, worker = services["dask-scheduler"]["command"], services["dask-worker"]["command"]
    assert scheduler[scheduler.index("--protocol") + 1] == "tls" and worker[2] == "tls://dask-scheduler:8786"
    for name, command, role in (("dask-scheduler", scheduler, "scheduler"), ("dask-worker", worker, "worker")):
        paths = tls_paths(command)
        assert [mounted(name)[p] for p in paths] == role_files(role) and len(mounted(name)) == 3, name
        assert services[name]["environment"]["DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION"] == "True", name
    client = services["prefect-worker"]["environment"]
    assert client["DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION"] == "True"
    assert [mounted("prefect-worker")[client[k]] for k in CLIENT_TLS] == role_files("client")
    assert len(mounted("prefect-worker")) == 3
    assert not any(mounted(name) for name in EXPECTED_SERVICES - {"dask-scheduler", "dask-worker", "prefect-worker"})


def test_k8s_dask_speaks_only_mutual_tls_each_process_with_its_own_certificate(manifests):
    """As in compose, from Secret tokenmill-dask-tls: each pod mounts only its role's certificate and key."""
    by_name = {doc["metadata"]["name"]: template["spec"] for _, doc, template in _pod_specs(manifests)}

    def mounted(name: str) -> dict[str, str]:
        """Path in the container -> key of Secret tokenmill-dask-tls."""
        spec = by_name[name]
        volumes = {v["name"]: v["secret"] for v in spec.get("volumes", []) if v.get("secret", {}).get("secretName")
                   == "tokenmill-dask-tls"}  # fmt: skip
        mounts = [m for c in spec["containers"] for m in c.get("volumeMounts", []) if m["name"] in volumes]
        assert all(m.get("readOnly") for m in mounts), name
        return {f"{m['mountPath']}/{item['path']}": item["key"] for m in mounts for item in volumes[m["name"]]["items"]}

    scheduler = by_name["dask-scheduler"]["containers"][0]
    worker = by_name["dask-worker"]["containers"][0]
    assert scheduler["command"][scheduler["command"].index("--protocol") + 1] == "tls"
    assert worker["command"][2] == "tls://dask-scheduler:8786"
    for name, container, role in (("dask-scheduler", scheduler, "scheduler"), ("dask-worker", worker, "worker")):
        assert [mounted(name)[p] for p in tls_paths(container["command"])] == role_files(role)
        assert len(mounted(name)) == 3, name
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION"] == "True", name
    client = by_name["prefect-worker"]["containers"][0]
    env = {e["name"]: e.get("value") for e in client["env"]}
    assert env["DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION"] == "True"
    assert [mounted("prefect-worker")[env[k]] for k in CLIENT_TLS] == role_files("client")
    assert not any(mounted(n) for n in by_name if n not in ("dask-scheduler", "dask-worker", "prefect-worker"))


def test_the_prefect_server_asks_for_basic_auth_and_its_worker_has_it(compose, manifests):
    """Compose and k8s: the server's PREFECT_SERVER_API_AUTH_STRING and the Prefect worker's
    PREFECT_API_AUTH_STRING are the same value (a variable with a default, a Secret's key); the health checks use
    /api/health, which Prefect serves without auth."""
    services = compose["services"]
    server, worker = services["prefect-server"]["environment"], services["prefect-worker"]["environment"]
    assert server["PREFECT_SERVER_API_AUTH_STRING"] == worker["PREFECT_API_AUTH_STRING"]
    assert interpolate(server["PREFECT_SERVER_API_AUTH_STRING"]) == "<TOKENMILL_PREFECT_AUTH>"
    assert "PREFECT_API_AUTH_STRING" not in services["dask-worker"]["environment"]  # it never calls the server
    assert "/api/health" in " ".join(services["prefect-server"]["healthcheck"]["test"])
    by_name = {doc["metadata"]["name"]: template["spec"] for _, doc, template in _pod_specs(manifests)}

    def secret(name: str, variable: str) -> dict:
        (var,) = [e for e in by_name[name]["containers"][0]["env"] if e["name"] == variable]
        return var["valueFrom"]["secretKeyRef"]

    assert secret("prefect-server", "PREFECT_SERVER_API_AUTH_STRING") == secret(
        "prefect-worker", "PREFECT_API_AUTH_STRING"
    )
    probes = by_name["prefect-server"]["containers"][0]
    assert all(
        probes[p]["httpGet"]["path"] == "/api/health" for p in ("startupProbe", "readinessProbe", "livenessProbe")
    )


def test_k8s_network_policies_let_each_pod_reach_and_be_reached_by_only_what_it_uses(manifests):
    """Ingress and egress are denied to every pod of the namespace; then each service is allowed in from the pods
    that use it only, and each pod out to the services it uses only (at their port, where it is fixed), and to the
    cluster's DNS: no pod reaches anything outside tokenmill, so a Dask worker cannot send data anywhere but MinIO."""
    policies = {doc["metadata"]["name"]: doc["spec"] for _, doc in manifests if doc["kind"] == "NetworkPolicy"}
    assert policies.pop("default-deny") == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    dns = policies.pop("allow-dns")
    assert dns["podSelector"] == {} and dns["policyTypes"] == ["Egress"]
    ((peer,),) = [rule["to"] for rule in dns["egress"]]
    assert peer == {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}  # fmt: skip
    assert [p["port"] for rule in dns["egress"] for p in rule["ports"]] == [53, 53]

    def pods(peers: list[dict]) -> set[str]:
        assert all(set(peer) == {"podSelector"} for peer in peers), peers  # this namespace's pods only
        return {peer["podSelector"]["matchLabels"]["app.kubernetes.io/name"] for peer in peers}

    allowed_in, allowed_out = {}, {}
    for name, spec in policies.items():
        assert spec["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": name}
        assert "Egress" in spec["policyTypes"] and ("Ingress" in spec["policyTypes"]) == ("ingress" in spec)
        if "ingress" in spec:
            allowed_in[name] = pods([peer for rule in spec["ingress"] for peer in rule["from"]])
        allowed_out[name] = {
            (target, tuple(p["port"] for p in rule.get("ports", [])))
            for rule in spec["egress"]
            for target in pods(rule["to"])
        }
    assert allowed_in == {
        "dask-scheduler": {"prefect-worker", "dask-worker"},
        "dask-worker": {"dask-scheduler", "dask-worker", "prefect-worker"},
        "prefect-server": {"prefect-worker"},
        "postgres": {"prefect-server"},
        "minio": {"prefect-worker", "dask-worker", "minio-create-bucket"},
    }
    any_port = ()  # the Dask workers listen on ports of their own choosing
    assert allowed_out == {
        "dask-scheduler": {("dask-worker", any_port)},
        "dask-worker": {("dask-scheduler", (8786,)), ("dask-worker", any_port), ("minio", (9000,))},
        "prefect-server": {("postgres", (5432,))},
        "prefect-worker": {
            ("prefect-server", (4200,)),
            ("dask-scheduler", (8786,)),
            ("dask-worker", any_port),
            ("minio", (9000,)),
        },
        "postgres": set(),
        "minio": set(),
        "minio-create-bucket": {("minio", (9000,))},
    }
    workloads = {template["metadata"]["labels"]["app.kubernetes.io/name"] for _, _, template in _pod_specs(manifests)}
    assert set(allowed_out) == workloads  # every pod has its egress named


def _all_pods(manifests, operator_docs):
    """(where, pod spec) of every pod infra/k8s and infra/k8s-operator make."""
    for fname, doc, template in _pod_specs(manifests):
        yield f"{fname}: {doc['metadata']['name']}", template["spec"]
    cluster = operator_docs["DaskCluster"]["spec"]
    for part in ("scheduler", "worker"):
        yield f"k8s-operator: {part}", cluster[part]["spec"]


def test_every_pod_runs_unprivileged_on_a_read_only_root(manifests, operator_docs):
    """Every pod: not root (a numeric uid: 10001 for tokenmill's images and MinIO's, the image's own postgres 999),
    seccomp RuntimeDefault; every container: a read-only root file system, no privilege escalation, no capability.
    What must be writable is a volume: /tmp everywhere, HOME for tokenmill's images (PREFECT_HOME), PostgreSQL's
    socket directory and data, MinIO's data (fsGroup makes the data volumes the pod's group's)."""
    writable = {
        "postgres": {"/tmp", "/var/run/postgresql", "/var/lib/postgresql/data"},
        "minio": {"/tmp", "/data"},
        "minio-create-bucket": {"/tmp"},
    }
    for where, pod in _all_pods(manifests, operator_docs):
        context = pod["securityContext"]
        uid = 999 if where.endswith("postgres") else TOKENMILL_UID
        assert context["runAsNonRoot"] is True and context["runAsUser"] == uid, where
        assert context["runAsGroup"] == context["fsGroup"] == uid, where
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}, where
        volumes = {v["name"]: v for v in pod["volumes"]}
        for c in pod["containers"]:
            assert c["securityContext"] == {
                "allowPrivilegeEscalation": False,
                "readOnlyRootFilesystem": True,
                "capabilities": {"drop": ["ALL"]},
            }, where
            mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
            name = where.rsplit(" ", 1)[-1]
            needed = writable.get(name, {"/tmp", "/home/tokenmill"})
            assert needed <= set(mounts), f"{where}: {needed - set(mounts)} not writable"
            for path in needed:  # an emptyDir, or the StatefulSet's claim
                assert mounts[path] not in volumes or "emptyDir" in volumes[mounts[path]], (where, path)


def test_k8s_gives_minios_root_credentials_to_minio_and_its_setup_only(manifests):
    """Secret tokenmill-minio-root reaches MinIO and the bucket job only; the Prefect worker and the Dask workers get
    Secret tokenmill-s3, the user the job makes and allows the bucket only (its script and policy from ConfigMap
    tokenmill-minio-init, made from infra/minio/)."""
    by_name = {doc["metadata"]["name"]: template["spec"] for _, doc, template in _pod_specs(manifests)}

    def secrets(name: str) -> dict[str, tuple[str, str]]:
        env = [
            e for c in by_name[name]["containers"] for e in c.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})
        ]
        return {e["name"]: tuple(e["valueFrom"]["secretKeyRef"][k] for k in ("name", "key")) for e in env}

    holders = {name for name in by_name if any(s == "tokenmill-minio-root" for s, _ in secrets(name).values())}
    assert holders == {"minio", "minio-create-bucket"}
    for name in ("prefect-worker", "dask-worker"):
        assert secrets(name)["AWS_ACCESS_KEY_ID"] == ("tokenmill-s3", "AWS_ACCESS_KEY_ID")
        assert secrets(name)["AWS_SECRET_ACCESS_KEY"] == ("tokenmill-s3", "AWS_SECRET_ACCESS_KEY")
    job = by_name["minio-create-bucket"]
    assert secrets("minio-create-bucket")["TOKENMILL_S3_SECRET_KEY"] == ("tokenmill-s3", "AWS_SECRET_ACCESS_KEY")
    (container,) = job["containers"]
    assert container["command"] == ["/bin/sh", f"{MINIO_INIT_DIR}/init.sh"]
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == MINIO_INIT_DIR]
    assert {v["name"]: v for v in job["volumes"]}[mount["name"]]["configMap"] == {"name": "tokenmill-minio-init"}


# --- the key the flow runs sign what they store with ---------------------------------------------------------------

STATE_KEY = "TOKENMILL_STATE_KEY"  # tokenmill.core.signing.KEY_ENV: the file holding the key
STATE_KEY_SECRET = "tokenmill-state-key"


def runs_flows(command: list[str]) -> bool:
    """Whether a container starts a Prefect worker: its flow runs execute in it, and sign with the state key."""
    return command[:3] == ["prefect", "worker", "start"]


def test_compose_flows_sign_with_a_key_from_a_secret_that_outlasts_the_container(compose):
    """The Prefect worker's flow runs read the state key (`TOKENMILL_STATE_KEY`) from the secret tokenmill-state-key,
    which compose makes from TOKENMILL_STATE_KEY_HEX: a file owned by the container's user and readable by it only,
    as `tokenmill.core.signing.state_key` takes it. A key made in the container would be new in each container. No
    other container holds it: the Dask workers get a key for commit markers only, with each task."""
    from tokenmill.core.signing import KEY_ENV

    assert KEY_ENV == STATE_KEY
    services = compose["services"]
    assert {name for name, svc in services.items() if runs_flows(svc.get("command", []))} == {"prefect-worker"}
    assert compose["secrets"] == {STATE_KEY_SECRET: {"environment": "TOKENMILL_STATE_KEY_HEX"}}
    for name, svc in services.items():
        given = [s for s in svc.get("secrets", []) if (s if isinstance(s, str) else s["source"]) == STATE_KEY_SECRET]
        if not runs_flows(svc.get("command", [])):
            assert not given and STATE_KEY not in svc.get("environment", {}), f"{name} holds the state key"
            continue
        (secret,) = given
        assert (secret["uid"], secret["gid"], secret["mode"]) == (str(TOKENMILL_UID), str(TOKENMILL_UID), 0o400)
        assert svc["environment"].get(STATE_KEY) == secret["target"], f"{name}: {STATE_KEY} is not the secret's file"


def test_k8s_flows_sign_with_a_key_from_a_secret_that_outlasts_the_pod(manifests, operator_docs):
    """In every pod that runs flows (a Prefect worker's), `TOKENMILL_STATE_KEY` names the file of Secret
    tokenmill-state-key's key `state-key`, mounted read-only, root's and readable by the pod's group only (mode 0400,
    which fsGroup makes 0440), as `state_key` takes it. Not optional: without the Secret the pod does not start,
    rather than make a key of its own in its emptyDir HOME (each new pod would make every shard again). No other pod
    (Dask's, fixed or the operator's) holds the key."""
    flows = []
    for where, pod in _all_pods(manifests, operator_docs):
        secrets = {v["name"]: v["secret"] for v in pod.get("volumes", []) if "secret" in v}
        keyed = {name for name, secret in secrets.items() if secret["secretName"] == STATE_KEY_SECRET}
        for c in pod["containers"]:
            env = {e["name"]: e for e in c.get("env", [])}
            if not runs_flows(c.get("command", []) + c.get("args", [])):
                assert not keyed and STATE_KEY not in env, f"{where} holds the state key"
                continue
            flows.append(where)
            (mount,) = [m for m in c["volumeMounts"] if m["name"] in keyed]
            secret = secrets[mount["name"]]
            assert mount.get("readOnly") is True and not secret.get("optional", False), where
            assert secret["defaultMode"] == 0o400 and secret["items"] == [{"key": "state-key", "path": "state-key"}]
            assert env.get(STATE_KEY) == {"name": STATE_KEY, "value": f"{mount['mountPath']}/state-key"}, where
    assert flows == ["30-prefect-worker.yaml: prefect-worker"]


def test_the_readme_creates_every_secret_the_manifests_read(manifests, operator_docs):
    """infra/README.md's `kubectl create secret` commands make each Secret a pod reads, and no other; the state key
    as 32 random bytes in hex, under the key the Prefect worker mounts."""
    read = set()
    for _, pod in _all_pods(manifests, operator_docs):
        read |= {v["secret"]["secretName"] for v in pod.get("volumes", []) if "secret" in v}
        for c in pod["containers"]:
            read |= {e["valueFrom"]["secretKeyRef"]["name"] for e in c.get("env", []) if "secretKeyRef" in e.get(
                "valueFrom", {})}  # fmt: skip
    readme = (INFRA / "README.md").read_text()
    assert set(re.findall(r"kubectl -n tokenmill create secret generic (\S+)", readme)) == read
    assert f'create secret generic {STATE_KEY_SECRET} --from-literal=state-key="$(openssl rand -hex 32)"' in readme


def test_k8s_against_kubernetes_schemas_if_installed(manifests):
    kv = pytest.importorskip("kubernetes_validate")
    for fname, doc in manifests:
        try:
            kv.validate(doc, kv.latest_version(), strict=True)
        except kv.ValidationError as exc:
            raise AssertionError(f"{fname}: {doc['kind']}/{doc['metadata']['name']}: {exc}") from exc


# --- the dask-kubernetes operator's DaskCluster (workers on demand) ------------------------------------------------


@pytest.fixture(scope="module")
def operator_docs() -> dict[str, dict]:
    docs = {doc["kind"]: doc for p in sorted(K8S_OPERATOR.glob("*.yaml")) for doc in load_all(p)}
    assert set(docs) == {"DaskCluster"}  # no DaskAutoscaler: see test_the_operators_cluster_is_not_autoscaled
    return docs


@pytest.mark.parametrize("kind, crd", [("DaskCluster", "daskcluster.yaml")])
def test_operator_resources_match_the_operators_own_schemas(operator_docs, kind, crd):
    """Offline, against the CustomResourceDefinitions dask-kubernetes 2026.3.0 ships (the full PodSpec and
    ServiceSpec included)."""
    import jsonschema

    definition = load_one(OPERATOR_CRDS / crd)
    doc = operator_docs[kind]
    (version,) = [v for v in definition["spec"]["versions"] if f"{definition['spec']['group']}/{v['name']}" ==
                  doc["apiVersion"]]  # fmt: skip
    assert definition["spec"]["names"]["kind"] == kind
    jsonschema.validate(doc, version["schema"]["openAPIV3Schema"])


def test_the_operators_cluster_is_locked_down_as_the_fixed_one(operator_docs, manifests):
    """Its scheduler and workers speak mutual TLS with their own certificates (as k8s/40-dask.yaml), carry the
    labels k8s/60-network-policies.yaml allows, and the workers reach the Service the operator names after the
    cluster."""
    cluster = operator_docs["DaskCluster"]
    name, spec = cluster["metadata"]["name"], cluster["spec"]
    scheduler, worker = spec["scheduler"]["spec"]["containers"][0], spec["worker"]["spec"]["containers"][0]
    assert scheduler["args"][scheduler["args"].index("--protocol") + 1] == "tls"
    assert worker["args"][2] == f"tls://{name}-scheduler:8786"
    for part, container, role in (("scheduler", scheduler, "scheduler"), ("worker", worker, "worker")):
        pod = spec[part]["spec"]
        (volume,) = [v["secret"] for v in pod["volumes"] if v["name"] == "tls"]
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == "tls"]
        files = {f"{mount['mountPath']}/{item['path']}": item["key"] for item in volume["items"]}
        assert volume["secretName"] == "tokenmill-dask-tls" and mount["readOnly"]
        assert [files[p] for p in tls_paths(container["args"])] == role_files(role) and len(files) == 3
        assert spec[part]["metadata"]["labels"]["app.kubernetes.io/name"] == f"dask-{part}"
    fixed = {doc["metadata"]["name"] for _, doc in manifests if doc["kind"] == "NetworkPolicy"}
    assert {"dask-scheduler", "dask-worker"} <= fixed  # the labels above are the ones these select


def test_the_operators_cluster_is_not_autoscaled():
    """The operator's autoscaler needs the scheduler's HTTP API, which then also takes an unauthenticated
    `retire_workers` from whoever reaches the dashboard's port: no DaskAutoscaler, the API's routes not added to
    the scheduler, no policy letting the operator's namespace in, and a fixed number of workers."""
    docs = [doc for p in sorted(K8S_OPERATOR.glob("*.yaml")) for doc in load_all(p)]
    assert [doc["kind"] for doc in docs] == ["DaskCluster"]
    spec = docs[0]["spec"]
    assert spec["worker"]["replicas"] >= 1
    for part in ("scheduler", "worker"):
        for c in spec[part]["spec"]["containers"]:
            settings = " ".join([*c["args"], *(f"{e['name']}={e.get('value')}" for e in c.get("env", []))]).lower()
            assert "api_v1" not in settings and "api.v1" not in settings and ".http.scheduler.api" not in settings
