"""Helpers shared by the bundled Pallas TPU kernels."""

from __future__ import annotations

from typing import Any

#: Chip whose block-size defaults and VMEM budget apply when none is given.
DEFAULT_CHIP = "tpu-v5e"


def interpret_params(interpret: bool) -> Any:
    """What to pass as ``pallas_call(interpret=...)``.

    ``True`` selects the TPU interpret mode (``pltpu.InterpretParams()``), which
    runs scalar prefetch, semaphores and DMAs on the CPU; ``False`` compiles
    with Mosaic for a real TPU.
    """
    if not interpret:
        return False
    from jax.experimental.pallas import tpu as pltpu

    return pltpu.InterpretParams()
