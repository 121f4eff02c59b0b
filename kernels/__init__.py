"""Bundled Pallas TPU kernels, one folder each (kernel, blocks, reference, entry.py, tuned.json).

Adding a kernel: its folder, and its name in :data:`BUNDLED` (the registry perfmodel reads, see
:func:`perfmodel.schedule.catalog.entries`).
"""

#: The kernel folders perfmodel knows, in the order it lists them.
BUNDLED: tuple[str, ...] = (
    "matmul",
    "grouped_matmul",
    "rms_norm",
    "kv_cache_update",
    "flash_attention",
    "paged_attention",
    "ragged_paged_attention",
    "sampling",
)
