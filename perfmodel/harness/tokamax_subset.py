"""The shipped tokamax calibration subset as data: the file and one recorded point by id.

Kept apart from :mod:`perfmodel.harness.tokamax_validation` (how a point becomes perfmodel ops, its group and
role) because the compile process imports it to rebuild a recorded Pallas call: the compile cache keys each
entry on every module the compile imported, so the validation tables can change without invalidating compiles.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

#: The subset, inside the ``perfmodel.data`` package.
TOKAMAX_FILE = "validation/tokamax_tpu_calibration.yaml"


@functools.lru_cache(maxsize=1)
def shipped() -> dict[str, Any]:
    """The subset file, parsed once per process."""
    import yaml

    return yaml.safe_load(resources.files("perfmodel.data").joinpath(TOKAMAX_FILE).read_text())


@functools.lru_cache(maxsize=4)
def _timings(path: str) -> dict[str, Any]:
    """A timings file in the subset's format (already checked by the validation that named it), parsed once."""
    import yaml

    with open(path, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def recorded_point(point_id: str, timings: str | None = None) -> dict[str, Any]:
    """The record of one point (op, args, config, measurement) in the shipped subset, or in the timings file
    ``timings`` (a path, in the subset's format); KeyError naming the id."""
    for p in (shipped() if timings is None else _timings(timings))["points"]:
        if p["id"] == point_id:
            return p
    raise KeyError(f"no point '{point_id}' in {TOKAMAX_FILE if timings is None else timings}")
