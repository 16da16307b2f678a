"""Converters from public LLM traces into tokenfair trace records.

Supported formats (paths in, `list[TraceRecord]` out, sorted by arrival, ids `r0`..):

- BurstGPT CSV (`Timestamp`, `Model`, `Request tokens`, `Response tokens`,
  `Total tokens`, `Log Type`): Timestamp in seconds; optional filters by model and
  log type;
- Azure LLM inference CSV (`TIMESTAMP`, `ContextTokens`, `GeneratedTokens`): TIMESTAMP
  is a date-time (`2023-11-16 18:15:46.6805900`) or a number of seconds;
- Mooncake JSONL (`timestamp` in milliseconds, `input_length`, `output_length`,
  `hash_ids`);
- ShareGPT-style JSON (a list of `{"id", "conversations": [{"from", "value"}, ...]}`):
  one request per conversation: the prompt is every turn up to and including the first
  human/user turn, the output is the model turn right after it. Token counts come from
  `count_tokens(text)`, by default `estimate_tokens`: ceil(characters / 4), the usual
  rule of thumb for English with GPT-style tokenizers. Conversations carry no times, so
  arrivals are drawn from an arrival process (default Poisson at 1 request/s, seeded).

Every converter takes an explicit `clients` ClientMap (column, hash of a column into N
clients, or a constant), and the common options: `speedup` (arrival times are divided
by it), `duration_s` (keep arrivals before it, after shifting the first to 0 and
speeding up), `limit` (keep the first N by arrival).

A row that cannot become a request (unparsable number, zero tokens, missing client
column, ...) raises `ConvertError` naming the file and line (or conversation). Real
traces do contain such rows (BurstGPT logs failed requests with 0 response tokens): pass
`skip_invalid=True` (`--skip-invalid` on the command line) to drop them; the number dropped is logged as a warning. Rows left
out by an explicit filter (model, log type, duration, limit) are not errors.
"""

from __future__ import annotations

import csv
import json
import logging
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tokenfair.workloads.arrivals import ArrivalProcess, Poisson
from tokenfair.workloads.client_map import ClientMap
from tokenfair.workloads.jsonl import iter_json_objects, read_lines
from tokenfair.workloads.source_rows import (
    ConvertError,
    RowError,
    SourceRow,
    collect_rows,
    finish_rows,
    parse_count,
    parse_datetime,
    parse_seconds,
)
from tokenfair.workloads.trace import TraceRecord

__all__ = [
    "ConvertError",
    "convert_azure",
    "convert_burstgpt",
    "convert_mooncake",
    "convert_sharegpt",
    "estimate_tokens",
    "first_arrivals",
]

logger = logging.getLogger(__name__)

HUMAN_ROLES = frozenset({"human", "user"})
MODEL_ROLES = frozenset({"gpt", "chatgpt", "assistant", "model", "bard", "bing"})


def estimate_tokens(text: str) -> int:
    """Token count estimate: ceil(len(text) / 4); 0 for empty text."""
    return math.ceil(len(text) / 4)


def _client_columns(clients: ClientMap) -> list[str]:
    """The source column a client map reads (without any [index] suffix)."""
    if clients.kind == "constant":
        return []
    column = clients.value
    return [column.split("[", 1)[0] if column.endswith("]") else column]


def _csv_rows(
    path: str | Path, required: Sequence[str]
) -> Iterator[tuple[int, dict[str, str] | RowError]]:
    """(line number, row) for each CSV data row, or a RowError for a ragged row.

    Header names are stripped (and a UTF-8 byte-order mark dropped); blank rows skipped.
    """
    source = str(path)
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            raise ConvertError(source, 1, "empty file: expected a CSV header")
        names = [h.strip().lstrip("\ufeff") for h in header]
        missing = [c for c in required if c not in names]
        if missing:
            raise ConvertError(source, 1, f"missing column(s) {missing}; found {names}")
        for cells in reader:
            if not any(cell.strip() for cell in cells):
                continue
            if len(cells) != len(names):
                yield reader.line_num, RowError(f"expected {len(names)} cells, got {len(cells)}")
            else:
                yield reader.line_num, dict(zip(names, cells, strict=True))


def convert_burstgpt(
    path: str | Path,
    clients: ClientMap,
    *,
    models: Iterable[str] | None = None,
    log_type: str | None = None,
    speedup: float = 1.0,
    duration_s: float | None = None,
    limit: int | None = None,
    skip_invalid: bool = False,
) -> list[TraceRecord]:
    """BurstGPT CSV -> records. `models`/`log_type` keep only matching rows."""
    wanted_models = None if models is None else set(models)
    required = ["Timestamp", "Request tokens", "Response tokens", *_client_columns(clients)]
    if wanted_models is not None:
        required.append("Model")
    if log_type is not None:
        required.append("Log Type")

    def build(row: dict[str, str]) -> SourceRow | None:
        if wanted_models is not None and row["Model"].strip() not in wanted_models:
            return None
        if log_type is not None and row["Log Type"].strip() != log_type:
            return None
        return SourceRow(
            0,
            parse_seconds("Timestamp", row["Timestamp"]),
            clients.client_for(row),
            parse_count("Request tokens", row["Request tokens"]),
            parse_count("Response tokens", row["Response tokens"]),
        )

    rows = collect_rows(str(path), _csv_rows(path, required), build, skip_invalid)
    return finish_rows(rows, str(path), speedup=speedup, duration_s=duration_s, limit=limit)


def convert_azure(
    path: str | Path,
    clients: ClientMap,
    *,
    speedup: float = 1.0,
    duration_s: float | None = None,
    limit: int | None = None,
    skip_invalid: bool = False,
) -> list[TraceRecord]:
    """Azure LLM inference trace CSV (TIMESTAMP, ContextTokens, GeneratedTokens)."""
    required = ["TIMESTAMP", "ContextTokens", "GeneratedTokens", *_client_columns(clients)]

    def build(row: dict[str, str]) -> SourceRow:
        return SourceRow(
            0,
            parse_datetime("TIMESTAMP", row["TIMESTAMP"]),
            clients.client_for(row),
            parse_count("ContextTokens", row["ContextTokens"]),
            parse_count("GeneratedTokens", row["GeneratedTokens"]),
        )

    rows = collect_rows(str(path), _csv_rows(path, required), build, skip_invalid)
    return finish_rows(rows, str(path), speedup=speedup, duration_s=duration_s, limit=limit)


def convert_mooncake(
    path: str | Path,
    clients: ClientMap,
    *,
    speedup: float = 1.0,
    duration_s: float | None = None,
    limit: int | None = None,
    skip_invalid: bool = False,
) -> list[TraceRecord]:
    """Mooncake JSONL (timestamp ms, input_length, output_length, hash_ids)."""
    source = str(path)

    def build(obj: dict[str, Any]) -> SourceRow:
        for name in ("timestamp", "input_length", "output_length"):
            if name not in obj:
                raise RowError(f"missing field {name!r}")
        return SourceRow(
            0,
            parse_seconds("timestamp", obj["timestamp"], scale=1e-3),
            clients.client_for(obj),
            parse_count("input_length", obj["input_length"]),
            parse_count("output_length", obj["output_length"]),
        )

    lines = iter_json_objects(read_lines(path), source, ConvertError)
    rows = collect_rows(source, lines, build, skip_invalid)
    return finish_rows(rows, source, speedup=speedup, duration_s=duration_s, limit=limit)


def convert_sharegpt(
    path: str | Path,
    clients: ClientMap,
    *,
    arrivals: ArrivalProcess | None = None,
    seed: int = 0,
    count_tokens: Callable[[str], int] | None = None,
    speedup: float = 1.0,
    duration_s: float | None = None,
    limit: int | None = None,
    skip_invalid: bool = False,
) -> list[TraceRecord]:
    """ShareGPT-style conversations -> one request each, arrivals drawn from `arrivals`.

    `arrivals` defaults to Poisson(1.0); `seed` seeds it. `count_tokens` maps text to a
    token count (e.g. `lambda s: len(tokenizer(s).input_ids)`); default estimate_tokens.
    Conversations keep their file order; the i-th usable one gets the i-th arrival.
    """
    source = str(path)
    count = count_tokens or estimate_tokens
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConvertError(source, exc.lineno, f"invalid JSON: {exc.msg}") from None
    if not isinstance(data, list):
        raise ConvertError(source, 1, "expected a JSON list of conversations")

    def build(conv: Any) -> SourceRow:
        prompt, reply = _first_exchange(conv)
        return SourceRow(
            0,
            0.0,  # arrival assigned below
            clients.client_for(conv),
            parse_count("prompt token count", count(prompt)),
            parse_count("reply token count", count(reply)),
        )

    def located() -> Iterator[tuple[str, Any]]:
        for index, conv in enumerate(data):
            where = f"conversation {index}"
            if isinstance(conv, dict) and "id" in conv:
                where += f" (id {conv['id']!r})"
            yield where, conv

    rows = collect_rows(source, located(), build, skip_invalid)
    wanted = len(rows) if limit is None else min(limit, len(rows))
    times = first_arrivals(arrivals or Poisson(1.0), wanted, seed)
    timed = [
        SourceRow(row.where, float(t), row.client, row.input_tokens, row.output_tokens)
        for row, t in zip(rows[:wanted], times, strict=True)
    ]
    return finish_rows(timed, source, speedup=speedup, duration_s=duration_s, limit=limit)


def _first_exchange(conv: Any) -> tuple[str, str]:
    """(prompt text, reply text) of a conversation's first human -> model exchange."""
    if not isinstance(conv, dict):
        raise RowError(f"expected a conversation object, got {type(conv).__name__}")
    turns = conv.get("conversations")
    if not isinstance(turns, list):
        raise RowError("missing 'conversations' list")
    prompt_parts: list[str] = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, Mapping) or not isinstance(turn.get("value"), str):
            raise RowError(f"turn {i} must be an object with a string 'value'")
        role = str(turn.get("from", "")).lower()
        prompt_parts.append(turn["value"])
        if role in HUMAN_ROLES:
            following = turns[i + 1] if i + 1 < len(turns) else None
            if (
                isinstance(following, Mapping)
                and str(following.get("from", "")).lower() in MODEL_ROLES
                and isinstance(following.get("value"), str)
            ):
                return "\n".join(prompt_parts), following["value"]
            raise RowError(f"turn {i} (human) is not followed by a model turn")
    raise RowError("no human turn followed by a model turn")


def first_arrivals(process: ArrivalProcess, count: int, seed: int = 0) -> np.ndarray:
    """The first `count` arrival times of a process started at 0 (deterministic)."""
    if count <= 0:
        return np.empty(0)
    horizon = float(count)
    for _ in range(64):
        times = process.times(np.random.default_rng(seed), 0.0, horizon)
        if len(times) >= count:
            return times[:count]
        horizon *= 2
    raise ValueError(f"arrival process {process!r} yields fewer than {count} arrivals")
