"""The gateway config and tenants file that deploy/ carries, read by the gateway's own
validation from where the pods see them, and the figures in them that must agree with
the manifests: the upstream's capacity, the Services it names, the ports probed."""

from __future__ import annotations

import copy
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from tests.deploy import dockerfile
from tests.deploy.manifests import (
    Object,
    argv,
    containers,
    image_stages,
    in_root,
    kustomizations,
    lay_out_mounts,
    of_kind,
    one,
    option,
)
from tokenfair.edge.tenants import load_tenants
from tokenfair.gateway.app import build_directory
from tokenfair.gateway.config import GatewayConfig, GatewayConfigError, load_config

GATEWAY = "tokenfair-gateway"


def gateway_container(objects: list[Object]) -> tuple[Object, Object]:
    deployment = one(objects, "Deployment", GATEWAY)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return deployment, container


def mounted_config(objects: list[Object], root: Path) -> GatewayConfig:
    """The gateway's config as the pod reads it: the ConfigMap and Secret written at
    their mount paths under `root`, then `--config` loaded from there."""
    deployment, container = gateway_container(objects)
    lay_out_mounts(objects, deployment, container, root)
    return load_config(in_root(root, option(argv(container), "--config")))


def config_data(objects: list[Object]) -> dict:
    return yaml.safe_load(
        one(objects, "ConfigMap", "tokenfair-gateway-config")["data"]["gateway.yaml"]
    )


@pytest.mark.parametrize("name", list(kustomizations()))
def test_config_and_tenants_load_where_the_pod_reads_them(rendered, name, tmp_path):
    config = mounted_config(rendered[name], tmp_path)
    # The tenants file as the gateway loads it at start: its path is relative to the
    # config file, so this also checks that the Secret is mounted where the config says.
    directory = build_directory(config)
    assert len(directory.tenants) >= 1
    assert isinstance(config.tenants, str)
    tenants = load_tenants(config.base_dir / config.tenants)
    assert tenants.admin_key_sha256 is not None  # the operator's pages on the API port
    assert config.listen.host == "0.0.0.0"  # reachable by the Service and the kubelet
    assert config.redis is not None, "two replicas need Redis to share counters"


def test_external_redis_overlay_changes_only_the_redis_url(rendered):
    base, external = config_data(rendered["base"]), config_data(rendered["external-redis"])
    base_url, external_url = base["redis"].pop("url"), external["redis"].pop("url")
    assert base == external, "the overlay's gateway.yaml drifted from the base's"
    assert base_url != external_url
    host = urlsplit(external_url).hostname
    services = {s["metadata"]["name"] for s in of_kind(rendered["external-redis"], "Service")}
    assert host not in services
    assert not [o for o in rendered["external-redis"] if "redis" in o["metadata"]["name"]]


def service_for(objects: list[Object], url: str) -> tuple[Object, dict]:
    """The Service a cluster-internal URL names (`name`, `name.namespace`, or
    `name.namespace.svc...`), and the Service port it uses."""
    parts = urlsplit(url)
    name, _, rest = (parts.hostname or "").partition(".")
    service = one(objects, "Service", name)
    if rest:
        assert rest.split(".")[0] == service["metadata"]["namespace"], url
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == parts.port]
    return service, port


def backing_deployment(objects: list[Object], service: Object) -> Object:
    """The one Deployment whose pods the Service selects."""
    selector = service["spec"]["selector"]
    found = [
        d
        for d in of_kind(objects, "Deployment")
        if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
    ]
    assert len(found) == 1, (
        f"Service/{service['metadata']['name']} selects {len(found)} Deployments"
    )
    return found[0]


def test_redis_url_names_the_in_cluster_redis(rendered):
    objects = rendered["base"]
    service, port = service_for(objects, config_data(objects)["redis"]["url"])
    redis = backing_deployment(objects, service)
    (container,) = redis["spec"]["template"]["spec"]["containers"]
    assert port["targetPort"] in [p["name"] for p in container["ports"]]
    assert redis["spec"]["replicas"] == 1  # one Redis: the counters in one place


def engine_capacity(objects: list[Object], url: str) -> tuple[int, set[str]]:
    """The requests the engine behind `url` runs at once, and the model names it serves."""
    service, port = service_for(objects, url)
    engine = backing_deployment(objects, service)
    (container,) = engine["spec"]["template"]["spec"]["containers"]
    args = argv(container)
    named_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert named_ports[port["targetPort"]] == int(option(args, "--port"))
    # One upstream is one engine: a Service over several would hide how full each is.
    assert engine["spec"]["replicas"] == 1
    return int(option(args, "--max-num-seqs")), {option(args, "--served-model-name")}


@pytest.mark.parametrize("name", list(kustomizations()))
def test_upstream_capacity_is_the_engines_for_any_number_of_replicas(rendered, name, tmp_path):
    objects = rendered[name]
    config = mounted_config(objects, tmp_path)
    replicas = one(objects, "Deployment", GATEWAY)["spec"]["replicas"]
    shared = config.redis is not None and config.redis.share_capacity
    for upstream in config.upstreams:
        max_num_seqs, served = engine_capacity(objects, upstream.url)
        assert set(upstream.models) <= served, f"{upstream.name}: models vLLM does not serve"
        assert upstream.max_concurrent is not None
        # docs/gateway.md, "Capacity shared by replicas": with share_capacity every
        # replica is given the upstream's whole capacity; without it, a share by hand.
        per_replica_total = upstream.max_concurrent * (1 if shared else replicas)
        assert per_replica_total == max_num_seqs, (
            f"{upstream.name}: {upstream.max_concurrent} x {1 if shared else replicas} "
            f"replicas, but vLLM runs {max_num_seqs} at once"
        )


def _container_port(container: Object, port: str | int) -> int:
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in container["ports"] if p["name"] == port]
    return number


def test_probes_and_scraping_use_the_configs_ports(rendered, tmp_path):
    objects = rendered["base"]
    config = mounted_config(objects, tmp_path)
    deployment, container = gateway_container(objects)
    readiness = container["readinessProbe"]["httpGet"]
    liveness = container["livenessProbe"]["httpGet"]
    assert readiness["path"] == "/health"
    assert _container_port(container, readiness["port"]) == config.listen.port
    assert liveness["path"] == "/metrics"
    assert _container_port(container, liveness["port"]) == config.listen.metrics_port
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == config.listen.metrics_port
    # The clients' Service never exposes the metrics port (every tenant's usage, no key).
    client_ports = one(objects, "Service", GATEWAY)["spec"]["ports"]
    assert [_container_port(container, p["targetPort"]) for p in client_ports] == [
        config.listen.port
    ]
    image = image_stages()["tokenfair"]
    exposed = {int(p) for i in image.all("EXPOSE") for p in i.arguments.split()}
    assert {config.listen.port, config.listen.metrics_port} <= exposed


def _user(stage: dockerfile.Stage) -> tuple[int, int]:
    user = stage.last("USER")
    assert user is not None
    uid, _, gid = user.arguments.partition(":")
    return int(uid), int(gid)


@pytest.mark.parametrize("name", list(kustomizations()))
def test_pods_run_as_the_images_non_root_user(rendered, name):
    for workload, container in containers(rendered[name]):
        pod = workload["spec"]["template"]["spec"]
        security = pod["securityContext"]
        assert security["runAsNonRoot"] is True
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
        stage = image_stages().get(container["image"].rsplit(":", 1)[0])
        if stage is not None:  # built from the Dockerfile: the same numeric user
            assert (security["runAsUser"], security["runAsGroup"]) == _user(stage)
            assert security["runAsUser"] != 0


@pytest.mark.parametrize("name", list(kustomizations()))
def test_every_container_has_requests_and_limits(rendered, name):
    for workload, container in containers(rendered[name]):
        resources = container["resources"]
        where = workload["metadata"]["name"]
        assert {"cpu", "memory"} <= set(resources["requests"]), where
        assert "memory" in resources["limits"], where
    (vllm,) = [c for _, c in containers(rendered[name]) if c["name"] == "vllm"]
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_gateway_rolls_out_and_drains_without_a_gap(rendered):
    objects = rendered["base"]
    deployment, container = gateway_container(objects)
    spec = deployment["spec"]
    assert spec["replicas"] >= 2
    assert spec["strategy"]["type"] == "RollingUpdate"
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    (budget,) = of_kind(objects, "PodDisruptionBudget")
    assert budget["spec"]["selector"] == spec["selector"]
    assert 1 <= budget["spec"]["minAvailable"] < spec["replicas"]
    # The pod's grace covers the preStop pause and the gateway's own shutdown timeout.
    pause = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    shutdown = int(option(argv(container), "--shutdown-timeout"))
    assert spec["template"]["spec"]["terminationGracePeriodSeconds"] > pause + shutdown


@pytest.mark.parametrize("name", list(kustomizations()))
def test_selectors_match_their_pods(rendered, name):
    """What the schemas cannot see: each selector selects the pods it is meant for."""
    objects = rendered[name]
    for deployment in of_kind(objects, "Deployment"):
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert selector.items() <= labels.items(), deployment["metadata"]["name"]
    for service in of_kind(objects, "Service"):
        backing_deployment(objects, service)  # exactly one


def test_mounted_layout_needs_the_secret(rendered, tmp_path):
    """Without the tenants Secret mounted, the config does not load: the check above
    reads the file from the mount, not from anywhere else."""
    objects = copy.deepcopy(rendered["base"])
    _, container = gateway_container(objects)
    container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] != "tenants"]
    config = mounted_config(objects, tmp_path)
    with pytest.raises(GatewayConfigError, match=r"tenants\.yaml: cannot read"):
        build_directory(config)
