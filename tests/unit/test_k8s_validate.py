"""deploy/k8s validated offline by kubernetes-validate against the OpenAPI schemas of Kubernetes 1.33-1.37.

Every core manifest (Namespace, ConfigMaps, Deployments, Services, PodDisruptionBudgets, NetworkPolicy) must
pass the strict schema (no unknown fields) of each of those versions, as the files stand and as
`kubectl kustomize` renders them. The library ships the schemas in the wheel; these tests block the network
to prove it needs none.

kubernetes-validate has no schemas for the prometheus-operator CRDs, so `servicemonitor.yaml` and
`prometheusrule.yaml` are checked by their own tests instead: in tests/unit/test_deploy_manifests.py,
test_servicemonitor_selects_the_services_by_port_name (it selects exactly the two Services by their labels
and scrapes a port name each declares) and test_prometheusrule_equals_the_prometheus_rules (spec.groups is
deploy/prometheus/rules.yml, and regenerating it changes nothing); here, the shape checks at the end.
"""

from __future__ import annotations

import copy
import functools
import re
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate import utils as kv_utils

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"

KUBERNETES_VERSIONS = ("1.33", "1.34", "1.35", "1.36", "1.37")
"""The versions validated (README): the five newest minors kubernetes-validate 1.37.0 ships schemas for."""

OPERATOR_API = "monitoring.coreos.com/v1"
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}
"""prometheus-operator kinds: no schema in kubernetes-validate, checked by their own tests."""


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any socket connection fails: validation must use the schemas shipped in the package."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"network access during offline validation: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@functools.cache
def manifests() -> tuple[tuple[str, dict[str, Any]], ...]:
    """(file name, document) for every resource of deploy/k8s (the kustomization itself is not one)."""
    found = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if document:
                found.append((path.name, document))
    return tuple(found)


def core() -> list[tuple[str, dict[str, Any]]]:
    return [(name, doc) for name, doc in manifests() if doc["kind"] not in CRD_KINDS]


def of_kind(kind: str) -> dict[str, Any]:
    (document,) = [doc for _, doc in manifests() if doc["kind"] == kind]
    return document


def label(name: str, document: dict[str, Any]) -> str:
    return f"{name}:{document['kind']}/{document['metadata']['name']}"


def test_the_validated_versions_are_shipped_by_the_library():
    """Each version has its own schema directory: validate() must not fall back to an older one."""
    shipped = {kv_utils.major_minor(version) for version in kv_utils.all_versions()}
    assert set(KUBERNETES_VERSIONS) <= shipped, sorted(shipped)


def test_every_resource_is_either_validated_or_a_known_crd():
    """Nothing is skipped silently: a new kind is either core (validated) or one of the two operator CRDs."""
    kinds = {doc["kind"] for _, doc in manifests()}
    assert kinds >= CRD_KINDS
    assert {doc["apiVersion"] for _, doc in manifests() if doc["kind"] in CRD_KINDS} == {OPERATOR_API}
    assert len(core()) >= 10, [label(n, d) for n, d in core()]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize(
    "name,document", [pytest.param(n, d, id=label(n, d)) for n, d in manifests() if d["kind"] not in CRD_KINDS]
)
def test_core_manifest_passes_the_strict_schema(name: str, document: dict[str, Any], version: str):
    """The manifest is valid for this Kubernetes version, unknown fields included (strict schema)."""
    try:
        validated = kubernetes_validate.validate(document, version, strict=True)
    except kubernetes_validate.ValidationError as error:
        path = ".".join(str(item) for item in error.path)
        pytest.fail(f"{label(name, document)} invalid on Kubernetes {version}: {path}: {error.message}")
    assert validated == version


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
def test_the_kustomize_output_passes_the_strict_schema():
    """What `kubectl apply -k` would send (namespace and image set by kustomize) is valid on every version."""
    result = subprocess.run(["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    rendered = [doc for doc in yaml.safe_load_all(result.stdout) if doc and doc["kind"] not in CRD_KINDS]
    assert len(rendered) == len(core())
    for version in KUBERNETES_VERSIONS:
        for document in rendered:
            assert kubernetes_validate.validate(document, version, strict=True) == version


def test_the_validator_rejects_what_it_should():
    """Not vacuous: a misspelt field, a wrong type and a missing required field all fail validation."""
    deployment = next(doc for _, doc in manifests() if doc["kind"] == "Deployment")
    misspelt = copy.deepcopy(deployment)
    misspelt["spec"]["replica"] = misspelt["spec"].pop("replicas")
    wrong_type = copy.deepcopy(deployment)
    wrong_type["spec"]["replicas"] = "two"
    no_containers = copy.deepcopy(deployment)
    del no_containers["spec"]["template"]["spec"]["containers"]
    for broken in (misspelt, wrong_type, no_containers):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[-1], strict=True)


@pytest.mark.parametrize("kind", sorted(CRD_KINDS))
def test_the_operator_crds_have_no_schema_in_kubernetes_validate(kind: str):
    """Why the CRDs have their own tests: the library knows only core kinds (if it ever ships them, use it)."""
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate(of_kind(kind), KUBERNETES_VERSIONS[-1], strict=True)


_DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")


def test_prometheusrule_shape():
    """The fields the operator's CRD requires: named groups of rules, each an alert or a record with an expr."""
    rule = of_kind("PrometheusRule")
    assert rule["metadata"]["name"] and set(rule["spec"]) == {"groups"}
    names = [group["name"] for group in rule["spec"]["groups"]]
    assert names and len(names) == len(set(names)), "group names are unique"
    for group in rule["spec"]["groups"]:
        assert group["rules"], group["name"]
        for item in group["rules"]:
            assert ("alert" in item) != ("record" in item), item
            assert isinstance(item["expr"], str) and item["expr"].strip()
            if "for" in item:
                assert _DURATION.match(item["for"]), item["for"]


def test_servicemonitor_shape():
    """A label selector and endpoints that each name a port, with operator-valid durations when set."""
    monitor = of_kind("ServiceMonitor")
    assert monitor["spec"]["selector"].get("matchLabels") or monitor["spec"]["selector"].get("matchExpressions")
    for endpoint in monitor["spec"]["endpoints"]:
        assert isinstance(endpoint["port"], str) and endpoint["port"]
        for field in ("interval", "scrapeTimeout"):
            if field in endpoint:
                assert _DURATION.match(endpoint[field]), endpoint[field]
