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


def recorded_point(point_id: str) -> dict[str, Any]:
    """The shipped subset's record of one point (op, args, config, measurement); KeyError naming the id."""
    for p in shipped()["points"]:
        if p["id"] == point_id:
            return p
    raise KeyError(f"no point '{point_id}' in {TOKAMAX_FILE}")
