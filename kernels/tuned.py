"""A bundled kernel's stored per-chip default block sizes: ``kernels/<name>/tuned.json`` (json only: no jax, no numpy).

Each file is the block-size advisor's output (``perfmodel tune --write NAME``
rewrites it); ``"defaults"`` maps chip -> dtype configuration -> the chosen
block fields with what the model expected of them.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

#: Where the kernel folders are (this package).
KERNELS_DIR = Path(__file__).resolve().parent
FILE_NAME = "tuned.json"


def tuned_path(kernel: str) -> Path:
    return KERNELS_DIR / kernel / FILE_NAME


@functools.cache
def load_tuned_file(kernel: str) -> dict[str, Any]:
    """The whole stored JSON of a kernel: "kernel", "about", "entry", "shapes", "rule", "defaults".

    Cached per process; :func:`perfmodel.schedule.tuned.write_tuned_defaults` clears the cache when it rewrites a file.
    """
    return json.loads(tuned_path(kernel).read_text())


def load_tuned_defaults(kernel: str) -> dict[str, Any]:
    """{chip: {config: {block fields.., "expected_s": ..}}} of one kernel."""
    return load_tuned_file(kernel)["defaults"]


def stored_blocks(kernel: str, chip: str, config: str | None = None) -> dict[str, Any] | None:
    """The stored choice of one chip (its ``config``, or its first, production configuration when ``config`` is
    None or not stored for the chip); None when the chip has none."""
    configs = load_tuned_defaults(kernel).get(chip)
    if not configs:
        return None
    if config is not None and config in configs:
        return dict(configs[config])
    return dict(next(iter(configs.values())))
