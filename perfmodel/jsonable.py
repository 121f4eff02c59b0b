"""The one JSON serializer: library results (frozen dataclasses) to plain JSON values.

:func:`to_jsonable` turns dataclasses into dicts of their fields, tuples into
lists, numpy scalars and arrays into Python numbers and lists, and NaN or
infinity into ``null``. A dataclass may shape its own JSON with two class
attributes:

* ``JSON_OMIT``: field names left out (e.g. per-step arrays);
* ``JSON_DERIVED``: property names added after the fields (e.g. a ratio the
  text report prints, so that ``--json`` carries it too).

Every ``--json`` output, the results files and the reports' JSON go through
it. No numpy import here (numpy values are recognized by their ``tolist``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import PurePath
from typing import Any, Mapping


def to_jsonable(obj: Any) -> Any:
    """Dataclasses, mappings, tuples, numpy values and paths as plain JSON values (NaN and inf as None)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        omit = getattr(obj, "JSON_OMIT", ())
        out = {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.name not in omit}
        for name in getattr(obj, "JSON_DERIVED", ()):
            out[name] = to_jsonable(getattr(obj, name))
        return out
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, PurePath):
        return str(obj)
    if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):  # numpy scalar or array
        return to_jsonable(obj.tolist())
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def dumps(obj: Any, **kwargs: Any) -> str:
    """``json.dumps(to_jsonable(obj), **kwargs)``; strict (no NaN), as every JSON perfmodel writes."""
    return json.dumps(to_jsonable(obj), allow_nan=False, **kwargs)
