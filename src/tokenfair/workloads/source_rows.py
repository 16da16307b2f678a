"""Rows read from a public trace, on their way to trace records.

The converters (tokenfair.workloads.convert) read each source's rows into `SourceRow`s
with the parsers here (token counts, seconds, date-times), `collect_rows` drops or
refuses the bad ones (naming the file and line), and `finish_rows` turns the rest into
numbered TraceRecords: first arrival at 0, sped up, cut to a duration or a count.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from tokenfair.workloads.trace import TraceRecord

logger = logging.getLogger("tokenfair.workloads.convert")


class ConvertError(ValueError):
    """A source row cannot be converted. str() reads `path:where: message`."""

    def __init__(self, path: str, where: int | str, message: str) -> None:
        super().__init__(f"{path}:{where}: {message}")
        self.path = path
        self.where = where
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.path, self.where, self.message))


class RowError(ValueError):
    """One row is unusable; the converter adds where it is."""


@dataclass(frozen=True, slots=True)
class SourceRow:
    where: int | str  # line number or "conversation <i>"
    time_s: float  # source clock, before shifting
    client: str
    input_tokens: int
    output_tokens: int
    prefix_group: str | None = None  # the trace's shared-prefix fields, when known
    prefix_tokens: int | None = None
    # The source's ids of the prompt's blocks, equal ids for an equal prefix (Mooncake).
    block_ids: tuple[int, ...] = ()


def parse_count(name: str, value: Any) -> int:
    """A token count >= 1 from a CSV cell ("12", "12.0") or a JSON number."""
    count: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        count = value
    elif isinstance(value, float) and value.is_integer():
        count = int(value)
    elif isinstance(value, str):
        text = value.strip()
        try:
            count = int(text)
        except ValueError:
            try:
                number = float(text)
            except ValueError:
                number = math.nan
            count = int(number) if number.is_integer() else None
    if count is None or count < 1:
        raise RowError(f"{name} must be an integer >= 1, got {value!r}")
    return count


def parse_seconds(name: str, value: Any, scale: float = 1.0) -> float:
    """A finite time from a number or numeric text, multiplied by scale."""
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number):
        raise RowError(f"{name} must be a number, got {value!r}")
    return number * scale


def parse_datetime(name: str, value: Any) -> float:
    """A date-time (ISO-like, any fraction digits) or plain seconds, as epoch seconds."""
    if isinstance(value, str):
        text = value.strip()
        try:
            return float(text)
        except ValueError:
            pass
        head, dot, frac = text.partition(".")
        # fromisoformat takes at most 6 fraction digits on some Pythons: trim the rest.
        digits = len(frac) - len(frac.lstrip("0123456789"))
        if dot and digits > 6:
            text = f"{head}.{frac[:6]}{frac[digits:]}"
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            raise RowError(f"{name} must be a date-time or seconds, got {value!r}") from None
        if moment.tzinfo is None:
            # Naive times are taken as UTC; only differences matter.
            return (moment - datetime(1970, 1, 1)).total_seconds()
        return moment.timestamp()
    return parse_seconds(name, value)


def finish_rows(
    rows: Iterable[SourceRow],
    source: str,
    *,
    speedup: float,
    duration_s: float | None,
    limit: int | None,
) -> list[TraceRecord]:
    """Shift the first arrival to 0, speed up, cut, sort and number the requests."""
    if not (math.isfinite(speedup) and speedup > 0):
        raise ValueError(f"speedup must be a finite number > 0, got {speedup}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    items = sorted(rows, key=lambda r: r.time_s)  # stable: file order on ties
    if not items:
        return []
    origin = items[0].time_s
    records: list[TraceRecord] = []
    for row in items:
        arrival = (row.time_s - origin) / speedup
        if duration_s is not None and arrival >= duration_s:
            break
        if limit is not None and len(records) >= limit:
            break
        records.append(
            TraceRecord(
                arrival_s=round(arrival, 6),
                client=row.client,
                input_tokens=row.input_tokens,
                output_tokens=row.output_tokens,
                request_id=f"r{len(records)}",
                prefix_group=row.prefix_group,
                prefix_tokens=row.prefix_tokens,
            )
        )
    logger.info("%s: converted %d requests", source, len(records))
    return records


def collect_rows(
    source: str,
    items: Iterable[tuple[int | str, Any]],
    build: Callable[[Any], SourceRow | list[SourceRow] | None],
    skip_invalid: bool,
) -> list[SourceRow]:
    """Build the rows of each (where, raw item); the first bad one raises ConvertError
    unless skip_invalid, in which case bad ones are dropped and counted in a warning.
    `build` returns one row, several (a conversation's turns), or None for items an
    explicit filter leaves out."""
    rows: list[SourceRow] = []
    skipped: list[str] = []
    for where, item in items:
        try:
            if isinstance(item, RowError):  # the reader already found this item broken
                raise item
            row = build(item)
        except ValueError as exc:  # RowError, ClientMapError
            if not skip_invalid:
                raise ConvertError(
                    source, where, f"{exc} (--skip-invalid drops such rows)"
                ) from None
            skipped.append(f"{where}: {exc}")
            continue
        if isinstance(row, SourceRow):
            rows.append(replace(row, where=where))
        elif row is not None:
            rows.extend(replace(turn, where=where) for turn in row)
    if skipped:
        logger.warning("%s: skipped %d invalid rows (first: %s)", source, len(skipped), skipped[0])
    return rows
