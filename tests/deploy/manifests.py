"""Paths, rendering and look-ups shared by the deploy/ tests."""

from __future__ import annotations

import base64
import functools
from pathlib import Path
from typing import Any

from tests.deploy import dockerfile
from tests.deploy.kustomize_subset import render

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCKERFILE = ROOT / "Dockerfile"

Object = dict[str, Any]


def kustomizations() -> dict[str, Path]:
    """Everything `kubectl apply -k` is meant for: the base and every overlay."""
    found = {"base": DEPLOY / "base"}
    for path in sorted((DEPLOY / "overlays").glob("*/kustomization.yaml")):
        found[path.parent.name] = path.parent
    return found


def render_all() -> dict[str, list[Object]]:
    return {name: render(folder) for name, folder in kustomizations().items()}


def one(objects: list[Object], kind: str, name: str) -> Object:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    if len(found) != 1:
        raise LookupError(f"{len(found)} {kind} named {name!r}, not one")
    return found[0]


def of_kind(objects: list[Object], kind: str) -> list[Object]:
    return [o for o in objects if o["kind"] == kind]


def containers(objects: list[Object]) -> list[tuple[Object, Object]]:
    """(workload, container) for every container of every Deployment."""
    return [
        (workload, container)
        for workload in of_kind(objects, "Deployment")
        for container in workload["spec"]["template"]["spec"]["containers"]
    ]


@functools.cache
def image_stages() -> dict[str, dockerfile.Stage]:
    """The Dockerfile's stages by the image each builds: the default target (the last
    stage) is tokenfair, the `vllm` target tokenfair-vllm, as deploy/ names them."""
    stages = dockerfile.parse(DOCKERFILE)
    named = {stage.name: stage for stage in stages}
    return {"tokenfair": stages[-1], "tokenfair-vllm": named["vllm"]}


def argv(container: Object) -> list[str]:
    """What the container runs: its command, or the image's ENTRYPOINT, then its args,
    or the image's CMD when it sets no command (Kubernetes' rules)."""
    repository = container["image"].rsplit(":", 1)[0]
    stage = image_stages().get(repository)
    entrypoint: list[str] = []
    cmd: list[str] = []
    if stage is not None:
        if stage.last("ENTRYPOINT"):
            entrypoint = dockerfile.exec_form(stage.last("ENTRYPOINT"))
        if stage.last("CMD"):
            cmd = dockerfile.exec_form(stage.last("CMD"))
    if "command" in container:
        return [*container["command"], *container.get("args", [])]
    if stage is None:
        raise LookupError(f"{container['image']}: no command, and not an image built here")
    return [*entrypoint, *container.get("args", cmd)]


def option(args: list[str], name: str) -> str:
    """The value of `--name VALUE` or `--name=VALUE` in an argument list."""
    for index, arg in enumerate(args):
        if arg == name:
            return args[index + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    raise LookupError(f"{name} not in {args}")


def lay_out_mounts(objects: list[Object], workload: Object, container: Object, root: Path) -> None:
    """Write the ConfigMap and Secret files the container sees under `root`, at their
    mount paths, as the kubelet does (emptyDir volumes as empty folders)."""
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"].get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        folder = root / mount["mountPath"].lstrip("/")
        folder.mkdir(parents=True, exist_ok=True)
        if "configMap" in volume:
            source = one(objects, "ConfigMap", volume["configMap"]["name"])
            files = dict(source.get("data", {}))
        elif "secret" in volume:
            source = one(objects, "Secret", volume["secret"]["secretName"])
            files = {k: base64.b64decode(v).decode() for k, v in source.get("data", {}).items()}
            files.update(source.get("stringData", {}))
        else:
            continue
        for key, text in files.items():
            (folder / key).write_text(text)


def in_root(root: Path, path: str) -> Path:
    """A path inside the container, under the folder that stands for its root."""
    return root / path.lstrip("/")
