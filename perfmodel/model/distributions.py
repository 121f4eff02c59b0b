"""Per-sequence lengths from compact descriptions: lists with repeats, or distributions.

* ``"4096"``, ``"100,2000,17"``, ``"1x64,512x2"`` (value x count);
* ``"uniform:LO:HI"``, ``"normal:MEAN:STD"``, ``"lognormal:MEDIAN:SIGMA"``:
  ``batch`` deterministic quantiles (at (i + 0.5) / batch), rounded and
  clipped to >= 1, so results are reproducible without a random seed.
"""

from __future__ import annotations

import math

import numpy as np

from perfmodel.errors import InputError
from perfmodel.inputcheck import MAX_LIST_ENTRIES, dimension, short

DISTRIBUTIONS = ("uniform", "normal", "lognormal")


def parse_length_list(text: str, flag: str) -> np.ndarray:
    """``"1x64,512x2"`` -> [1]*64 + [512]*2; plain comma lists too."""
    pairs: list[tuple[int, int]] = []
    total = 0
    for item in str(text).split(","):
        item = item.strip()
        if not item:
            raise InputError(f"{flag}: '{short(text)}' has an empty entry; write e.g. 4096,100 or 2048x31,8192")
        value, _, count = item.partition("x")
        try:
            v, c = int(value), int(count) if count else 1
        except ValueError:
            raise InputError(f"{flag}: '{short(item)}' is not an integer or VALUExCOUNT (e.g. 4096 or 1x64)") from None
        if v < 1 or c < 1:
            raise InputError(f"{flag}: '{short(item)}': lengths and counts must be >= 1")
        dimension(v, f"{flag}: length")
        total += c
        if total > MAX_LIST_ENTRIES:
            raise InputError(f"{flag}: '{short(item)}' makes {total:,} lengths; at most {MAX_LIST_ENTRIES:,}")
        pairs.append((v, c))
    return np.repeat(np.asarray([v for v, _ in pairs], dtype=np.int64), [c for _, c in pairs])


def quantile_lengths(spec: str, batch: int, flag: str = "`context_dist`") -> np.ndarray:
    """``batch`` lengths at evenly spaced quantiles of the distribution ``spec``."""
    kind, *args = str(spec).split(":")
    if kind not in DISTRIBUTIONS or len(args) != 2:
        raise InputError(f"{flag}: '{spec}': use uniform:LO:HI, normal:MEAN:STD or lognormal:MEDIAN:SIGMA")
    try:
        a, b = float(args[0]), float(args[1])
    except ValueError:
        raise InputError(f"{flag}: '{spec}': parameters must be numbers") from None
    if batch < 1:
        raise InputError(f"`batch` must be >= 1, got {batch}")
    if batch > MAX_LIST_ENTRIES:
        raise InputError(f"`batch` is {short(batch)}: at most {MAX_LIST_ENTRIES:,} sequences")
    qs = (np.arange(batch) + 0.5) / batch
    from statistics import NormalDist  # imported here: statistics is slow to import and most commands never need it

    if kind == "uniform":
        if not 1 <= a <= b:
            raise InputError(f"{flag}: uniform needs 1 <= LO <= HI, got {a}, {b}")
        vals = a + (b - a) * qs
    elif kind == "normal":
        if b < 0:
            raise InputError(f"{flag}: normal needs STD >= 0, got {b}")
        vals = np.array([NormalDist(a, b).inv_cdf(q) if b > 0 else a for q in qs])
    else:
        if a <= 0 or b < 0:
            raise InputError(f"{flag}: lognormal needs MEDIAN > 0 and SIGMA >= 0, got {a}, {b}")
        vals = np.array([math.exp(math.log(a) + (NormalDist(0, b).inv_cdf(q) if b > 0 else 0.0)) for q in qs])
    return np.maximum(np.rint(vals), 1).astype(np.int64)
