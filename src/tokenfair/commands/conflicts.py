"""Options of `tokenfair serve` that exclude each other: given together, one would be
silently ignored, so the command refuses them in one line naming both (docs/server.md).
"""

from __future__ import annotations

from pathlib import Path

from tokenfair.engine.backends import backend_for


def conflicting_options(
    model: str,
    tenants: Path | None,
    tenant_from_user: bool,
    metrics_host: str | None,
    metrics_port: int | None,
    device: str | None,
    dtype: str | None,
    decode_kernel: str | None,
    preemption: str | None,
    swap_tokens: int | None,
    enable_prefix_caching: bool,
    charge_cached_tokens: float,
) -> str | None:
    """Two options of which one would be silently ignored, named together; or None."""
    if tenant_from_user and tenants is not None:
        return (
            "--tenant-from-user and --tenants exclude each other: with a tenants file the API "
            "key names the tenant and `user` is only a label; give one"
        )
    if metrics_host is not None and metrics_port is None:
        return "--metrics-host is the address of --metrics-port: give --metrics-port too"
    if not backend_for(model).takes_device and (
        device is not None or dtype is not None or decode_kernel is not None
    ):
        option = (
            "--device"
            if device is not None
            else "--dtype"
            if dtype is not None
            else "--decode-kernel"
        )
        return f"{option} is for a real model: --model {model} runs no model"
    if swap_tokens is not None and preemption != "swap":
        return "--swap-tokens sizes the swap area of --preemption swap: give that too"
    if charge_cached_tokens != 1.0 and not enable_prefix_caching:
        return (
            "--charge-cached-tokens prices prompt tokens served from the prefix cache: "
            "give --enable-prefix-caching too"
        )
    return None
