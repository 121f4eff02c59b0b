"""vLLM tpu-inference's ragged paged attention v3 as a MODULE:FUNCTION for perfmodel.compiler.api.CompileCall
(``tests.benchmarks.rpa_v3_adapter:decode``), so bench_attention_kernels.py can compile it deviceless next to the
bundled kernel. Nothing of its code is copied: its v3 kernel module is imported from the installed package, or
from the wheel in ``$TPI_WHEEL_DIR`` (default /tmp/tpi; zip import), with the package's ``__init__`` files
stubbed (they import vLLM).

Its wrapper asks ``jax.devices()`` for the TPU generation (a CPU here) and ``pltpu.get_tpu_info()`` for VMEM, so
the generation is patched to the chip's, it is traced under the chip's device kind
(perfmodel.schedule.device_kind.as_device: Pallas asks ``get_tpu_info`` too) and ``vmem_limit_bytes`` is passed: the chip's VMEM per core (what
``get_tpu_info`` reports on the device, hwspecs/*.yaml). No jax work at import.
"""

from __future__ import annotations

import glob
import importlib
import os
import re
import sys
import types
from pathlib import Path

V3 = "tpu_inference.kernels.ragged_paged_attention.v3"


def v3_root() -> str | None:
    """A sys.path-like root holding ``tpu_inference/``: $PERFMODEL_TPU_INFERENCE_ROOT, an installed package,
    else the newest wheel in $TPI_WHEEL_DIR; None when there is none."""
    root = os.environ.get("PERFMODEL_TPU_INFERENCE_ROOT")
    if root:
        return root
    for entry in sys.path:
        if entry and Path(entry, "tpu_inference", "kernels").is_dir():
            return entry
    wheels = sorted(glob.glob(os.path.join(os.environ.get("TPI_WHEEL_DIR", "/tmp/tpi"), "tpu_inference-*.whl")))
    return wheels[-1] if wheels else None


def load_v3():
    """The v3 kernel module (its parent packages stubbed, so vLLM is not imported)."""
    root = v3_root()
    if root is None:
        raise RuntimeError("tpu-inference not found: pip download tpu-inference==0.32.0 --no-deps -d /tmp/tpi")
    if root.endswith(".whl") and root not in sys.path:
        sys.path.append(root)  # zip import of the wheel's modules
    parts = V3.split(".")
    for i in range(len(parts)):
        name = ".".join(parts[: i + 1])
        if name not in sys.modules or not hasattr(sys.modules[name], "__path__"):
            pkg = types.ModuleType(name)
            pkg.__path__ = [os.path.join(root, *parts[: i + 1])]
            sys.modules[name] = pkg
    return importlib.import_module(V3 + ".kernel")


def tpu_generation(chip: str) -> int:
    """The generation number v3 keys its choices on: tpu-v5e -> 5, tpu-v6e -> 6, tpu7x -> 7."""
    from perfmodel.hw.registry import get_chip

    match = re.search(r"(\d+)", get_chip(chip).name)
    if match is None:
        raise ValueError(f"chip {chip!r}: no TPU generation in its name")
    return int(match.group(1))


def decode(q, k, v, kv_cache, kv_lens, page_indices, cu_q_lens, distribution, *, chip: str, bkv: int = 512):
    """v3 on a decode-only batch with ``bkv``-token KV blocks (fetched and computed whole), the new tokens'
    K/V not written (``update_kv_cache=False``: the bundled kernel does not write them either).

    Shapes are v3's: q ``[tokens, q_heads, head_dim]``, k/v ``[tokens, kv_heads, head_dim]``, kv_cache
    ``[pages, page_size, 2 * kv_heads // packing, packing, head_dim]``, page_indices flat, distribution ``[3]``.
    """
    from perfmodel.hw.registry import get_chip
    from perfmodel.schedule.device_kind import as_device

    rpa = load_v3()
    generation = tpu_generation(chip)
    rpa.get_tpu_version = lambda: generation  # the module's own name for it (imported from util)
    sys.modules[V3 + ".util"].get_tpu_version = lambda: generation
    page = kv_cache.shape[1]
    small = (16, page, 16, page)  # prefill / mixed kernels the wrapper also builds (no sequence runs them)
    spec = get_chip(chip)
    with as_device(spec):  # Pallas asks pltpu.get_tpu_info() while lowering
        return rpa.ragged_paged_attention(q, k, v, kv_cache, kv_lens, page_indices, cu_q_lens, distribution,
                                          update_kv_cache=False, sm_scale=q.shape[2] ** -0.5,
                                          d_block_sizes=(1, bkv, 1, bkv), p_block_sizes=small, m_block_sizes=small,
                                          vmem_limit_bytes=spec.memory.vmem_bytes_per_core)
