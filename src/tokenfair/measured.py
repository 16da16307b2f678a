"""Results measured on real systems, read as ResultRecords so our metrics can score them.

Two formats:

- tokenfair's reference files (`shared/reference/*_measured.jsonl`): one trace record a
  line plus `ttft_s` and `latency_s`, both measured from arrival;
- the paper artifact's `all_results_<workload>.jsonl` (VTC-artifact, fair_bench/): one
  JSON object holding `result.responses`, each with `adapter_dir` (the client),
  `req_time`, `prompt_len`, `output_len`, `first_token_latency` and `request_latency`
  (-1 for a request that was rejected or aborted before starting).

Neither records admission time, so `scheduled_s` is null and the metrics take the first
token as the end of waiting.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tokenfair.results import ResultError, ResultRecord
from tokenfair.workloads.jsonl import (
    FieldError,
    check_float,
    check_int,
    check_str,
    iter_json_objects,
    read_lines,
    require,
)


def _measured(obj: Mapping[str, Any], default_id: str) -> ResultRecord:
    arrival = check_float("arrival_s", require(obj, "arrival_s"), 0.0)
    ttft = check_float("ttft_s", require(obj, "ttft_s"), 0.0)
    latency = check_float("latency_s", require(obj, "latency_s"), ttft)
    return ResultRecord(
        request_id=check_str("request_id", obj.get("request_id", default_id)),
        client=check_str("client", require(obj, "client")),
        arrival_s=arrival,
        input_tokens=check_int("input_tokens", require(obj, "input_tokens"), 1),
        output_tokens=check_int("output_tokens", require(obj, "output_tokens"), 0),
        first_token_s=arrival + ttft,
        finish_s=arrival + latency,
        status="finished",
        finish_reason="stop",
    )


def read_measured_reference(path: str | Path) -> list[ResultRecord]:
    """Read a `*_measured.jsonl` reference file (trace fields + ttft_s, latency_s)."""
    records = []
    source = str(path)
    for number, obj in iter_json_objects(read_lines(path), source, ResultError):
        try:
            records.append(_measured(obj, default_id=f"r{number - 1}"))
        except (FieldError, ValueError) as exc:
            raise ResultError(source, number, str(exc)) from None
    return records


def _artifact_response(resp: Mapping[str, Any], index: int) -> ResultRecord:
    arrival = check_float("req_time", require(resp, "req_time"), 0.0)
    first = check_float("first_token_latency", require(resp, "first_token_latency"))
    latency = check_float("request_latency", require(resp, "request_latency"))
    started = first != -1
    return ResultRecord(
        request_id=f"r{index}",
        client=check_str("adapter_dir", require(resp, "adapter_dir")),
        arrival_s=arrival,
        input_tokens=check_int("prompt_len", require(resp, "prompt_len"), 1),
        # A rejected response's output_len is what the trace asked for; none was made.
        output_tokens=check_int("output_len", require(resp, "output_len"), 0) if started else 0,
        first_token_s=arrival + first if started else None,
        finish_s=arrival + latency if started else arrival,
        status="finished",
        finish_reason="stop" if started else "rejected",
    )


def read_artifact_results(path: str | Path, experiment: int = 0) -> list[ResultRecord]:
    """Read one experiment (a line) of a VTC-artifact `all_results_*.jsonl` file.

    Responses with `first_token_latency == -1` become rejected requests (no service,
    zero output tokens).
    """
    source = str(path)
    experiments = list(iter_json_objects(read_lines(path), source, ResultError))
    if not 0 <= experiment < len(experiments):
        raise ValueError(f"{source}: no experiment {experiment} (has {len(experiments)})")
    number, obj = experiments[experiment]
    responses = obj.get("result", {}).get("responses")
    if not isinstance(responses, list):
        raise ResultError(source, number, "missing result.responses list")
    records = []
    for index, resp in enumerate(responses):
        try:
            if not isinstance(resp, dict):
                raise FieldError(f"expected a JSON object, got {type(resp).__name__}")
            rec = _artifact_response(resp, index)
        except ValueError as exc:
            raise ResultError(source, number, f"response {index}: {exc}") from None
        records.append(rec)
    return records
