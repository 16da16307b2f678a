"""A user's policy module and an installed distribution, written into a test's tmp_path.

`install_module` puts `tf_user_policies` on sys.path (for the drivers run in-process;
a subprocess gets the folder on PYTHONPATH); `install_distribution` adds a fake
distribution whose `entry_points.txt` names policies under `tokenfair.policies`, which
importlib.metadata finds on sys.path as it would a pip-installed one.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

MODULE = "tf_user_policies"

SOURCE = '''
from collections import deque

from tokenfair.core.policies import KeyedPolicy, Needs, Policy


class Newest(KeyedPolicy):
    """Newest arrival first (last come, first served).

    A second line the listing leaves out.
    """

    needs = Needs(weights=True)

    def __init__(self, settings, scale=1.0, tag=""):
        super().__init__()
        if scale <= 0:
            raise ValueError(f"scale must be > 0, got {scale}")
        self.settings = settings
        self.scale = scale
        self.tag = tag
        self.admitted = []

    def sort_key(self, request, band):
        return (band, -request.arrival_s * self.scale)

    def on_admit(self, request, first_time, now):
        self.admitted.append(request.request_id)


class OldStyle(KeyedPolicy):
    """Says it reads weights as classes did before declarations."""

    uses_weights = True

    def sort_key(self, request, band):
        return (band, request.arrival_s)


class NotInVllm(Newest):
    """Declares that it cannot run inside vLLM."""

    needs = Needs(weights=True, vllm=False)


class Broken(Newest):
    """Fails once it has admitted three requests (a bug in a hook)."""

    def on_admit(self, request, first_time, now):
        super().on_admit(request, first_time, now)
        if len(self.admitted) == 3:
            raise ZeroDivisionError("the third admission")


class OwnCharge(Newest):
    """Sets its own cached-token charge."""

    charge_cached_tokens = 0.25


class Cached(Newest):
    """Orders by what the prefix cache holds (asks for it)."""

    def attach_prefix_cache(self, cache):
        self.cache = cache


class DeclaresTheCache(Newest):
    """Orders by what the prefix cache holds (declares it)."""

    needs = Needs(weights=True, prefix_cache=True)


class Plain(Policy):
    """First in, first out, without a sort key."""

    def __init__(self, settings):
        self._queue = deque()

    def add(self, request, now):
        self._queue.append(request)

    def requeue(self, request):
        self._queue.appendleft(request)

    def peek(self):
        return self._queue[0] if self._queue else None

    def pop(self):
        return self._queue.popleft()

    def remove(self, request):
        self._queue.remove(request)

    def __len__(self):
        return len(self._queue)

    def waiting_requests(self):
        return list(self._queue)


class NotAPolicy:
    pass
'''

ENTRY_POINTS = f"""[tokenfair.policies]
newest = {MODULE}:Newest
plain = {MODULE}:Plain
broken = tf_no_such_policy_module:Thing
vtc = {MODULE}:Newest
"""


def install_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Write the module into tmp_path and make it importable; returns its name."""
    (tmp_path / f"{MODULE}.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, MODULE, raising=False)  # and gone again after
    return MODULE


def install_distribution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The module plus a distribution `tf-user-policies` naming its policies."""
    install_module(tmp_path, monkeypatch)
    info = tmp_path / "tf_user_policies-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tf-user-policies\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
