"""The deployment files parse, fit together and point at what the gateway really has:
probes at real routes, commands that are real `gateway` commands, settings that exist,
a final image stage that runs as non-root without compilers."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway import cli
from gateway.app import create_app
from gateway.settings import ENV_FIELDS, ENV_PREFIX, Settings, env_variable

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
K8S = DEPLOY / "k8s"
COMPILERS = ("gcc", "g++", "cc", "clang", "make", "build-essential", "cargo", "rustc", "gfortran")


def load_all(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def k8s_objects() -> dict[str, dict[str, Any]]:
    objects: dict[str, dict[str, Any]] = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in load_all(path):
            if doc.get("kind") != "Kustomization":
                objects[doc["kind"]] = doc
    return objects


def app_get_routes() -> set[str]:
    app = create_app(Settings.from_flat(jwt_secret="x" * 32))
    return {route.path for route in app.routes if "GET" in getattr(route, "methods", ())}


def command_handler(argv: list[str]) -> Any:
    """The handler `gateway` would run for these arguments (argparse exits on an unknown command)."""
    return cli.build_parser().parse_args(argv).handler


@pytest.fixture(scope="module")
def dockerfile_stages() -> list[dict[str, Any]]:
    text = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text())
    stages: list[dict[str, Any]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, rest = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            stages.append({"from": rest, "lines": []})
        elif stages:
            stages[-1]["lines"].append((instruction, rest.strip()))
    return stages


def test_every_yaml_file_in_deploy_parses() -> None:
    paths = sorted(DEPLOY.rglob("*.yaml"))
    assert len(paths) >= 9
    for path in paths:
        docs = load_all(path)
        assert docs and all(isinstance(doc, dict) for doc in docs), path


def test_kubernetes_has_every_object_production_needs() -> None:
    objects = k8s_objects()
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget", "Job", "CronJob", "Secret",
            "ConfigMap"} <= objects.keys()
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    for resource in kustomization["resources"]:
        assert (K8S / resource).is_file(), resource
    assert "secret.example.yaml" not in kustomization["resources"]  # real secrets come from a secret store


def test_probes_point_at_real_routes_on_a_named_port() -> None:
    deployment = k8s_objects()["Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    routes = app_get_routes()
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    port_names = {port["name"] for port in container["ports"]}
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["path"] in routes
        assert container[probe]["httpGet"]["port"] in port_names


def test_service_budget_and_autoscaler_select_the_deployment() -> None:
    objects = k8s_objects()
    deployment = objects["Deployment"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert objects["Service"]["spec"]["selector"].items() <= labels.items()
    assert objects["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"].items() <= labels.items()
    target = objects["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert objects["HorizontalPodAutoscaler"]["spec"]["minReplicas"] >= 2
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert objects["Service"]["spec"]["ports"][0]["targetPort"] in {p["name"] for p in container["ports"]}


def test_commands_are_real_gateway_commands() -> None:
    objects = k8s_objects()
    (container,) = objects["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["gateway"]
    assert command_handler(container["args"]) is cli.cmd_serve
    assert "--no-migrate" in container["args"]  # the Job migrates, once
    (job,) = objects["Job"]["spec"]["template"]["spec"]["containers"]
    assert job["command"] == ["gateway"]
    assert command_handler(job["args"]) is cli.cmd_migrate
    (prune,) = objects["CronJob"]["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert prune["command"] == ["gateway"]
    assert command_handler(prune["args"]) is cli.cmd_runs
    assert objects["CronJob"]["spec"]["concurrencyPolicy"] == "Forbid"


def test_settings_come_from_the_secret_and_the_configmap_and_all_exist() -> None:
    objects = k8s_objects()
    secret_keys = set(objects["Secret"]["stringData"])
    config = objects["ConfigMap"]["data"]
    env: dict[str, str] = dict(config)
    pods = {"Deployment": objects["Deployment"]["spec"]["template"], "Job": objects["Job"]["spec"]["template"],
            "CronJob": objects["CronJob"]["spec"]["jobTemplate"]["spec"]["template"]}
    for pod in pods.values():
        (container,) = pod["spec"]["containers"]
        assert {"configMapRef": {"name": objects["ConfigMap"]["metadata"]["name"]}} in container["envFrom"]
        for variable in container["env"]:
            ref = variable.get("valueFrom", {}).get("secretKeyRef")
            if ref is not None:
                assert ref["name"] == objects["Secret"]["metadata"]["name"]
                assert ref["key"] in secret_keys
                env[variable["name"]] = objects["Secret"]["stringData"][ref["key"]]
    deployment_env = {v["name"] for v in objects["Deployment"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert {"GATEWAY_DATABASE_URL", "GATEWAY_JWT_SECRET"} <= deployment_env
    fields = {env_variable(name) for name in ENV_FIELDS}
    assert {name for name in env if name.startswith(ENV_PREFIX)} <= fields
    settings = Settings.from_env(env)  # every value is valid
    settings.require_signing_setup()
    grace = objects["Deployment"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > settings.server.shutdown_timeout_s + 5  # + the preStop pause


def test_dockerfile_is_multi_stage_and_its_final_stage_runs_as_non_root_without_compilers(
    dockerfile_stages: list[dict[str, Any]],
) -> None:
    assert len(dockerfile_stages) >= 2
    final = dockerfile_stages[-1]
    users = [rest for instruction, rest in final["lines"] if instruction == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    for instruction, rest in final["lines"]:
        if instruction == "RUN":
            words = set(re.split(r"[\s;&|]+", rest))
            assert not words & set(COMPILERS), rest
        if instruction == "COPY" and "--from=" in rest:
            assert "/usr/bin" not in rest and "/usr/lib/gcc" not in rest, rest
    build_stage_runs = " ".join(rest for stage in dockerfile_stages[:-1] for i, rest in stage["lines"] if i == "RUN")
    assert "build-essential" in build_stage_runs  # the compilers stay behind in the build stage


def test_the_images_command_is_a_gateway_command(dockerfile_stages: list[dict[str, Any]]) -> None:
    final = dict(dockerfile_stages[-1]["lines"])
    assert json.loads(final["ENTRYPOINT"]) == ["gateway"]
    assert command_handler(json.loads(final["CMD"])) is cli.cmd_serve
    pyproject = (DEPLOY.parent / "pyproject.toml").read_text()
    assert 'gateway = "gateway.cli:main"' in pyproject
    healthcheck = final["HEALTHCHECK"]
    assert any(route in healthcheck for route in app_get_routes() if route in ("/healthz", "/readyz"))


def test_compose_runs_postgres_a_one_shot_migration_and_two_replicas_behind_a_proxy() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert services["postgres"]["image"].startswith("postgres:")
    migrate = services["migrate"]
    assert command_handler(migrate["command"]) is cli.cmd_migrate
    assert migrate["restart"] == "no"
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    replicas = [name for name, svc in services.items() if command_handler_or_none(svc.get("command")) is cli.cmd_serve]
    assert len(replicas) >= 2
    nginx = (DEPLOY / "nginx.conf").read_text()
    routes = app_get_routes()
    shutdown = Settings.from_env(services[replicas[0]]["environment"]).server.shutdown_timeout_s
    for name in replicas:
        service = services[name]
        assert "--no-migrate" in service["command"]
        assert service["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        assert re.search(rf"server {re.escape(name)}:8000\b", nginx), name
        probe = " ".join(service["healthcheck"]["test"])
        assert any(f"8000{route}'" in probe for route in routes), probe
        assert int(service["stop_grace_period"].rstrip("s")) > shutdown
    proxy = services["proxy"]
    assert "./nginx.conf:/etc/nginx/nginx.conf:ro" in proxy["volumes"]
    assert set(replicas) <= set(proxy["depends_on"])


def command_handler_or_none(argv: list[str] | None) -> Any:
    if not argv or argv[0] not in ("serve", "migrate", "seed-demo", "token"):
        return None
    return command_handler(argv)


def test_the_proxy_keeps_metrics_private_and_request_ids_flowing() -> None:
    nginx = (DEPLOY / "nginx.conf").read_text()
    assert re.search(r"location = /metrics \{\s*deny all;", nginx)
    assert "proxy_set_header X-Request-ID" in nginx
    size = re.search(r"client_max_body_size (\d+)m;", nginx)
    assert size and int(size.group(1)) * 1024 * 1024 == Settings().requests.max_body_bytes


def test_the_deployment_docs_name_real_files() -> None:
    operations = (DEPLOY.parent / "docs" / "operations.md").read_text()
    named = set(re.findall(r"deploy/[\w./-]*[\w/]", operations))
    assert {"deploy/Dockerfile", "deploy/compose.yaml", "deploy/k8s"} <= named
    for path in named:
        assert (DEPLOY.parent / path).exists(), path
