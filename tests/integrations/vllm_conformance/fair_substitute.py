"""A pytest plugin that runs vLLM's scheduler tests with tokenfair's scheduler.

Loaded with `-p fair_substitute (this folder on PYTHONPATH)` in vLLM's
environment, over the tests extracted from a vLLM sdist (see sdist.py). The mode
comes from TOKENFAIR_CONFORMANCE:

- `stock`: vLLM's own schedulers, untouched (the baseline);
- `fcfs`, `priority`, `vtc`: every `Scheduler` / `AsyncScheduler` that vLLM's test
  modules name becomes `FairScheduler` / `FairAsyncScheduler` with that tokenfair
  policy (requests carry no tenant: one tenant).

TOKENFAIR_CONFORMANCE_REPORT names a JSON file that receives, per test, its outcome
and the scheduling policies vLLM was configured with in it (so the runner can tell
vLLM's priority tests from the rest).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

MODES = ("stock", "fcfs", "priority", "vtc")

_results: dict[str, dict[str, Any]] = {}
_policies: set[str] = set()  # vLLM policies configured in the running test


def _mode() -> str:
    mode = os.environ.get("TOKENFAIR_CONFORMANCE", "stock")
    if mode not in MODES:
        raise pytest.UsageError(f"TOKENFAIR_CONFORMANCE must be one of {', '.join(MODES)}")
    return mode


def _record_vllm_policy() -> None:
    """Note the policy every vLLM scheduler is built with (stock or not)."""
    from vllm.v1.core.sched.scheduler import Scheduler

    original = Scheduler.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        _policies.add(str(self.scheduler_config.policy))

    Scheduler.__init__ = init  # type: ignore[method-assign]


def _remember_failed_model_inspections() -> None:
    """vLLM inspects a model class in a subprocess, and does it again for every config
    when it fails (here LLaVA's: its module needs torchvision, which has no CPU build on
    PyPI). Remember the failure for the session: those tests still fail, in every mode
    alike, in a second instead of a minute; nothing that passes is touched."""
    from vllm.model_executor.models import registry

    inspect = registry._try_inspect_model_cls
    failed: set[str] = set()

    def remembered(model_arch: str, model: Any) -> Any:
        if model_arch in failed:
            return None
        info = inspect(model_arch, model)
        if info is None:
            failed.add(model_arch)
        return info

    registry._try_inspect_model_cls = remembered


def _fair_classes(policy: str) -> dict[str, type]:
    from tokenfair.integrations.vllm import FairAsyncScheduler, FairScheduler

    settings = {"policy": policy, "log_interval_s": 0}

    def with_policy(base: type) -> type:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            config = kwargs["vllm_config"] if "vllm_config" in kwargs else args[0]
            config.additional_config = {**(config.additional_config or {}), "tokenfair": settings}
            base.__init__(self, *args, **kwargs)

        return type(base.__name__, (base,), {"__init__": __init__, "__module__": __name__})

    return {
        "Scheduler": with_policy(FairScheduler),
        "AsyncScheduler": with_policy(FairAsyncScheduler),
    }


def pytest_configure(config: pytest.Config) -> None:
    _mode()
    config.addinivalue_line("markers", "cpu_test: vLLM's marker for tests that run on CPU")
    config.addinivalue_line("markers", "skip_global_cleanup: vLLM's marker")
    _record_vllm_policy()
    _remember_failed_model_inspections()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Swap the scheduler classes in vLLM's test modules, once they are imported."""
    mode = _mode()
    if mode == "stock":
        return
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    stock = {"Scheduler": Scheduler, "AsyncScheduler": AsyncScheduler}
    fair = _fair_classes(mode)
    for name, module in list(sys.modules.items()):
        if not (name == "tests" or name.startswith("tests.")) or module is None:
            continue
        for attribute, original in stock.items():
            if getattr(module, attribute, None) is original:
                setattr(module, attribute, fair[attribute])


@pytest.fixture(autouse=True)
def _policies_of_this_test() -> Iterator[None]:
    _policies.clear()
    yield


@pytest.fixture()
def caplog_vllm(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> Any:
    """What vLLM's own conftest provides: vLLM's log records in caplog, at INFO."""
    from vllm.logger import DEFAULT_LOGGING_CONFIG

    monkeypatch.setitem(DEFAULT_LOGGING_CONFIG["loggers"]["vllm"], "propagate", True)
    monkeypatch.setattr(logging.getLogger("vllm"), "propagate", True)
    with caplog.at_level(logging.INFO):
        yield caplog


def _error_line(report: pytest.TestReport) -> str:
    """Where and why it failed, in one line."""
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is None:
        return str(report.longrepr).strip().splitlines()[-1][:300] if report.longrepr else ""
    message = " ".join(str(crash.message).split())
    return f"{Path(crash.path).name}:{crash.lineno}: {message}"[:300]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    entry = _results.setdefault(item.nodeid, {"outcome": "passed", "policies": []})
    if report.failed:
        entry["outcome"] = "failed"
        entry["error"] = _error_line(report)
    elif report.skipped and entry["outcome"] == "passed":
        entry["outcome"] = "skipped"
    if report.when == "call":
        entry["policies"] = sorted(_policies)


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get("TOKENFAIR_CONFORMANCE_REPORT")
    if path:
        with open(path, "w") as file:
            json.dump({"mode": _mode(), "tests": _results}, file, indent=1, sort_keys=True)
