"""Fitted or sourced constants of the serving simulator, read from perfmodel/data/calibration/serving.yaml."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from perfmodel.errors import InputError

DATA = Path(__file__).resolve().parent.parent / "data" / "calibration" / "serving.yaml"


@lru_cache(maxsize=None)
def _table() -> dict:
    import yaml

    with open(DATA, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def host_overhead(engine: str) -> tuple[float, float, str]:
    """(seconds per engine step, seconds per request in the step, source) of ``engine``'s host overhead."""
    entry = _table()["host_overhead"].get(engine)
    if entry is None:
        raise InputError(f"{DATA}: no host_overhead for engine '{engine}'")
    return float(entry["per_step_ms"]) * 1e-3, float(entry["per_request_ms"]) * 1e-3, str(entry["source"])
