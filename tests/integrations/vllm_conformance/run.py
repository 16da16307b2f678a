"""vLLM's own scheduler tests with tokenfair's scheduler substituted: the conformance run.

For one vLLM release (installed in its own environment), this takes vLLM's
`tests/v1/core/test_scheduler.py` and `test_async_scheduler.py` (FairAsyncScheduler
in place of AsyncScheduler there) with their helpers from that release's sdist (sdist.py),
writes the offline model configs they name (hf_cache.py), and runs them four times
in that environment (fair_substitute.py):

    stock     vLLM's schedulers: the baseline (tests that cannot run here, on stock
              vLLM, are reported and left out of the comparison; when fewer than
              RUNNABLE_FLOOR of them run, the run fails: it would compare too little)
    fcfs      FairScheduler with `fcfs`: every test that passes on stock must pass,
              except vLLM's priority tests (they configure vLLM's priority order,
              which is the next pass's job)
    priority  FairScheduler with `priority`: every test that passes on stock must pass,
              except those expected.PRIORITY_DIFFERS lists with their reasons
    vtc       FairScheduler with `vtc`, one tenant: every test that passes on stock must
              pass, except those expected.VTC_DIFFERS lists with their reasons

Any other difference fails the run (exit 1). Prints a summary and one JSON line per
minor; several minors run side by side.

    python tests/integrations/vllm_conformance/run.py \\
        --env .venv-vllm/bin/python=0.32.0 --env .venv-vllm-0.33/bin/python=0.33.0 \\
        [--work .cache/vllm-conformance] [--cache .cache/vllm-sdist]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(HERE))

import expected  # noqa: E402
import sdist  # noqa: E402

MODES = ("stock", "fcfs", "priority", "vtc")
# The share of vLLM's tests that must run here (pass on stock vLLM) for a minor's run
# to count: the rest cannot be compared. Measured: 79% on 0.32, 0.33 and 0.34 (the
# others need torchvision for LLaVA, or a GPU); below the floor a run that compares
# little would pass, so it fails instead.
RUNNABLE_FLOOR = 0.75
# Where a mode is meant to differ from stock vLLM, by test function (expected.py).
LISTED_DIFFERENCES = {"vtc": expected.VTC_DIFFERS, "priority": expected.PRIORITY_DIFFERS}
TEST_FILES = ["tests/v1/core/test_scheduler.py", "tests/v1/core/test_async_scheduler.py"]
PASS_TIMEOUT_S = 900


class ConformanceError(RuntimeError):
    """The run could not be made (as opposed to a difference it found)."""


def run_pass(
    python: str,
    tests_root: Path,
    mode: str,
    report: Path,
    env: dict[str, str],
    only: list[str] | None = None,
) -> str:
    """One pytest run in vLLM's environment (`only`: these test ids, else the file)."""
    command = [
        python, "-m", "pytest", *(only or TEST_FILES), "-q",
        "-p", "no:cacheprovider", "-p", "fair_substitute", "-W", "ignore",
        "--timeout", "300",
    ]  # fmt: skip
    run_env = dict(env, TOKENFAIR_CONFORMANCE=mode, TOKENFAIR_CONFORMANCE_REPORT=str(report))
    result = subprocess.run(
        command,
        cwd=tests_root,
        env=run_env,
        capture_output=True,
        text=True,
        timeout=PASS_TIMEOUT_S,
    )
    if not report.exists():  # pytest itself failed (collection, import)
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-30:])
        raise ConformanceError(f"the {mode} pass did not run:\n{tail}")
    last = (result.stdout.strip().splitlines() or ["(no output)"])[-1]
    return f"  {mode:8s} {last}"


def _minor(version: str) -> tuple[int, int]:
    major, minor, *_ = version.split(".")
    return int(major), int(minor)


def function_of(nodeid: str) -> str:
    return nodeid.split("::")[-1].split("[")[0]


def compare(results: dict[str, dict[str, dict]]) -> tuple[dict, list[str]]:
    """Figures per mode, and every unexplained difference."""
    stock = results["stock"]
    baseline = {t for t, r in stock.items() if r["outcome"] == "passed"}
    priority_tests = {t for t in baseline if "priority" in stock[t]["policies"]}
    figures: dict = {
        "tests": len(stock),
        "stock_passed": len(baseline),
        "not_runnable_here": len(stock) - len(baseline),
        "priority_tests": len(priority_tests),
    }
    problems: list[str] = []
    share = len(baseline) / max(1, len(stock))
    figures["runnable_share"] = round(share, 3)
    if share < RUNNABLE_FLOOR:
        problems.append(
            f"stock: only {len(baseline)} of the {len(stock)} tests run here ({share:.0%}), "
            f"below the floor of {RUNNABLE_FLOOR:.0%}: the comparison would say little"
        )
    for mode in MODES[1:]:
        # A test the pass did not run at all (it stopped early) counts as failed.
        for test in baseline - set(results[mode]):
            results[mode][test] = {"outcome": "not run", "error": "not run in this pass"}
        passed = {t for t, r in results[mode].items() if r["outcome"] == "passed"}
        failed = sorted(baseline - passed)
        listed = LISTED_DIFFERENCES.get(mode, {})
        if mode == "fcfs":
            allowed = {t: "a vLLM priority test" for t in priority_tests}
        else:
            allowed = {t: listed.get(function_of(t), "") for t in baseline}
            allowed = {t: why for t, why in allowed.items() if why}
        unexplained = [t for t in failed if t not in allowed]
        figures[mode] = {
            "passed_of_stock_passed": len(baseline & passed),
            "differ_as_documented": len(failed) - len(unexplained),
            "unexplained": len(unexplained),
        }
        for test in unexplained:
            error = results[mode][test].get("error", "")
            problems.append(f"{mode}: {test} passes on stock vLLM, fails here: {error}")
        present = {function_of(t) for t in stock}
        for name in sorted(set(listed) & present):
            mine = [t for t in baseline if function_of(t) == name]
            if mine and all(t in passed for t in mine):
                problems.append(f"{mode}: {name} is listed as differing but passes")
    return figures, problems


def conform(python: str, version: str, work_root: Path, cache: Path) -> tuple[list[str], dict]:
    """One minor's four passes: (lines to print, figures with its problems)."""
    started = time.monotonic()
    work = work_root / version
    try:
        tests_root = sdist.extract(sdist.download(version, cache), version, work)
    except sdist.SdistError as error:
        raise ConformanceError(str(error)) from None
    # Its own (empty) pytest config: this repository's pyproject.toml, above the work
    # folder, must not become vLLM's tests' rootdir and settings.
    (tests_root / "pytest.ini").write_text("[pytest]\n")
    hf_home = work / "hf-home"
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(HERE)]),
        HF_HOME=str(hf_home),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        VLLM_CACHE_ROOT=str(work / "vllm-cache"),
        # vLLM's GPU wheel on a machine without a GPU: its CPU platform, by name.
        VLLM_TARGET_DEVICE="cpu",
        TOKENIZERS_PARALLELISM="false",
    )
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    if _minor(version) >= (0, 34):
        # vLLM 0.34 refuses to build a config on an x86 CPU unless Triton has exactly
        # one driver, or CUDA_VISIBLE_DEVICES is set and empty (docs/vllm.md).
        env["CUDA_VISIBLE_DEVICES"] = ""
    built = subprocess.run(
        [python, str(HERE / "hf_cache.py"), str(hf_home)], env=env, capture_output=True, text=True
    )
    if built.returncode != 0:
        raise ConformanceError(f"cannot write the model configs:\n{built.stderr[-2000:]}")
    lines = [f"vLLM {version}: {' and '.join(TEST_FILES)}, from its sdist"]
    results: dict[str, dict[str, dict]] = {}
    baseline = None
    for mode in MODES:
        report = work / f"report-{mode}.json"
        report.unlink(missing_ok=True)
        # The tokenfair passes run only what passes on stock: the rest cannot be
        # compared, and is slow to fail (vLLM inspects the model in a subprocess).
        lines.append(run_pass(python, tests_root, mode, report, env, only=baseline))
        results[mode] = json.loads(report.read_text())["tests"]
        if mode == "stock":
            baseline = sorted(t for t, r in results[mode].items() if r["outcome"] == "passed")
            if not baseline:
                raise ConformanceError(f"vLLM {version}: no test passes on stock vLLM here")
    figures, problems = compare(results)
    lines.append(
        f"  runnable here: {figures['stock_passed']} of {figures['tests']} "
        f"({figures['runnable_share']:.0%}; the floor is {RUNNABLE_FLOOR:.0%})"
    )
    not_runnable = Counter(
        r.get("error", "")[:160] for r in results["stock"].values() if r["outcome"] != "passed"
    )
    if not_runnable:
        lines.append("  not runnable here on stock vLLM (left out):")
        lines += [f"    {count} x {error}" for error, count in not_runnable.most_common()]
    lines += [f"  UNEXPLAINED {problem}" for problem in problems]
    figures["version"] = version
    figures["wall_s"] = round(time.monotonic() - started, 1)
    figures["problems"] = len(problems)
    return lines, figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--env",
        action="append",
        required=True,
        metavar="PYTHON=VERSION",
        help="python of a vLLM environment and the vLLM release installed there "
        "(repeat for each minor: they run side by side)",
    )
    parser.add_argument("--work", type=Path, default=ROOT / ".cache" / "vllm-conformance")
    parser.add_argument("--cache", type=Path, default=ROOT / ".cache" / "vllm-sdist")
    args = parser.parse_args()
    targets = []
    for entry in args.env:
        python, _, version = entry.rpartition("=")
        if not python or not version:
            parser.error(f"--env: expected PYTHON=VERSION, got {entry!r}")
        # Absolute: the passes run in the tests' folder.
        targets.append((str(Path(python).absolute()), version))
    work, cache = args.work.resolve(), args.cache.resolve()
    # Each minor is one process at a time: two minors side by side use both cores.
    with ThreadPoolExecutor(max_workers=len(targets)) as pool:
        futures = [pool.submit(conform, py, version, work, cache) for py, version in targets]
        try:
            outcomes = [future.result() for future in futures]
        except ConformanceError as error:
            raise SystemExit(f"vllm-conformance: {error}") from None
    failed = False
    for lines, figures in outcomes:
        print("\n".join(lines))
        print(json.dumps(figures, sort_keys=True), flush=True)
        failed |= figures["problems"] > 0
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
