"""The tenants file, re-read inside vLLM when it changes.

The gateway re-reads its tenants file on SIGHUP; vLLM's engine core runs in a process
of its own whose signals are vLLM's, so the plugin looks at the file instead: at most
every `tenants_reload_s` seconds, from the scheduling loop, one `stat`, and a read only
when its modification time or size changed (a Kubernetes Secret or ConfigMap volume
swaps a symlink, which changes both). A file that does not parse, or that moves a
tenant to another group, is refused with one log line and the weights in force stay,
as the gateway does.
"""

from __future__ import annotations

import logging
import os
import time

from tokenfair.core.policies import Policy
from tokenfair.core.share_tree import ShareTree, tree_change
from tokenfair.edge.tenants import TenantsFileError, load_tenants


def _stamp(path: str) -> tuple[int, int] | None:
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_mtime_ns, status.st_size


class TenantsFileWatch:
    def __init__(
        self, path: str, policy: Policy, tree: ShareTree, interval_s: float, log: logging.Logger
    ) -> None:
        self.path = path
        self.policy = policy
        self.interval_s = interval_s
        self._log = log
        self._tree = tree
        self._stamp = _stamp(path)
        self._checked = time.monotonic()

    def poll(self, now: float | None = None) -> bool:
        """Re-read the file if it changed since the last look; True when new weights were
        put in force."""
        now = time.monotonic() if now is None else now
        if self.interval_s <= 0 or now - self._checked < self.interval_s:
            return False
        self._checked = now
        stamp = _stamp(self.path)
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            file = load_tenants(self.path)
        except TenantsFileError as error:
            self._log.error("tenants file not reloaded, the weights in force stay: %s", error)
            return False
        tree = file.share_tree()
        problem = tree_change(self._tree, tree)
        if problem is not None:
            self._log.error(
                "tenants file not reloaded, the weights in force stay: %s: restart vLLM to "
                "apply a new shape of the group tree",
                problem,
            )
            return False
        self.policy.reweigh(file.weights(), tree)
        self._tree = tree
        self._log.info("tenants file reloaded: %d tenant(s)", len(file.tenants))
        return True
