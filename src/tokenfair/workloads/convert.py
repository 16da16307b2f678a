"""Converters from public LLM traces into tokenfair trace records.

Supported formats (paths in, `list[TraceRecord]` out, sorted by arrival, ids `r0`..):

- BurstGPT CSV (`Timestamp`, `Model`, `Request tokens`, `Response tokens`,
  `Total tokens`, `Log Type`): Timestamp in seconds; optional filters by model and
  log type;
- Azure LLM inference CSV (`TIMESTAMP`, `ContextTokens`, `GeneratedTokens`): TIMESTAMP
  is a date-time (`2023-11-16 18:15:46.6805900`) or a number of seconds;
- Mooncake JSONL (`timestamp` in milliseconds, `input_length`, `output_length`,
  `hash_ids`): `hash_ids` name the prompt's blocks of 512 tokens, equal ids meaning an
  equal prefix, so they fill the prefix fields: a request's group is its client and
  first block id, its shared prefix the leading blocks it has in common with another
  request of that client (at most its prompt). Exact when a first block's sharers form
  one chain (the turns of a conversation, requests after one system prompt); where
  they branch into several shared continuations, the shared length is overstated for
  requests on different branches;
- ShareGPT-style JSON (a list of `{"id", "conversations": [{"from", "value"}, ...]}`):
  one request per conversation: the prompt is every turn up to and including the first
  human/user turn, the output is the model turn right after it. With `multiturn`, one
  request per human -> model exchange instead: turn k's prompt is the whole
  conversation so far (its prefix group, shared in full), and it arrives an
  exponential gap (mean `turn_gap_s`) after turn k-1. Token counts come from
  `count_tokens(text)`, by default `estimate_tokens`: ceil(characters / 4), the usual
  rule of thumb for English with GPT-style tokenizers (counted turn by turn in
  multi-turn mode, so a turn's prompt is exactly the previous prompt and answer plus
  its message). Conversations carry no times, so arrivals are drawn from an arrival
  process (default Poisson at 1 conversation/s, seeded).

Prefix groups are named after the client, so prefixes are never shared across clients
(a server salting its prefix cache per tenant would not share them either).

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
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from tokenfair.workloads.arrivals import ArrivalProcess, Poisson
from tokenfair.workloads.client_map import ClientMap
from tokenfair.workloads.jsonl import iter_json_objects, read_lines, show
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


MOONCAKE_BLOCK_TOKENS = 512


def convert_mooncake(
    path: str | Path,
    clients: ClientMap,
    *,
    speedup: float = 1.0,
    duration_s: float | None = None,
    limit: int | None = None,
    skip_invalid: bool = False,
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
) -> list[TraceRecord]:
    """Mooncake JSONL (timestamp ms, input_length, output_length, hash_ids)."""
    source = str(path)

    def build(obj: dict[str, Any]) -> SourceRow:
        for name in ("timestamp", "input_length", "output_length"):
            if name not in obj:
                raise RowError(f"missing field {name!r}")
        ids = obj.get("hash_ids", [])
        if not isinstance(ids, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in ids
        ):
            raise RowError(f"hash_ids must be a list of integers, got {show(ids)}")
        return SourceRow(
            0,
            parse_seconds("timestamp", obj["timestamp"], scale=1e-3),
            clients.client_for(obj),
            parse_count("input_length", obj["input_length"]),
            parse_count("output_length", obj["output_length"]),
            block_ids=tuple(ids),
        )

    lines = iter_json_objects(read_lines(path), source, ConvertError)
    rows = shared_block_prefixes(collect_rows(source, lines, build, skip_invalid), block_tokens)
    return finish_rows(rows, source, speedup=speedup, duration_s=duration_s, limit=limit)


def shared_block_prefixes(rows: Sequence[SourceRow], block_tokens: int) -> list[SourceRow]:
    """Fill each row's prefix fields from its block ids: its group is its client and
    first block, its shared prefix the leading blocks another row of its client has."""
    # Chain keys name a whole leading run of blocks, whatever ids a source reuses.
    sharers: Counter[int] = Counter()
    chains = []
    for row in rows:
        keys, key = [], hash(row.client)
        for block in row.block_ids:
            key = hash((key, block))
            keys.append(key)
        sharers.update(keys)
        chains.append(keys)
    filled = []
    for row, keys in zip(rows, chains, strict=True):
        shared = 0
        while shared < len(keys) and sharers[keys[shared]] >= 2:
            shared += 1
        if shared:
            row = replace(
                row,
                prefix_group=f"{row.client}/mooncake-{row.block_ids[0]}",
                prefix_tokens=min(row.input_tokens, shared * block_tokens),
            )
        filled.append(row)
    return filled


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
    multiturn: bool = False,
    turn_gap_s: float = 30.0,
) -> list[TraceRecord]:
    """ShareGPT-style conversations -> requests, conversations starting at `arrivals`.

    One request per conversation (its first exchange), or with `multiturn` one per
    exchange, turn k + 1 arriving an exponential gap of mean `turn_gap_s` after turn k.
    `arrivals` defaults to Poisson(1.0); `seed` seeds it and the gaps. `count_tokens`
    maps text to a token count (e.g. `lambda s: len(tokenizer(s).input_ids)`); default
    estimate_tokens. Conversations keep their file order; the i-th usable one starts
    at the i-th arrival.
    """
    if not (math.isfinite(turn_gap_s) and turn_gap_s > 0):
        raise ValueError(f"turn gap must be a finite number of seconds > 0, got {turn_gap_s}")
    source = str(path)
    count = count_tokens or estimate_tokens
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConvertError(source, exc.lineno, f"invalid JSON: {exc.msg}") from None
    if not isinstance(data, list):
        raise ConvertError(source, 1, "expected a JSON list of conversations")
    gaps = np.random.default_rng([seed, 1])

    def first_exchange(conv: Any) -> SourceRow:
        prompt, reply = _first_exchange(conv)
        return SourceRow(
            0,
            0.0,  # the conversation's start is added below
            clients.client_for(conv),
            parse_count("prompt token count", count(prompt)),
            parse_count("reply token count", count(reply)),
        )

    def turns(conv: Any) -> list[SourceRow]:
        client = clients.client_for(conv)
        rows, offset = [], 0.0
        for prompt, reply in _exchanges(conv, count):
            # The whole prompt is the conversation so far; its group is named below.
            rows.append(SourceRow(0, offset, client, prompt, reply, client, prompt))
            offset += float(gaps.exponential(turn_gap_s))
        return rows

    def located() -> Iterator[tuple[str, Any]]:
        for index, conv in enumerate(data):
            where = f"conversation {index}"
            if isinstance(conv, dict) and "id" in conv:
                where += f" (id {conv['id']!r})"
            yield where, conv

    rows = collect_rows(source, located(), turns if multiturn else first_exchange, skip_invalid)
    # Each conversation (its rows share `where`) starts at the next arrival.
    conversations = list(dict.fromkeys(row.where for row in rows))
    wanted = len(conversations) if limit is None else min(limit, len(conversations))
    starts = dict(
        zip(conversations, first_arrivals(arrivals or Poisson(1.0), wanted, seed), strict=False)
    )
    number = {where: index for index, where in enumerate(conversations)}
    timed = [
        replace(
            row,
            time_s=float(starts[row.where]) + row.time_s,
            prefix_group=None
            if row.prefix_group is None
            else f"{row.client}/conversation-{number[row.where]}",
        )
        for row in rows
        if row.where in starts
    ]
    return finish_rows(timed, source, speedup=speedup, duration_s=duration_s, limit=limit)


def _turns(conv: Any) -> list[tuple[str, str]]:
    """(role, text) of each turn of a conversation, checked."""
    if not isinstance(conv, dict):
        raise RowError(f"expected a conversation object, got {type(conv).__name__}")
    turns = conv.get("conversations")
    if not isinstance(turns, list):
        raise RowError("missing 'conversations' list")
    checked = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, Mapping) or not isinstance(turn.get("value"), str):
            raise RowError(f"turn {i} must be an object with a string 'value'")
        checked.append((str(turn.get("from", "")).lower(), turn["value"]))
    return checked


def _exchanges(conv: Any, count: Callable[[str], int]) -> list[tuple[int, int]]:
    """(prompt tokens, reply tokens) of each human -> model exchange, each prompt the
    whole conversation before the reply, counted turn by turn."""
    context = 0
    exchanges: list[tuple[int, int]] = []
    turns = _turns(conv)
    for i, (role, text) in enumerate(turns):
        context += count(text)
        following = turns[i + 1] if i + 1 < len(turns) else None
        if role in HUMAN_ROLES and following is not None and following[0] in MODEL_ROLES:
            reply = parse_count("reply token count", count(following[1]))
            exchanges.append((parse_count("prompt token count", context), reply))
    if not exchanges:
        raise RowError("no human turn followed by a model turn")
    return exchanges


def _first_exchange(conv: Any) -> tuple[str, str]:
    """(prompt text, reply text) of a conversation's first human -> model exchange."""
    turns = _turns(conv)
    prompt_parts: list[str] = []
    for i, (role, text) in enumerate(turns):
        prompt_parts.append(text)
        if role in HUMAN_ROLES:
            following = turns[i + 1] if i + 1 < len(turns) else None
            if following is not None and following[0] in MODEL_ROLES:
                return "\n".join(prompt_parts), following[1]
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
