"""Where perfmodel keeps its caches: ``$PERFMODEL_CACHE_DIR/<kind>``, else ``$XDG_CACHE_HOME/perfmodel/<kind>``
(``~/.cache/perfmodel/<kind>``). One rule for the compile cache and the spec cache."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(kind: str) -> Path:
    """The directory of one cache (e.g. "compile", "specs"); not created here."""
    base = os.environ.get("PERFMODEL_CACHE_DIR")
    if base:
        return Path(base) / kind
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "perfmodel" / kind
