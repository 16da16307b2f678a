"""Client weights files: a JSON object {client: weight > 0}, for weighted VTC."""

from __future__ import annotations

import json
from pathlib import Path


class WeightsError(ValueError):
    """A weights file that cannot be used; the message names the file and the client."""


def read_weights(path: str | Path) -> dict[str, float]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise WeightsError(f"cannot read weights file {path}: {error.strerror or error}") from None
    except json.JSONDecodeError as error:
        raise WeightsError(f"weights file {path}:{error.lineno}: not JSON: {error.msg}") from None
    except UnicodeDecodeError:
        raise WeightsError(f"weights file {path}: not UTF-8 text") from None
    if not isinstance(data, dict):
        raise WeightsError(f"weights file {path}: expected a JSON object mapping client to weight")
    weights = {}
    for client, weight in data.items():
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not weight > 0:
            raise WeightsError(
                f"weights file {path}: weight of {client!r} must be a number > 0, got {weight!r}"
            )
        weights[str(client)] = float(weight)
    return weights
