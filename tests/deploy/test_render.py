"""The kustomizations under deploy/ render, and the renderer the other tests use renders
them as kustomize itself does (`kubectl kustomize`, where kubectl is installed)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from tests.deploy.kustomize_subset import UnsupportedKustomization, render
from tests.deploy.manifests import kustomizations


def _key(obj: dict) -> tuple[str, str, str, str]:
    metadata = obj["metadata"]
    return obj["apiVersion"], obj["kind"], metadata.get("namespace", ""), metadata["name"]


@pytest.mark.parametrize("name", list(kustomizations()))
def test_renderer_matches_kubectl_kustomize(name):
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed: the renderer is not compared with kustomize here")
    folder = kustomizations()[name]
    done = subprocess.run(
        [kubectl, "kustomize", str(folder)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = sorted((doc for doc in yaml.safe_load_all(done.stdout) if doc is not None), key=_key)
    ours = sorted(render(folder), key=_key)
    assert [_key(o) for o in ours] == [_key(o) for o in theirs]
    for mine, kustomizes in zip(ours, theirs, strict=True):
        assert mine == kustomizes, f"{_key(mine)} renders differently"


def test_every_kustomization_renders_objects(rendered):
    assert set(rendered) >= {"base", "external-redis", "service-monitor"}
    for name, objects in rendered.items():
        assert objects, f"{name} renders nothing"
        for obj in objects:
            assert obj["kind"] == "Namespace" or obj["metadata"].get("namespace") == "tokenfair"


def test_renderer_refuses_what_it_does_not_implement(tmp_path):
    """Past its subset the renderer fails rather than rendering something else."""
    (tmp_path / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndata: {k: v}\n"
    )
    (tmp_path / "kustomization.yaml").write_text("resources: [cm.yaml]\ncommonLabels: {a: b}\n")
    with pytest.raises(UnsupportedKustomization, match="commonLabels"):
        render(tmp_path)
    (tmp_path / "patch.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndata: {k: [1]}\n"
    )
    (tmp_path / "kustomization.yaml").write_text(
        "resources: [cm.yaml]\npatches: [{path: patch.yaml}]\n"
    )
    with pytest.raises(UnsupportedKustomization, match="lists"):
        render(tmp_path)
