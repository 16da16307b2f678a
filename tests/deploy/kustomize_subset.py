"""Renders the kustomizations under deploy/ without the kustomize binary.

Only the part of kustomize that deploy/ uses, and an error for anything else, so that a
kustomization growing past it fails here instead of rendering differently from
`kubectl apply -k`:

- `resources`: YAML files (several documents each) and folders holding a
  kustomization.yaml, rendered first;
- `namespace`: set on every namespaced object (kustomize treats kinds it does not know,
  custom resources among them, as namespaced);
- `patches`: `- path: FILE`, each file one strategic-merge patch naming its target by
  apiVersion, kind and metadata.name: `$patch: delete` removes the target; otherwise
  mappings merge key by key, a null removes the key, and scalars replace. Strategic
  merge of lists (by merge keys such as a container's name) is not implemented: a patch
  holding a list is refused.

Where `kubectl` is installed, tests/deploy/test_render.py checks that this renders every
overlay exactly as `kubectl kustomize` does.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

KUSTOMIZATION_KEYS = {"apiVersion", "kind", "namespace", "resources", "patches"}
# Kinds kustomize leaves without a namespace; every other kind gets one.
CLUSTER_SCOPED_KINDS = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "PersistentVolume",
    "StorageClass",
    "PriorityClass",
    "IngressClass",
}


class UnsupportedKustomization(ValueError):
    """A kustomization or patch that uses more of kustomize than this renderer knows."""


def render(folder: Path) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize folder` would print, in the order they were listed."""
    folder = Path(folder)
    path = folder / "kustomization.yaml"
    kustomization = yaml.safe_load(path.read_text())
    unknown = set(kustomization) - KUSTOMIZATION_KEYS
    if unknown:
        raise UnsupportedKustomization(f"{path}: keys this renderer does not know: {unknown}")
    if kustomization.get("kind", "Kustomization") != "Kustomization":
        raise UnsupportedKustomization(f"{path}: kind {kustomization['kind']!r}")
    objects: list[dict[str, Any]] = []
    for entry in kustomization.get("resources", []):
        target = (folder / entry).resolve()
        loaded = render(target) if target.is_dir() else _documents(target)
        for obj in loaded:
            if any(_identity(obj) == _identity(seen) for seen in objects):
                raise ValueError(f"{path}: {_identity(obj)} is listed twice")
            objects.append(obj)
    namespace = kustomization.get("namespace")
    if namespace is not None:
        for obj in objects:
            if obj["kind"] not in CLUSTER_SCOPED_KINDS:
                obj["metadata"]["namespace"] = namespace
    for patch_entry in kustomization.get("patches", []):
        if set(patch_entry) != {"path"}:
            raise UnsupportedKustomization(f"{path}: a patch other than `- path:`: {patch_entry}")
        patch_path = folder / patch_entry["path"]
        documents = _documents(patch_path)
        if len(documents) != 1:
            # kustomize itself fails on several documents in one patch file.
            raise UnsupportedKustomization(f"{patch_path}: one patch per file")
        objects = _apply(objects, documents[0], patch_path)
    return objects


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def _identity(obj: dict[str, Any]) -> tuple[str, str, str, str | None]:
    metadata = obj["metadata"]
    return obj["apiVersion"], obj["kind"], metadata["name"], metadata.get("namespace")


def _apply(
    objects: list[dict[str, Any]], patch: dict[str, Any], source: Path
) -> list[dict[str, Any]]:
    patch = copy.deepcopy(patch)
    directive = patch.pop("$patch", None)
    name = patch["metadata"]["name"]
    matches = [
        index
        for index, obj in enumerate(objects)
        if obj["apiVersion"] == patch["apiVersion"]
        and obj["kind"] == patch["kind"]
        and obj["metadata"]["name"] == name
        and patch["metadata"].get("namespace") in (None, obj["metadata"].get("namespace"))
    ]
    if len(matches) != 1:
        raise ValueError(f"{source}: the patch matches {len(matches)} objects, not one")
    if directive == "delete":
        return [obj for index, obj in enumerate(objects) if index != matches[0]]
    if directive is not None:
        raise UnsupportedKustomization(f"{source}: $patch: {directive}")
    _merge(objects[matches[0]], patch, source)
    return objects


def _merge(target: dict[str, Any], patch: dict[str, Any], source: Path) -> None:
    for key, value in patch.items():
        if isinstance(value, list):
            raise UnsupportedKustomization(f"{source}: {key}: lists are not merged here")
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value, source)
        else:
            target[key] = copy.deepcopy(value)
