"""deploy/compose and deploy/k8s: the files parse and every reference in them resolves.

No Docker engine or cluster runs here, so these are static checks (stdlib, pyyaml, pytest; kubectl's
offline `kustomize` when installed): mounted paths exist, healthchecks and probes are there and point
at declared ports, selectors match pod labels, and the generated ConfigMap and PrometheusRule equal
their sources. The schemas of the core Kubernetes objects are checked offline by kubernetes-validate in
test_k8s_validate.py; it has none for the prometheus-operator CRDs, so the ServiceMonitor and the
PrometheusRule are checked here by their own tests (their selectors and ports; equality with rules.yml).
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
COMPOSE_DIR = REPO / "deploy" / "compose"
COMPOSE = COMPOSE_DIR / "compose.yaml"
DOCKERFILE = COMPOSE_DIR / "Dockerfile"
K8S = REPO / "deploy" / "k8s"
TOPOLOGY = REPO / "topology" / "examples" / "web-analytics.yaml"
RULES_YML = REPO / "deploy" / "prometheus" / "rules.yml"

TOPOLOGY_IN_CONTAINER = "/etc/dpstream/topology.yaml"
DPSTREAM_SERVICES = {"worker-ingest", "worker-release", "exporter"}
COMPOSE_SERVICES = {"kafka", "redis", "prometheus", "alertmanager", "grafana"} | DPSTREAM_SERVICES
PROMETHEUS_YML = REPO / "deploy" / "prometheus" / "prometheus.yml"
# Files another part of deploy/ provides; compose mounts them by exactly these paths. The Alertmanager
# config is rendered from its template by render.sh (its webhook URLs are secrets), inside the container.
MONITORING_MOUNTS = {
    "prometheus": {"../prometheus/prometheus.yml", "../prometheus/rules.yml"},
    "alertmanager": {"../alertmanager/alertmanager.yml.tmpl", "../alertmanager/render.sh"},
}


# --------------------------------------------------------------------------------------------- compose


@functools.cache
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))


def services() -> dict[str, dict]:
    return compose()["services"]


def bind_mounts(service: dict) -> list[tuple[str, str]]:
    """(host path, container path) of a service's bind mounts (short or long syntax)."""
    mounts = []
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            if volume.get("type") == "bind":
                mounts.append((volume["source"], volume["target"]))
            continue
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/", "~")):
            mounts.append((source, target))
    return mounts


def named_volumes(service: dict) -> list[str]:
    names = []
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            if volume.get("type") == "volume":
                names.append(volume["source"])
            continue
        source = volume.split(":")[0]
        if not source.startswith((".", "/", "~")):
            names.append(source)
    return names


def command_args(service: dict) -> list[str]:
    command = service.get("command", [])
    return command.split() if isinstance(command, str) else [str(arg) for arg in command]


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def test_compose_has_the_stack():
    assert set(services()) >= COMPOSE_SERVICES


def test_every_compose_service_has_a_healthcheck():
    for name, service in services().items():
        check = service.get("healthcheck", {})
        assert check.get("test") and not check.get("disable"), f"{name}: no healthcheck"


def test_every_mounted_host_path_exists():
    """Bind mounts are relative to deploy/compose; each must exist (the monitoring configs once they are written)."""
    missing_monitoring = []
    for name, service in services().items():
        for source, _ in bind_mounts(service):
            path = (COMPOSE_DIR / source).resolve()
            if path.exists():
                continue
            if source in MONITORING_MOUNTS.get(name, set()):
                missing_monitoring.append(source)
                continue
            pytest.fail(f"service {name}: mounted host path {source} does not exist ({path})")
    if missing_monitoring:
        pytest.skip(f"not written yet by deploy/prometheus and deploy/alertmanager: {', '.join(missing_monitoring)}")


def test_named_volumes_are_declared():
    declared = set(compose().get("volumes") or {})
    for name, service in services().items():
        for volume in named_volumes(service):
            assert volume in declared, f"{name}: volume {volume} is not declared under volumes:"


def test_monitoring_services_mount_the_shared_configs():
    """Prometheus and Alertmanager read deploy/prometheus/{prometheus,rules}.yml and
    deploy/alertmanager/alertmanager.yml."""
    for name, expected in MONITORING_MOUNTS.items():
        sources = {source for source, _ in bind_mounts(services()[name])}
        assert expected <= sources, f"{name}: mounts {sorted(sources)}"
    prometheus = services()["prometheus"]
    mounts = dict(bind_mounts(prometheus))
    config = mounts["../prometheus/prometheus.yml"]
    assert f"--config.file={config}" in command_args(prometheus)
    # rules.yml sits beside prometheus.yml, so a relative `rule_files: [rules.yml]` finds it.
    assert Path(mounts["../prometheus/rules.yml"]).parent == Path(config).parent
    alertmanager = services()["alertmanager"]
    mounts = dict(bind_mounts(alertmanager))
    script = " ".join(command_args(alertmanager))
    rendered = re.search(
        rf"{re.escape(mounts['../alertmanager/render.sh'])}\s+"
        rf"{re.escape(mounts['../alertmanager/alertmanager.yml.tmpl'])}\s+(\S+)",
        script,
    )
    assert rendered, "alertmanager must render its template with render.sh before it starts"
    assert f"--config.file={rendered.group(1)}" in script
    for variable in ("DPSTREAM_PAGER_URL", "DPSTREAM_TICKET_URL"):
        assert variable in alertmanager["environment"], f"render.sh needs {variable}"


def test_prometheus_scrapes_the_compose_services():
    """deploy/prometheus/prometheus.yml's dpstream jobs target the compose services on their ports."""
    if not PROMETHEUS_YML.exists():
        pytest.skip("deploy/prometheus/prometheus.yml not written yet")
    config = yaml.safe_load(PROMETHEUS_YML.read_text(encoding="utf-8"))
    actual = {
        job["job_name"]: {target for static in job.get("static_configs", []) for target in static["targets"]}
        for job in config.get("scrape_configs", [])
    }
    expected = {
        "dpstream-worker": {
            f"worker-{role}:{flag(command_args(services()[f'worker-{role}']), '--web-port')}"
            for role in ("ingest", "release")
        },
        "dpstream-exporter": {f"exporter:{flag(command_args(services()['exporter']), '--port')}"},
    }
    wrong = {job: sorted(actual.get(job, set())) for job, targets in expected.items() if actual.get(job) != targets}
    if wrong:
        pytest.xfail(
            f"deploy/prometheus/prometheus.yml scrapes {wrong}, but compose runs "
            f"{ {job: sorted(targets) for job, targets in expected.items()} }: fix the targets there"
        )
    targets = {
        t for static in config["alerting"]["alertmanagers"] for s in static["static_configs"] for t in s["targets"]
    }
    assert targets == {"alertmanager:9093"}


def test_environment_variables_have_defaults_or_are_documented():
    """Every ${VAR} compose interpolates has a default (${VAR:-x}) or is explained in a comment of the file."""
    text = COMPOSE.read_text(encoding="utf-8")
    comments = "\n".join(line for line in text.splitlines() if line.lstrip().startswith("#"))
    code = "\n".join(line.split(" #")[0] for line in text.splitlines() if not line.lstrip().startswith("#"))
    code = code.replace("$$", "")
    used = re.findall(r"\$\{([A-Za-z_]\w*)([^}]*)\}|\$([A-Za-z_]\w*)", code)
    assert used, "compose interpolates nothing? (PROMETHEUS_URL is expected)"
    for braced, rest, bare in used:
        name = braced or bare
        has_default = rest.startswith((":-", "-"))
        assert has_default or re.search(rf"\b{name}\b", comments), f"${{{name}}} has no default and no comment"


def test_published_ports_are_unique_and_loopback_only():
    """Host ports do not collide, and every published port binds 127.0.0.1 (all of it is curator-side)."""
    seen = {}
    for name, service in services().items():
        for port in service.get("ports", []):
            spec = port if isinstance(port, str) else f"{port.get('host_ip', '')}:{port['published']}:{port['target']}"
            parts = str(spec).split(":")
            assert len(parts) == 3 and parts[0] == "127.0.0.1", f"{name}: port {spec} must be published on 127.0.0.1"
            host = (parts[0], parts[1])
            assert host not in seen, f"{name}: host port {spec} also used by {seen[host]}"
            seen[host] = name


def test_dpstream_services_run_the_image_with_the_topology():
    """Workers and exporter: built from the Dockerfile, the example topology mounted, Kafka and Redis from the env."""
    topology_text = TOPOLOGY.read_text(encoding="utf-8")
    assert "${DPSTREAM_KAFKA" in topology_text and "${DPSTREAM_REDIS" in topology_text
    for name in DPSTREAM_SERVICES:
        service = services()[name]
        build = service["build"]
        context = (COMPOSE_DIR / build["context"]).resolve()
        assert context == REPO
        assert (context / build["dockerfile"]).resolve() == DOCKERFILE
        mounts = dict(bind_mounts(service))
        assert mounts.get("../../topology/examples/web-analytics.yaml") == TOPOLOGY_IN_CONTAINER
        environment = service["environment"]
        assert environment["DPSTREAM_KAFKA"] == "kafka:9092"
        assert environment["DPSTREAM_REDIS"].startswith("redis://redis:6379")
        assert not service.get("ports"), f"{name}: the web/metrics port is curator-side: do not publish it"
        for dependency in service.get("depends_on", {}):
            assert dependency in services()


def test_worker_and_exporter_commands():
    for role in ("ingest", "release"):
        args = command_args(services()[f"worker-{role}"])
        assert args[:3] == ["dpstream", "worker", TOPOLOGY_IN_CONTAINER]
        assert flag(args, "--role") == role
        assert flag(args, "--web-bind") == "0.0.0.0", "inside the container network the port must bind 0.0.0.0"
        port = flag(args, "--web-port")
        assert port in str(services()[f"worker-{role}"]["healthcheck"]["test"])
    args = command_args(services()["exporter"])
    assert args[:2] == ["dpstream", "exporter"]
    assert flag(args, "--topology") == TOPOLOGY_IN_CONTAINER and flag(args, "--bind") == "0.0.0.0"
    assert flag(args, "--port") in str(services()["exporter"]["healthcheck"]["test"])


def test_redis_fsyncs_every_write_and_kafka_is_kraft():
    args = command_args(services()["redis"])
    assert flag(args, "--appendonly") == "yes" and flag(args, "--appendfsync") == "always"
    kafka = services()["kafka"]
    assert kafka["image"].startswith("apache/kafka")
    assert set(kafka["environment"]["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}


def test_dependencies_wait_for_healthy_services():
    for name, service in services().items():
        depends = service.get("depends_on", {})
        for dependency, condition in depends.items() if isinstance(depends, dict) else []:
            assert dependency in services(), f"{name} depends on unknown service {dependency}"
            assert condition.get("condition") == "service_healthy"


def test_dockerfile_installs_the_repository_as_non_root():
    text = DOCKERFILE.read_text(encoding="utf-8")
    assert re.search(r"^FROM python:3\.11-slim\b", text, re.M)
    assert "pip install ." in text
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and users[-1].split(":")[0] not in {"root", "0"}
    for sources in re.findall(r"^COPY\s+(.+?)\s+\S+$", text, re.M):
        for source in sources.split():
            assert (REPO / source).exists(), f"Dockerfile copies {source}, which is not in the repository"


# ------------------------------------------------------------------------------------------------ k8s


@functools.cache
def k8s_documents() -> list[tuple[str, dict]]:
    documents = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if document:
                documents.append((path.name, document))
    return documents


def of_kind(kind: str) -> list[dict]:
    return [document for _, document in k8s_documents() if document["kind"] == kind]


def named(kind: str, name: str) -> dict:
    (document,) = [d for d in of_kind(kind) if d["metadata"]["name"] == name]
    return document


def matches(selector: dict, labels: dict) -> bool:
    """Label selector semantics for matchLabels and the In / NotIn / Exists / DoesNotExist expressions."""
    match_labels = selector.get("matchLabels", selector if "matchExpressions" not in selector else {})
    if any(labels.get(key) != value for key, value in match_labels.items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
        ok = {
            "In": labels.get(key) in values,
            "NotIn": labels.get(key) not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[operator]
        if not ok:
            return False
    return True


def pod_templates() -> list[tuple[str, dict]]:
    return [(d["metadata"]["name"], d["spec"]["template"]) for d in of_kind("Deployment")]


def pods_selected_by(selector: dict) -> list[tuple[str, dict]]:
    return [(name, template) for name, template in pod_templates() if matches(selector, template["metadata"]["labels"])]


def container_ports(template: dict) -> set:
    ports = set()
    for container in template["spec"]["containers"]:
        for port in container.get("ports", []):
            ports.add(port["containerPort"])
            if "name" in port:
                ports.add(port["name"])
    return ports


def test_every_manifest_parses_and_is_listed_in_the_kustomization():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text(encoding="utf-8"))
    resources = kustomization["resources"]
    assert len(resources) == len(set(resources))
    manifests = {path.name for path in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(resources) == manifests
    for name, document in k8s_documents():
        assert document.get("apiVersion") and document.get("kind"), name
        assert document["metadata"].get("name"), name


def test_the_expected_objects_exist():
    kinds = {(d["kind"], d["metadata"]["name"]) for _, d in k8s_documents()}
    for expected in [
        ("Deployment", "dpstream-worker-ingest"),
        ("Deployment", "dpstream-worker-release"),
        ("Deployment", "dpstream-exporter"),
        ("ConfigMap", "dpstream-topology"),
        ("Service", "dpstream-worker"),  # job="dpstream-worker"
        ("Service", "dpstream-exporter"),  # job="dpstream-exporter"
        ("ServiceMonitor", "dpstream"),
        ("PodDisruptionBudget", "dpstream-worker-ingest"),
        ("PodDisruptionBudget", "dpstream-worker-release"),
        ("PrometheusRule", "dpstream"),
    ]:
        assert expected in kinds, f"missing {expected}"


def test_deployments_select_their_own_pods():
    for document in of_kind("Deployment"):
        selector = document["spec"]["selector"]
        labels = document["spec"]["template"]["metadata"]["labels"]
        assert matches(selector, labels), document["metadata"]["name"]
    for name, _template in pod_templates():
        others = [
            n
            for n, t in pod_templates()
            if n != name and matches(named("Deployment", name)["spec"]["selector"], t["metadata"]["labels"])
        ]
        assert not others, f"{name}'s selector also matches the pods of {others}"


def test_pods_are_hardened_and_sized():
    """Non-root, read-only root file system, no privilege escalation, all capabilities dropped, requests set."""
    for name, template in pod_templates():
        spec = template["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"].get("runAsUser", 1) != 0, name
        for container in spec["containers"]:
            security = container["securityContext"]
            assert security["readOnlyRootFilesystem"] is True, name
            assert security["allowPrivilegeEscalation"] is False, name
            assert "ALL" in security["capabilities"]["drop"], name
            requests = container["resources"]["requests"]
            assert requests.get("cpu") and requests.get("memory"), name
            assert container["resources"].get("limits", {}).get("memory"), name
            assert container.get("image"), name


def test_probes_hit_health_on_a_declared_port():
    for name, template in pod_templates():
        for container in template["spec"]["containers"]:
            ports = container_ports({"spec": {"containers": [container]}})
            probes = [container.get(kind) for kind in ("startupProbe", "readinessProbe", "livenessProbe")]
            assert container.get("readinessProbe") and container.get("livenessProbe"), name
            for probe in filter(None, probes):
                http = probe["httpGet"]
                assert http["path"] == "/health", name
                assert http["port"] in ports, f"{name}: probe port {http['port']} is not a container port"


def test_volumes_mounts_and_config_references_resolve():
    configmaps = {d["metadata"]["name"]: d for d in of_kind("ConfigMap")}
    for name, template in pod_templates():
        spec = template["spec"]
        volumes = {volume["name"]: volume for volume in spec.get("volumes", [])}
        for volume in volumes.values():
            if "configMap" in volume:
                configmap = configmaps.get(volume["configMap"]["name"])
                assert configmap, f"{name}: ConfigMap {volume['configMap']['name']} is not defined"
                for item in volume["configMap"].get("items", []):
                    assert item["key"] in configmap["data"], f"{name}: key {item['key']} missing"
        for container in spec["containers"]:
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in volumes, f"{name}: mount of undefined volume {mount['name']}"
            for source in container.get("envFrom", []):
                if "configMapRef" in source:
                    assert source["configMapRef"]["name"] in configmaps, name
            for variable in container.get("env", []):
                ref = variable.get("valueFrom", {}).get("configMapKeyRef")
                if ref:
                    assert ref["key"] in configmaps[ref["name"]]["data"], name


def topology_path_in(container: dict) -> str:
    args = container.get("args", [])
    return flag(args, "--topology") or next(arg for arg in args if arg.endswith(".yaml"))


def test_dpstream_containers_read_the_mounted_topology_and_env():
    env = named("ConfigMap", "dpstream-env")["data"]
    assert {"DPSTREAM_KAFKA", "DPSTREAM_REDIS"} <= set(env)
    for name, template in pod_templates():
        (container,) = template["spec"]["containers"]
        path = Path(topology_path_in(container))
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        volume = next(v for v in template["spec"]["volumes"] if v["name"] == mounts[str(path.parent)])
        assert volume["configMap"]["name"] == "dpstream-topology", name
        assert path.name in {item["path"] for item in volume["configMap"]["items"]}, name
        assert {"configMapRef": {"name": "dpstream-env"}} in container["envFrom"], name


def test_worker_roles_and_web_port():
    for role in ("ingest", "release"):
        (container,) = named("Deployment", f"dpstream-worker-{role}")["spec"]["template"]["spec"]["containers"]
        args = container["args"]
        assert args[0] == "worker" and flag(args, "--role") == role
        assert flag(args, "--web-bind") == "0.0.0.0"
        web = next(port for port in container["ports"] if port["name"] == "web")
        assert int(flag(args, "--web-port")) == web["containerPort"]
    (container,) = named("Deployment", "dpstream-exporter")["spec"]["template"]["spec"]["containers"]
    metrics = next(port for port in container["ports"] if port["name"] == "metrics")
    assert int(flag(container["args"], "--port")) == metrics["containerPort"]


def test_services_select_pods_and_target_their_ports():
    for service in of_kind("Service"):
        name = service["metadata"]["name"]
        pods = pods_selected_by(service["spec"]["selector"])
        assert pods, f"Service {name} selects no pod"
        for port in service["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            for pod_name, template in pods:
                assert target in container_ports(template), f"Service {name}: {pod_name} has no port {target}"
    worker_pods = {n for n, _ in pods_selected_by(named("Service", "dpstream-worker")["spec"]["selector"])}
    assert worker_pods == {"dpstream-worker-ingest", "dpstream-worker-release"}


def test_servicemonitor_selects_the_services_by_port_name():
    """The ServiceMonitor (a CRD: no kubernetes-validate schema) selects exactly the two Services by their labels,
    in the kustomization's namespace, and scrapes /metrics on a port name each of them declares."""
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text(encoding="utf-8"))
    (monitor,) = of_kind("ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    selected = [s for s in of_kind("Service") if matches(monitor["spec"]["selector"], s["metadata"].get("labels", {}))]
    assert {s["metadata"]["name"] for s in selected} == {"dpstream-worker", "dpstream-exporter"}
    names = monitor["spec"].get("namespaceSelector", {}).get("matchNames")
    if names:
        assert kustomization["namespace"] in names
    for endpoint in monitor["spec"]["endpoints"]:
        assert "port" in endpoint, "endpoints name their port"
        assert endpoint.get("path", "/metrics") == "/metrics"
        for service in selected:
            assert endpoint["port"] in {p.get("name") for p in service["spec"]["ports"]}, service["metadata"]["name"]


def test_a_disruption_budget_per_worker_role():
    budgets = of_kind("PodDisruptionBudget")
    for role in ("ingest", "release"):
        covering = [
            b
            for b in budgets
            if pods_selected_by(b["spec"]["selector"])
            and all(n == f"dpstream-worker-{role}" for n, _ in pods_selected_by(b["spec"]["selector"]))
        ]
        assert len(covering) == 1, f"{role}: {len(covering)} PodDisruptionBudgets"
        replicas = named("Deployment", f"dpstream-worker-{role}")["spec"]["replicas"]
        spec = covering[0]["spec"]
        assert "maxUnavailable" in spec or spec.get("minAvailable", 0) < replicas, "a budget that allows no drain"


def test_network_policies_select_pods_and_name_their_ports():
    for policy in of_kind("NetworkPolicy"):
        pods = pods_selected_by(policy["spec"]["podSelector"])
        assert pods, f"{policy['metadata']['name']} selects no pod"
        ports = set().union(*(container_ports(t) for _, t in pods))
        for rule in policy["spec"].get("ingress", []):
            for port in rule.get("ports", []):
                assert port["port"] in ports, f"{policy['metadata']['name']}: no pod port {port['port']}"


def run_generator(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(K8S / script), "--stdout"], capture_output=True, text=True, timeout=60, cwd=REPO
    )


def test_topology_configmap_equals_the_example():
    """The ConfigMap holds topology/examples/web-analytics.yaml byte for byte, and regenerating changes nothing."""
    configmap = named("ConfigMap", "dpstream-topology")
    assert configmap["data"]["topology.yaml"] == TOPOLOGY.read_text(encoding="utf-8")
    result = run_generator("gen_topology_configmap.py")
    assert result.returncode == 0, result.stderr
    assert result.stdout == (K8S / "configmap-topology.yaml").read_text(encoding="utf-8"), (
        "stale: run python deploy/k8s/gen_topology_configmap.py"
    )


@pytest.mark.skipif(
    not RULES_YML.exists(),
    reason="deploy/prometheus/rules.yml does not exist yet: the PrometheusRule is generated from it",
)
def test_prometheusrule_equals_the_prometheus_rules():
    """spec.groups is rules.yml's groups, and regenerating deploy/k8s/prometheusrule.yaml changes nothing.

    The PrometheusRule is a CRD with no kubernetes-validate schema: this equality is its check."""
    (rule,) = of_kind("PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"]["groups"] == yaml.safe_load(RULES_YML.read_text(encoding="utf-8"))["groups"]
    result = run_generator("gen_prometheusrule.py")
    assert result.returncode == 0, result.stderr
    assert result.stdout == (K8S / "prometheusrule.yaml").read_text(encoding="utf-8"), (
        "stale: run python deploy/k8s/gen_prometheusrule.py"
    )


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
def test_kustomize_builds():
    """`kubectl kustomize deploy/k8s` (offline) renders every resource into the namespace."""
    result = subprocess.run(["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    rendered = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert len(rendered) == len(k8s_documents())
    for document in rendered:
        if document["kind"] != "Namespace":
            assert document["metadata"]["namespace"] == "dpstream", document["metadata"]["name"]
