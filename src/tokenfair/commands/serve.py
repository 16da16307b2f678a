"""`tokenfair serve`: the OpenAI-compatible server (FastAPI + uvicorn)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape

from tokenfair.commands.common import (
    LOG_FORMAT,
    SHARE_MEMORY_HELP,
    SHARE_SEATS_HELP,
    STEP_SHARE_HELP,
    ShutdownTimeout,
    require_extra,
)
from tokenfair.commands.conflicts import conflicting_options
from tokenfair.commands.serving import Listen, run_server, summary
from tokenfair.edge.defaults import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_STREAM_BUFFER_BYTES,
    DEFAULT_READ_TIMEOUT_S,
)

if TYPE_CHECKING:
    pass

# One line however long (a policy spec, a path), never read as markup.
console = Console(stderr=True, soft_wrap=True)
log = logging.getLogger("tokenfair.serve")


ENGINE_ARRANGEMENTS = ("auto", "process", "thread")


def engine_arrangement(choice: str, model: str) -> str:
    """`process` or `thread`. auto: a real model's engine steps in its own process, so
    its Python never waits for the event loop's GIL (docs/server.md: 7.5% more
    tokens/s, the median of paired rounds); sim:'s engine only sleeps through its
    steps, and the extra hop to another process would cost it latency instead."""
    if choice not in ENGINE_ARRANGEMENTS:
        raise ValueError(
            f"--engine must be one of {', '.join(ENGINE_ARRANGEMENTS)}, got {choice!r}"
        )
    if choice != "auto":
        return choice
    from tokenfair.engine.backends import backend_for

    return backend_for(model).engine_mode


def _fail(message: str) -> typer.Exit:
    console.print(f"[red]error:[/red] {escape(message)}")
    return typer.Exit(code=2)


def serve(
    model: Annotated[
        str,
        typer.Option(help="builtin:tiny, a local transformers model directory, or sim:PROFILE."),
    ] = "builtin:tiny",
    policy: Annotated[
        str,
        typer.Option(
            help="Scheduling policy: vtc, fcfs, priority, rpm:N, ..., or your own: "
            "mypkg.mod:MyPolicy(key=value)"
        ),
    ] = "vtc",
    tenants: Annotated[
        Path | None, typer.Option(help="Tenants file (YAML); without it one open tenant.")
    ] = None,
    tenant_from_user: Annotated[
        bool,
        typer.Option(
            help="Without --tenants: one tenant per request `user` field (trusted networks only)."
        ),
    ] = False,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            help="A second port serving /metrics and /health only, without a key (bind it "
            "where only your monitoring reaches). Without it, /metrics on --port needs the "
            "admin key when a tenants file is given."
        ),
    ] = None,
    metrics_host: Annotated[
        str | None, typer.Option(help="Address of --metrics-port (default: --host).")
    ] = None,
    served_model_name: Annotated[
        str | None, typer.Option(help="The model id clients send (default: --model as given).")
    ] = None,
    kv_tokens: Annotated[
        int | None,
        typer.Option(
            help="KV pool size in tokens (default: from free memory; builtin: 65,536; "
            "sim: 1,000,000)."
        ),
    ] = None,
    max_num_seqs: Annotated[int | None, typer.Option(help="Most requests running at once.")] = None,
    share_seats: Annotated[bool, typer.Option(help=SHARE_SEATS_HELP)] = True,
    share_memory: Annotated[bool, typer.Option(help=SHARE_MEMORY_HELP)] = True,
    step_share_tokens: Annotated[int, typer.Option(help=STEP_SHARE_HELP, min=0)] = 768,
    max_batched_tokens: Annotated[int | None, typer.Option(help="Most tokens per step.")] = None,
    block_size: Annotated[
        int | None,
        typer.Option(help="KV block size in tokens (default: 64 for a model on the CPU, else 16)."),
    ] = None,
    preemption: Annotated[str | None, typer.Option(help="recompute | swap.")] = None,
    admission: Annotated[str | None, typer.Option(help="optimistic | reserve.")] = None,
    swap_tokens: Annotated[int | None, typer.Option(help="Host swap area in tokens.")] = None,
    enable_prefix_caching: Annotated[
        bool,
        typer.Option(
            help="Reuse cached prompt blocks (isolated per tenant unless the tenants file shares them)."
        ),
    ] = False,
    charge_cached_tokens: Annotated[
        float,
        typer.Option(
            help="What a prompt token served from the prefix cache costs a tenant, as a "
            "share of a computed one: 1 the prompt as sent (the paper's cost), 0 only "
            "what is computed.",
            min=0.0,
            max=1.0,
        ),
    ] = 1.0,
    device: Annotated[
        str | None, typer.Option(help="cpu or cuda (default: cuda when available).")
    ] = None,
    dtype: Annotated[
        str | None, typer.Option(help="float32, bfloat16, float16 (default: the model's).")
    ] = None,
    decode_kernel: Annotated[
        str | None,
        typer.Option(
            help="The decodes' attention: c (the CPU kernel reading the KV pool in place), "
            "triton (the GPU kernel doing the same; opt-in until measured on GPUs), torch "
            "(gathers and SDPA). Default: c on float32 CPU models, torch elsewhere.",
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Sampling seed of the executor.")] = 0,
    default_max_tokens: Annotated[
        int, typer.Option(help="max_tokens for requests that send none (sim: their output length).")
    ] = 256,
    max_body_bytes: Annotated[
        int, typer.Option(help="Largest request body; bigger ones get 413.")
    ] = DEFAULT_MAX_BODY_BYTES,
    max_stream_buffer_bytes: Annotated[
        int,
        typer.Option(
            help="Bytes of events a stream may hold for a client reading slower than its "
            "tokens come (beyond the kernel's socket buffer); past it the stream is cut "
            "with an error event and its generation stopped (at least 64 KiB).",
        ),
    ] = DEFAULT_MAX_STREAM_BUFFER_BYTES,
    read_timeout: Annotated[
        float,
        typer.Option(
            help="Seconds a client has to send a request's headers, and may pause while "
            "sending its body; past it the connection is closed.",
            min=0.001,
        ),
    ] = DEFAULT_READ_TIMEOUT_S,
    body_timeout: Annotated[
        float,
        typer.Option(
            help="Seconds a client has, from the end of a request's headers, to send its "
            "whole body; past it the connection is closed.",
            min=0.001,
        ),
    ] = DEFAULT_BODY_TIMEOUT_S,
    api_docs: Annotated[
        bool,
        typer.Option(
            "--api-docs",
            help="Serve /openapi.json, /docs and /redoc (off by default: they would be "
            "open to anyone who reaches --port).",
        ),
    ] = False,
    max_waiting: Annotated[
        int, typer.Option(help="Requests waiting across tenants before 503.")
    ] = 4096,
    request_timeout: Annotated[
        float | None,
        typer.Option(help="Seconds before a request is aborted (tenants may override)."),
    ] = 600.0,
    shutdown_timeout: ShutdownTimeout = 5,
    engine: Annotated[
        str,
        typer.Option(
            help="Where the engine steps: process (its own, beside the server's), thread (of "
            "the server process: one GIL for both), auto (process for real models, thread "
            "for sim:)."
        ),
    ] = "auto",
    log_level: Annotated[str, typer.Option(help="debug, info, warning, error.")] = "info",
) -> None:
    """Serve a model over the OpenAI API with fair sharing between tenants.

    Example: tokenfair serve --model sim:a10g-llama-7b --policy vtc --tenants tenants.yaml --port 8000
    """
    from tokenfair.engine.backends import DECODE_KERNELS

    if decode_kernel is not None and decode_kernel not in DECODE_KERNELS:
        *others, last = DECODE_KERNELS
        names = f"{', '.join(others)} or {last}"
        raise _fail(f"--decode-kernel is {names}, not {decode_kernel!r}")
    if metrics_port is not None and metrics_port == port:
        # The server tells the two apart by the port a request came in on.
        raise _fail(f"--metrics-port must differ from --port ({port})")
    conflict = conflicting_options(
        model, tenants, tenant_from_user, metrics_host, metrics_port, device, dtype,
        decode_kernel, preemption, swap_tokens, enable_prefix_caching, charge_cached_tokens,
    )  # fmt: skip
    if conflict is not None:
        raise _fail(conflict)
    require_extra("tokenfair serve", "server")
    from tokenfair.engine.backends import backend_for

    extra = backend_for(model).extra
    if extra is not None:
        require_extra(
            f"tokenfair serve --model {model}",
            extra,
            hint="; or serve a simulated model: --model sim:a10g-llama-7b",
        )
    from tokenfair.core.scheduler import ConfigError
    from tokenfair.core.scheduler_config import SchedulerOverrides
    from tokenfair.edge.directory import TenantDirectory
    from tokenfair.edge.tenants import TenantsFileError, load_tenants
    from tokenfair.engine.backends import BuildOptions
    from tokenfair.engine.engine_client import EngineClient
    from tokenfair.engine.engine_process import EngineProcess
    from tokenfair.server.app import create_app
    from tokenfair.server.model import ModelPlan, build_engine_and_card
    from tokenfair.server.state import ServerConfig

    logging.basicConfig(level=log_level.upper(), format=LOG_FORMAT)
    try:
        if tenants is not None:
            directory = TenantDirectory(load_tenants(tenants))
        else:
            directory = TenantDirectory.open(tenant_from_user)
        banded = sorted({t.name for t in directory.tenants if t.band})
        if banded:
            logging.getLogger("tokenfair.server").warning(
                "tenants %s set a band: bands are the gateway's flow control; this server "
                "shares by weight and groups only",
                ", ".join(banded[:5]),
            )
        config = ServerConfig(
            default_max_tokens=default_max_tokens,
            max_body_bytes=max_body_bytes,
            max_stream_buffer_bytes=max_stream_buffer_bytes,
            max_waiting_total=max_waiting,
            request_timeout_s=request_timeout,
            tenants_path=tenants,
            tenant_from_user=tenant_from_user,
            metrics_port=metrics_port,
            api_docs=api_docs,
        )
        given = {
            "max_num_seqs": max_num_seqs,
            "max_batched_tokens": max_batched_tokens,
            "block_size": block_size,
            "preemption": preemption,
            "admission": admission,
            "swap_tokens": swap_tokens,
        }
        scheduler = SchedulerOverrides.of(
            **{key: value for key, value in given.items() if value is not None},
            share_seats=share_seats,
            share_memory=share_memory,
            enable_prefix_caching=enable_prefix_caching,
            step_share_tokens=step_share_tokens or None,  # 0: no limit
        )
        plan = ModelPlan(
            model,
            policy,
            directory.weights(),
            directory.tree,
            served_model_name,
            charge_cached_tokens,
            BuildOptions(kv_tokens, device, dtype, seed, scheduler, decode_kernel),
        )
        runner: EngineClient | None = None
        arrangement = engine_arrangement(engine, model)
        if arrangement == "thread":
            served = plan.served_model()
        else:
            runner = EngineProcess.launch(
                build_engine_and_card, {"plan": plan}, log_level=log_level
            )
            served = runner.card
    except (TenantsFileError, ConfigError, ValueError, OSError) as error:
        raise _fail(str(error)) from None
    from tokenfair.server.intake import Intake

    app = create_app(served, directory, config, runner)
    intake = Intake()
    app.state.server.engine.urgent_work = intake.pending
    log.info(
        "%s",
        summary(served.name, model, policy, arrangement, served.kv_tokens, directory, tenants,
                host, port, metrics_port, api_docs),
    )  # fmt: skip
    if tenants is not None and metrics_port is None and not directory.admin_enabled:
        log.warning(
            "/metrics is not served: it shows every tenant's usage, so it needs "
            "--metrics-port, or an admin key (admin_key_sha256) in the tenants file"
        )
    listen = Listen(
        host, port, metrics_host, metrics_port, read_timeout, body_timeout,
        shutdown_timeout, log_level,
    )  # fmt: skip
    run_server(app, intake, listen, reload_on_hangup=tenants is not None)
