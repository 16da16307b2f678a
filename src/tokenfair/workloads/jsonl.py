"""Line-numbered reading and checked field access for JSONL record files.

Trace files (workloads) and result files (bench) are both "one JSON object a line", and
a user who hand-edits one must be told exactly which line and which field is wrong.
This module holds the shared pieces: the error type that carries `path:line`, and small
checkers that turn a raw JSON value into a typed field or raise `FieldError` with a
message saying what was expected and what was found.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

R = TypeVar("R")


class FieldError(ValueError):
    """One field of one record is invalid; the reader adds the file and line."""


class JsonlLineError(ValueError):
    """A line of a JSONL file is invalid. str() reads `path:line: message`."""

    def __init__(self, path: str, line: int, message: str) -> None:
        super().__init__(f"{path}:{line}: {message}")
        self.path = path
        self.line = line
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep the three-argument constructor working through pickle (multiprocessing).
        return (type(self), (self.path, self.line, self.message))


def show(value: Any) -> str:
    """Render a bad value the way it appeared in the file (JSON), for error messages."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_number(value: Any) -> bool:
    # bool is a subclass of int in Python, but `true` is never a valid count or time.
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_int(name: str, value: Any, minimum: int | None = None) -> int:
    """An integer (not a bool, not 3.0) that is >= minimum when one is given."""
    bound = f" >= {minimum}" if minimum is not None else ""
    if not isinstance(value, int) or isinstance(value, bool):
        raise FieldError(f"{name} must be an integer{bound}, got {show(value)}")
    if minimum is not None and value < minimum:
        raise FieldError(f"{name} must be an integer{bound}, got {show(value)}")
    return value


def check_optional_int(name: str, value: Any, minimum: int | None = None) -> int | None:
    """Like check_int, but JSON null (None) is allowed and returned as None."""
    return None if value is None else check_int(name, value, minimum)


def check_float(
    name: str, value: Any, minimum: float | None = None, *, strict: bool = False
) -> float:
    """A finite number (int or float, not a bool); >= minimum, or > minimum if strict."""
    bound = ""
    if minimum is not None:
        bound = f" {'>' if strict else '>='} {minimum:g}"
    if not _is_number(value) or not math.isfinite(value):
        raise FieldError(f"{name} must be a finite number{bound}, got {show(value)}")
    if minimum is not None and (value <= minimum if strict else value < minimum):
        raise FieldError(f"{name} must be a finite number{bound}, got {show(value)}")
    return float(value)


def check_optional_float(
    name: str, value: Any, minimum: float | None = None, *, strict: bool = False
) -> float | None:
    """Like check_float, but JSON null (None) is allowed and returned as None."""
    if value is None:
        return None
    try:
        return check_float(name, value, minimum, strict=strict)
    except FieldError:
        bound = f" {'>' if strict else '>='} {minimum:g}" if minimum is not None else ""
        raise FieldError(
            f"{name} must be a finite number{bound} or null, got {show(value)}"
        ) from None


def check_str(name: str, value: Any) -> str:
    """A non-empty string."""
    if not isinstance(value, str) or not value:
        raise FieldError(f"{name} must be a non-empty string, got {show(value)}")
    return value


def require(obj: Mapping[str, Any], name: str) -> Any:
    """The value of a required field, or FieldError naming the missing field."""
    if name not in obj:
        raise FieldError(f"missing required field {name!r}")
    return obj[name]


# How a caller's error is built: (path, line, message) -> the exception to raise.
LineErrorFactory = Callable[[str, int, str], ValueError]


def iter_json_objects(
    lines: Iterable[str], source: str, error: LineErrorFactory = JsonlLineError
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (1-based line number, object) for every non-blank line.

    Raises `error(source, line, message)` (e.g. a JsonlLineError subclass of the caller's
    choice) for a line that is not valid JSON or not a JSON object. Blank
    (whitespace-only) lines are skipped: they are the only thing ever skipped.
    """
    for number, raw in enumerate(lines, start=1):
        text = raw.strip()
        if not text:
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise error(source, number, f"invalid JSON: {exc.msg}") from None
        if not isinstance(obj, dict):
            raise error(source, number, f"expected a JSON object, got {type(obj).__name__}")
        yield number, obj


def parse_records(
    lines: Iterable[str],
    source: str,
    error: type[JsonlLineError],
    build: Callable[[dict[str, Any], int], R],
) -> list[R]:
    """Build one record per non-blank line with `build(object, line_number)`.

    A FieldError from `build` becomes `error` naming the line, and so does a
    `request_id` already used on an earlier line.
    """
    records: list[R] = []
    first_line_of: dict[str, int] = {}
    for number, obj in iter_json_objects(lines, source, error):
        try:
            record = build(obj, number)
        except FieldError as exc:
            raise error(source, number, str(exc)) from None
        request_id = record.request_id  # type: ignore[attr-defined]
        if request_id in first_line_of:
            raise error(
                source,
                number,
                f"duplicate request_id {request_id!r} (first used on line {first_line_of[request_id]})",
            )
        first_line_of[request_id] = number
        records.append(record)
    return records


class NotTextError(ValueError):
    """A file that is not UTF-8 text (a binary file, a compressed trace...)."""


def read_lines(path: str | Path) -> list[str]:
    """All lines of a UTF-8 text file (FileNotFoundError propagates unchanged).

    A file that is not UTF-8 text raises NotTextError naming the file and the line.
    """
    with open(path, "rb") as fh:
        raw = fh.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        raise NotTextError(
            f"{path}:{line}: not UTF-8 text (byte 0x{raw[error.start]:02x} at offset "
            f"{error.start}): expected JSON lines"
        ) from None
    return text.splitlines(keepends=True)


def write_objects(objects: Iterable[Mapping[str, Any]], path: str | Path) -> None:
    """Write one compact JSON object a line, creating parent directories."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "w", encoding="utf-8") as fh:
        for obj in objects:
            fh.write(json.dumps(obj, separators=(", ", ": ")))
            fh.write("\n")
