"""deploy/kubernetes: every manifest validates against Kubernetes' own schemas, the numbers in
them agree with each other and with kael-server's drain, and the metrics the
prometheus-adapter rules and the HorizontalPodAutoscaler name are ones kael-server exports.

The schemas are the OpenAPI-derived JSON schemas the ``kubernetes-validate`` package ships
(offline), in strict mode (an unknown field is an error); the metric names are read from
``/metrics`` of the app that ``kael-server`` serves, on the bundled model.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate")
yaml = pytest.importorskip("yaml")

from kael_server.loading import load_app  # noqa: E402
from litestar.testing import TestClient  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from kael_server import limits  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "deploy" / "kubernetes"
VERSIONS = ("1.29.0", "1.37.0")
"""An older Kubernetes still commonly run (autoscaling/v2 and policy/v1 are GA there) and the
newest the validator knows."""


def resources() -> dict[str, dict[str, Any]]:
    """Every resource of every manifest, by ``kind/name``."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(MANIFESTS.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                key = f"{doc['kind']}/{doc['metadata']['name']}"
                assert key not in found, f"{key} defined twice"
                found[key] = doc
    return found


def container() -> dict[str, Any]:
    (only,) = resources()["Deployment/kael-server"]["spec"]["template"]["spec"]["containers"]
    return dict(only)


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def adapter_rules() -> list[dict[str, Any]]:
    config = yaml.safe_load(resources()["ConfigMap/prometheus-adapter"]["data"]["config.yaml"])
    return list(config["rules"])


def test_the_manifests_are_the_issues_resources() -> None:
    assert set(resources()) == {
        "Deployment/kael-server",
        "Service/kael-server",
        "PodDisruptionBudget/kael-server",
        "HorizontalPodAutoscaler/kael-server",
        "PersistentVolumeClaim/kael-weights",
        "ConfigMap/prometheus-adapter",
    }
    assert resources()["HorizontalPodAutoscaler/kael-server"]["apiVersion"] == "autoscaling/v2"


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_validates_strictly(version: str) -> None:
    for key, doc in resources().items():
        assert kubernetes_validate.validate(doc, version, strict=True), key


def test_the_validator_finds_mistakes() -> None:
    """The check above can fail: a misspelt field and a wrong type are both refused."""
    deployment = resources()["Deployment/kael-server"]
    misspelt = copy.deepcopy(deployment)
    misspelt["spec"]["template"]["spec"]["containers"][0]["readinessprobe"] = {"httpGet": {"path": "/ready"}}
    wrong_type = copy.deepcopy(deployment)
    wrong_type["spec"]["replicas"] = "two"
    for broken in (misspelt, wrong_type):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, VERSIONS[-1], strict=True)


def test_probes_resources_and_shutdown_agree_with_kael_server() -> None:
    c = container()
    pod = resources()["Deployment/kael-server"]["spec"]["template"]["spec"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    port = {p["name"]: p["containerPort"] for p in c["ports"]}["http"]
    assert port == 8000  # the Dockerfile's --port
    # CPU: as many cores as the kernels have threads (requests = limits: a guaranteed share)
    threads = int({e["name"]: e["value"] for e in c["env"]}["KAEL_NUM_THREADS"])
    assert c["resources"]["requests"]["cpu"] == c["resources"]["limits"]["cpu"] == str(threads)
    # Shutdown: preStop, then SIGTERM's drain (uvicorn's graceful shutdown, then the lifespan's
    # wait for the engine, each up to SHUTDOWN_DRAIN_SECONDS), all inside the grace period.
    pre_stop = c["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    assert pod["terminationGracePeriodSeconds"] > int(pre_stop[1]) + 2 * limits.SHUTDOWN_DRAIN_SECONDS
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["weights"]["mountPath"] == "/weights" and mounts["weights"]["readOnly"] is True
    claim = {v["name"]: v for v in pod["volumes"]}["weights"]["persistentVolumeClaim"]["claimName"]
    assert f"PersistentVolumeClaim/{claim}" in resources()


def test_service_pdb_and_hpa_select_the_deployment() -> None:
    found = resources()
    labels = found["Deployment/kael-server"]["spec"]["template"]["metadata"]["labels"]
    for key in ("Service/kael-server", "PodDisruptionBudget/kael-server"):
        selector = found[key]["spec"]["selector"]
        selector = selector.get("matchLabels", selector)
        assert selector.items() <= labels.items(), key
    assert found["Service/kael-server"]["spec"]["ports"][0]["targetPort"] == "http"
    hpa = found["HorizontalPodAutoscaler/kael-server"]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "kael-server"}
    assert found["PodDisruptionBudget/kael-server"]["spec"]["minAvailable"] < hpa["minReplicas"]


def test_the_hpa_targets_the_pods_slots_on_a_metric_the_adapter_serves() -> None:
    hpa = resources()["HorizontalPodAutoscaler/kael-server"]["spec"]
    (metric,) = hpa["metrics"]
    assert metric["type"] == "Pods"
    slots = int(flag(container()["args"], "--slots"))
    assert metric["pods"]["target"] == {"type": "AverageValue", "averageValue": str(slots)}
    served = {rule["name"]["as"] for rule in adapter_rules()}
    assert metric["pods"]["metric"]["name"] in served


def _series_names(rule: dict[str, Any]) -> set[str]:
    """The Prometheus series a rule's seriesQuery selects (bare names: ``name{...}``)."""
    query = rule["seriesQuery"]
    match = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\}", query)
    assert match, f"seriesQuery {query!r} should name its metric"
    assert 'namespace!=""' in match.group(2) and 'pod!=""' in match.group(2)
    assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}
    assert "<<.Series>>" in rule["metricsQuery"] and "<<.LabelMatchers>>" in rule["metricsQuery"]
    return {match.group(1)}


@pytest.fixture(scope="module")
def exported() -> dict[str, str]:
    """Sample names and their family types on ``/metrics`` of kael-server's app (bundled model)."""
    with TestClient(load_app(None)) as client:
        text = client.get("/metrics").text
    return {s.name: f.type for f in text_string_to_metric_families(text) for s in f.samples}


def test_the_adapter_rules_name_metrics_kael_exports(exported: dict[str, str]) -> None:
    rules = adapter_rules()
    assert len(rules) == 2
    for rule in rules:
        (series,) = _series_names(rule)
        assert series in exported, f"{series} is not on /metrics: {sorted(exported)}"
        assert exported[series] == "gauge"  # a level per pod, summed by pod: not a counter's rate
        assert re.fullmatch(rule["name"]["matches"], series)
        assert rule["name"]["as"] == series
    assert {_series_names(r).pop() for r in rules} == {"kael_requests_in_flight", "kael_queue_depth"}


def test_a_pod_whose_model_fails_to_load_is_never_ready(tmp_path: Path) -> None:
    """The readiness probe's view of a failed load: /ready stays 503 ("failed"), /health 200
    (``kael-server`` itself then exits with status 1, and the kubelet restarts the container)."""
    import shutil
    import time

    from kael_server.loading import bundled_model_dir

    broken = tmp_path / "broken"
    shutil.copytree(bundled_model_dir(), broken)
    (broken / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00not json")
    app = load_app(broken)
    with TestClient(app) as client:
        server = app.state.server
        deadline = time.monotonic() + 120
        while server.status == "loading" and time.monotonic() < deadline:  # the load's thread: no event
            time.sleep(0.05)
        assert client.get("/ready").status_code == 503
        assert client.get("/ready").json() == {"status": "failed"}
        assert client.get("/health").status_code == 200
