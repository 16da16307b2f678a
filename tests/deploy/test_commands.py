"""The commands the image and the manifests run are real: tokenfair's sub-commands and
options as its CLI parses them, and a vLLM scheduler class that tokenfair defines."""

from __future__ import annotations

import ast
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import typer

from tests.deploy import dockerfile
from tests.deploy.manifests import (
    ROOT,
    argv,
    containers,
    image_stages,
    in_root,
    kustomizations,
    lay_out_mounts,
    option,
)
from tokenfair.cli import app
from tokenfair.edge.tenants import load_tenants

SRC = ROOT / "src"
# The CLI's usage error (a bad option or value), from typer's public BadParameter: typer
# runs on its own copy of click in recent releases and on click itself in older ones.
UsageError = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


def parse_tokenfair(command_line: list[str]) -> tuple[Any, dict[str, Any]]:
    """The sub-command `tokenfair ...` runs and its parsed options, as the CLI parses
    them: an unknown sub-command raises LookupError, an unknown option or a bad value
    the CLI's own UsageError."""
    assert command_line[0] == "tokenfair", command_line
    command: Any = typer.main.get_command(app)
    name, args, parent = "tokenfair", list(command_line[1:]), None
    while hasattr(command, "get_command"):  # a group: the next word names its sub-command
        if not args or args[0].startswith("-"):
            raise LookupError(f"{command_line}: no sub-command after {name!r}")
        context = typer.Context(command, info_name=name, parent=parent)
        sub = command.get_command(context, args[0])
        if sub is None:
            raise LookupError(f"{command_line}: no command {args[0]!r} under {name!r}")
        command, name, args, parent = sub, args[0], args[1:], context
    context = command.make_context(name, args, parent=parent, resilient_parsing=False)
    return command, context.params


def _repository(container: dict[str, Any]) -> str:
    return container["image"].rsplit(":", 1)[0]


def test_the_images_default_command_parses(rendered):
    image = image_stages()["tokenfair"]
    entrypoint = dockerfile.exec_form(image.last("ENTRYPOINT"))
    cmd = dockerfile.exec_form(image.last("CMD"))
    assert entrypoint == ["tokenfair"]
    command, params = parse_tokenfair([*entrypoint, *cmd])
    assert command.name == "gateway"
    # The config where deploy/ mounts it: the image runs the same way outside Kubernetes
    # given the same files.
    (gateway,) = [c for _, c in containers(rendered["base"]) if c["name"] == "gateway"]
    assert str(params["config"]) == option(argv(gateway), "--config")


@pytest.mark.parametrize("name", list(kustomizations()))
def test_the_manifests_tokenfair_commands_parse(rendered, name):
    parsed = 0
    for workload, container in containers(rendered[name]):
        if "command" not in container and _repository(container) not in image_stages():
            continue  # another project's image (Redis), run as that image says
        command_line = argv(container)
        if command_line[0] != "tokenfair":
            continue
        command, _ = parse_tokenfair(command_line)
        assert command.name == "gateway", workload["metadata"]["name"]
        parsed += 1
    assert parsed == 1  # the gateway


def test_a_bad_command_line_does_not_parse():
    with pytest.raises(UsageError, match="No such option: --confg"):
        parse_tokenfair(["tokenfair", "gateway", "--confg", "x.yaml"])
    with pytest.raises(UsageError, match="valid integer"):
        parse_tokenfair(["tokenfair", "gateway", "--shutdown-timeout", "soon"])
    with pytest.raises(LookupError, match="no command 'gatway'"):
        parse_tokenfair(["tokenfair", "gatway"])
    command, params = parse_tokenfair(["tokenfair", "tenants", "check", "t.yaml"])
    assert command.name == "check" and str(params["path"]) == "t.yaml"


def _module_file(module: str) -> Path:
    base = SRC.joinpath(*module.split("."))
    package = base / "__init__.py"
    return package if package.exists() else base.with_suffix(".py")


def class_definition(qualname: str) -> tuple[str, ast.ClassDef]:
    """Where the class `qualname` (`package.module.Class`) is defined, followed through
    the package's re-exports, from the source alone (vLLM is not installed here)."""
    module, _, name = qualname.rpartition(".")
    tree = ast.parse(_module_file(module).read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return module, node
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    source = node.module or ""
                    if node.level:  # relative: from the package the module sits in
                        anchor = module.split(".")
                        if _module_file(module).name != "__init__.py":
                            anchor = anchor[:-1]
                        anchor = anchor[: len(anchor) - node.level + 1]
                        source = ".".join([*anchor, *([source] if source else [])])
                    return class_definition(f"{source}.{alias.name}")
    raise LookupError(f"{qualname}: no such class in {_module_file(module)}")


def _exported(module: str) -> list[str]:
    tree = ast.parse(_module_file(module).read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return [ast.literal_eval(e) for e in node.value.elts]  # type: ignore[attr-defined]
    return []


def vllm_container(objects):
    (found,) = [(w, c) for w, c in containers(objects) if c["name"] == "vllm"]
    return found


@pytest.mark.parametrize("name", list(kustomizations()))
def test_vllm_runs_a_scheduler_class_the_plugin_defines(rendered, name):
    _, container = vllm_container(rendered[name])
    command_line = argv(container)
    assert command_line[:2] == ["vllm", "serve"]
    qualname = option(command_line, "--scheduler-cls")
    package, _, class_name = qualname.rpartition(".")
    assert class_name in _exported(package), f"{class_name} is not in {package}.__all__"
    defined_in, definition = class_definition(qualname)
    assert defined_in == "tokenfair.integrations.vllm.scheduler"
    bases = {b.id for b in definition.bases if isinstance(b, ast.Name)}
    # With async scheduling vLLM wants a scheduler over its AsyncScheduler (docs/vllm.md).
    if "--async-scheduling" in command_line:
        assert "AsyncScheduler" in bases, f"{qualname} does not subclass AsyncScheduler"
    # The image that runs it is the Dockerfile's vllm target, where the plugin is installed.
    assert _repository(container) == "tokenfair-vllm"


def test_the_class_lookup_fails_for_a_name_the_plugin_lacks():
    with pytest.raises(LookupError):
        class_definition("tokenfair.integrations.vllm.FairAsyncSchedular")


# vLLM's own parser, when the environment for the plugin's tests is there (`make
# vllm-env`): vLLM 0.34, the minor of the image's vllm/vllm-openai tag.
VLLM_PYTHON = Path(
    os.environ.get("TOKENFAIR_VLLM_0_34_PYTHON", ROOT / ".venv-vllm-0.34" / "bin" / "python")
)
VLLM_CHECK = """
import json, sys
from vllm.entrypoints.common.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.utils.import_utils import resolve_obj_by_qualname
from tokenfair.integrations.vllm.config import load_plugin_config

args = make_arg_parser(FlexibleArgumentParser()).parse_args(json.loads(sys.argv[1]))
scheduler = resolve_obj_by_qualname(args.scheduler_cls)
root = sys.argv[2]  # the folder standing for the pod's root, its mounts laid out
additional = dict(args.additional_config)
entry = dict(additional["tokenfair"])
if "tenants_file" in entry:
    entry["tenants_file"] = root + entry["tenants_file"]
settings = load_plugin_config({**additional, "tokenfair": entry})
weights, tree = settings.shares()
print(json.dumps({
    "scheduler": scheduler.__module__ + "." + scheduler.__qualname__,
    "bases": [b.__name__ for b in scheduler.__mro__],
    "policy": settings.policy,
    "tenants_file": settings.tenants_file,
    "weights": weights,
    "parents": tree.parent,
    "max_num_seqs": args.max_num_seqs,
    "async_scheduling": args.async_scheduling,
}))
"""


@pytest.mark.slow
def test_vllm_parses_the_manifests_arguments(rendered, tmp_path):
    if not VLLM_PYTHON.exists():
        pytest.skip(f"no vLLM environment at {VLLM_PYTHON} (`make vllm-env` builds it)")
    objects = rendered["base"]
    deployment, container = vllm_container(objects)
    lay_out_mounts(objects, deployment, container, tmp_path)
    serve_args = argv(container)[2:]  # after `vllm serve`
    done = subprocess.run(
        [str(VLLM_PYTHON), "-c", VLLM_CHECK, json.dumps(serve_args), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env={
            **os.environ,
            "PYTHONPATH": str(SRC),
            "VLLM_TARGET_DEVICE": "cpu",
            "CUDA_VISIBLE_DEVICES": "",  # vLLM 0.34 on an x86 CPU (docs/vllm.md)
        },
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["scheduler"] == "tokenfair.integrations.vllm.scheduler.FairAsyncScheduler"
    assert "AsyncScheduler" in result["bases"]
    assert result["policy"] == "vtc"
    # vLLM's scheduler and the gateway read one tenants file, and agree on it.
    gateway = load_tenants(in_root(tmp_path, "/etc/tokenfair/tenants/tenants.yaml"))
    assert result["tenants_file"] and Path(result["tenants_file"]).read_text()
    assert result["weights"] == gateway.weights()
    assert result["parents"] == gateway.share_tree().parent
    assert result["max_num_seqs"] == int(option(serve_args, "--max-num-seqs"))
    assert result["async_scheduling"] is True
