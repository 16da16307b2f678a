"""Every rendered object against the Kubernetes API's own schemas (kubernetes-validate,
strict: unknown fields are errors), and the custom resources, whose schemas it does not
ship, checked field by field against the objects they point at."""

from __future__ import annotations

import re

import kubernetes_validate
import pytest

from tests.deploy.manifests import Object, kustomizations, of_kind

# The oldest Kubernetes the manifests are written for (the preStop `sleep` action is on
# by default from 1.30) and the newest whose schemas kubernetes-validate ships.
KUBERNETES_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
# Custom resources: the Prometheus Operator's CRDs are not in the Kubernetes schemas.
CUSTOM_RESOURCES = {("monitoring.coreos.com/v1", "ServiceMonitor")}


def schema_errors(objects: list[Object], version: str) -> tuple[int, list[str]]:
    """(objects validated, one line per object that failed)."""
    validated, errors = 0, []
    for obj in objects:
        if (obj["apiVersion"], obj["kind"]) in CUSTOM_RESOURCES:
            continue
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(p) for p in error.path)
            errors.append(f"{where}: {path}: {error.message}")
        except kubernetes_validate.SchemaNotFoundError as error:
            # A built-in kind without a schema is a typo in apiVersion or kind.
            errors.append(f"{where}: {error.message}")
        validated += 1
    return validated, errors


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("name", list(kustomizations()))
def test_every_object_matches_the_kubernetes_schema(rendered, name, version):
    validated, errors = schema_errors(rendered[name], version)
    assert validated >= 5
    assert errors == []


def test_the_custom_resources_are_not_in_kubernetes_validate(rendered):
    """Were a schema for them shipped, they would belong in the strict check above."""
    for kind in CUSTOM_RESOURCES:
        with pytest.raises(kubernetes_validate.SchemaNotFoundError):
            kubernetes_validate.validate(
                {"apiVersion": kind[0], "kind": kind[1], "metadata": {"name": "x"}},
                KUBERNETES_VERSIONS[-1],
                strict=True,
            )


# The ServiceMonitor fields deploy/ uses (Prometheus Operator, monitoring.coreos.com/v1);
# anything else is refused, as a strict schema would refuse an unknown field.
SERVICE_MONITOR_SPEC = {"selector", "endpoints", "namespaceSelector", "jobLabel"}
SERVICE_MONITOR_ENDPOINT = {"port", "path", "interval", "scrapeTimeout", "scheme"}
DURATION = re.compile(r"^(\d+(ms|s|m|h))+$")


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("name", list(kustomizations()))
def test_service_monitors_scrape_a_named_port_of_one_service(rendered, name):
    objects = rendered[name]
    monitors = of_kind(objects, "ServiceMonitor")
    if name == "service-monitor":
        assert len(monitors) == 2  # the gateway's and vLLM's
    for monitor in monitors:
        where = f"ServiceMonitor/{monitor['metadata']['name']}"
        assert set(monitor) == {"apiVersion", "kind", "metadata", "spec"}, where
        spec = monitor["spec"]
        assert set(spec) <= SERVICE_MONITOR_SPEC, f"{where}: {set(spec) - SERVICE_MONITOR_SPEC}"
        selector = spec["selector"]["matchLabels"]
        assert set(spec["selector"]) == {"matchLabels"} and selector, where
        services = [
            s
            for s in of_kind(objects, "Service")
            if s["metadata"]["namespace"] == monitor["metadata"]["namespace"]
            and _selects(selector, s["metadata"].get("labels", {}))
        ]
        assert len(services) == 1, f"{where} selects {len(services)} Services"
        service = services[0]
        port_names = {p["name"]: p for p in service["spec"]["ports"]}
        assert spec["endpoints"], where
        for endpoint in spec["endpoints"]:
            assert set(endpoint) <= SERVICE_MONITOR_ENDPOINT, f"{where}: {set(endpoint)}"
            assert endpoint["port"] in port_names, f"{where}: no port {endpoint['port']!r}"
            assert endpoint["path"].startswith("/"), where
            assert DURATION.match(endpoint["interval"]), f"{where}: {endpoint['interval']}"
            # The port leads to a container port of the pods behind the Service.
            target = port_names[endpoint["port"]]["targetPort"]
            pods = [
                d
                for d in of_kind(objects, "Deployment")
                if _selects(
                    service["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"]
                )
            ]
            assert pods, f"{where}: the Service selects no pods"
            for deployment in pods:
                ports = [
                    p
                    for c in deployment["spec"]["template"]["spec"]["containers"]
                    for p in c.get("ports", [])
                ]
                assert any(target in (p.get("name"), p["containerPort"]) for p in ports), where
