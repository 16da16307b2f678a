"""vLLM's own scheduler tests, taken from a vLLM release's source distribution.

The conformance suite runs vLLM's `tests/v1/core/test_scheduler.py` and
`test_async_scheduler.py` with tokenfair's scheduler in place of vLLM's. Those tests are not copied into this repository: this
module downloads the release's sdist from the package registry (PyPI's simple API,
or `PIP_INDEX_URL`), checks its sha256 against the index, keeps it in a cache
folder, and extracts only the files the scheduler tests need.

    python -m tests.integrations.vllm_conformance.sdist 0.33.0 DEST [--cache DIR]

prints the folder that holds vLLM's `tests/` package for that release.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import tarfile
import urllib.request
from pathlib import Path

# The scheduler tests, what they import from vLLM's tests, and the package markers.
TEST_FILES = (
    "tests/__init__.py",
    "tests/v1/__init__.py",
    "tests/v1/core/__init__.py",
    "tests/v1/core/test_scheduler.py",
    "tests/v1/core/test_async_scheduler.py",
    "tests/v1/core/utils.py",
    "tests/v1/core/test_prefix_caching.py",
    "tests/v1/kv_connector/__init__.py",
    "tests/v1/kv_connector/unit/__init__.py",
    "tests/v1/kv_connector/unit/utils.py",
)
DEFAULT_INDEX = "https://pypi.org/simple"


class SdistError(RuntimeError):
    """The release's sdist could not be had or does not hold the scheduler tests."""


def _index_url() -> str:
    return os.environ.get("PIP_INDEX_URL", DEFAULT_INDEX).rstrip("/")


def _sdist_entry(version: str) -> tuple[str, str, str]:
    """(file name, url, sha256) of vllm-VERSION.tar.gz from the index's JSON page."""
    request = urllib.request.Request(
        f"{_index_url()}/vllm/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            page = json.load(response)
    except OSError as error:
        raise SdistError(f"cannot read the package index for vllm: {error}") from None
    name = f"vllm-{version}.tar.gz"
    for entry in page.get("files", []):
        if entry.get("filename") == name:
            sha256 = entry.get("hashes", {}).get("sha256")
            if not sha256:
                raise SdistError(f"the index gives no sha256 for {name}")
            url = urllib.parse.urljoin(f"{_index_url()}/vllm/", entry["url"])
            return name, url, sha256
    raise SdistError(f"the index has no source distribution {name}")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download(version: str, cache: Path) -> Path:
    """The sdist in `cache`, downloaded once (a cached file is trusted by name)."""
    cache.mkdir(parents=True, exist_ok=True)
    cached = cache / f"vllm-{version}.tar.gz"
    if cached.exists():
        return cached
    name, url, sha256 = _sdist_entry(version)
    partial = cache / f"{name}.partial"
    try:
        with urllib.request.urlopen(url, timeout=300) as response, partial.open("wb") as out:
            shutil.copyfileobj(response, out)
    except OSError as error:
        partial.unlink(missing_ok=True)
        raise SdistError(f"cannot download {name}: {error}") from None
    if _sha256(partial) != sha256:
        partial.unlink()
        raise SdistError(f"{name}: sha256 differs from the index's")
    partial.rename(cached)
    return cached


def extract(sdist: Path, version: str, dest: Path) -> Path:
    """Extract TEST_FILES into dest/vllm-VERSION/ (afresh); return that folder."""
    root = dest / f"vllm-{version}"
    if root.exists():
        shutil.rmtree(root)
    prefix = f"vllm-{version}/"
    wanted = {prefix + name for name in TEST_FILES}
    with tarfile.open(sdist) as archive:
        members = [m for m in archive.getmembers() if m.name in wanted and m.isfile()]
        missing = wanted - {m.name for m in members}
        if missing:
            raise SdistError(f"{sdist.name} lacks {', '.join(sorted(missing))}")
        archive.extractall(dest, members=members, filter="data")
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("version")
    parser.add_argument("dest", type=Path)
    parser.add_argument("--cache", type=Path, default=Path(".cache/vllm-sdist"))
    args = parser.parse_args()
    try:
        print(extract(download(args.version, args.cache), args.version, args.dest))
    except SdistError as error:
        raise SystemExit(f"vllm-conformance: {error}") from None


if __name__ == "__main__":
    main()
