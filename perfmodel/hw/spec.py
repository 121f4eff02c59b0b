"""Hardware specification dataclasses.

The YAML files in ``hwspecs/`` mirror these classes field by field; the loader
(:mod:`perfmodel.hw.loader`) is strict about it. Conventions:

* Units are part of every numeric field name (``_bytes``, ``_bytes_per_s``,
  ``_flops_per_s``, ``_hz``, ``_w``, ``_s``).
* Scope is part of the name too: ``_per_chip`` (the whole package, all cores)
  or ``_per_core`` (one TensorCore / SM / CU). JAX's own table
  (``pltpu.get_tpu_info_for_chip``) is per TensorCore; ours is explicit.
* ``None`` means "not public / not applicable"; it never means zero.
* Every number has an entry in ``sources`` keyed by its dotted field path
  (e.g. ``memory.hbm_bw_bytes_per_s_per_chip``) naming a key of
  ``references``. Derived numbers also carry their derivation in ``derived``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

#: Matmul dtypes the model knows, narrowest last.
MATMUL_DTYPES: tuple[str, ...] = ("fp32", "bf16", "fp8", "int8", "int4")


@dataclass(frozen=True, kw_only=True)
class Cores:
    """How the chip is split into cores and what each core's MXU looks like."""

    #: TensorCores (TPU), SMs (NVIDIA) or CUs (AMD) per chip.
    cores_per_chip: int
    #: "TensorCore", "SM" or "CU".
    core_kind: str
    #: How many JAX devices one chip shows up as (2 on v2/v3/Ironwood, 1 with megacore).
    jax_devices_per_chip: int
    #: True where JAX fuses the chip's TensorCores into one device (v4, v5p).
    megacore: bool
    #: Matrix units per core (MXUs on TPU); None on GPUs.
    mxus_per_core: int | None
    #: Systolic array shape (rows = cols): 128 before v6e, 256 from v6e; None on GPUs.
    mxu_dim: int | None
    #: Vector register tile: sublanes x lanes (8 x 128 on every TPU); None on GPUs.
    vreg_sublanes: int | None
    vreg_lanes: int | None


@dataclass(frozen=True, kw_only=True)
class Compute:
    """Peak throughputs of the whole chip."""

    #: Dense (no sparsity) matrix throughput per operand dtype, FLOP/s (OP/s for ints).
    #: Keys are from MATMUL_DTYPES; a missing key means no native path at all.
    matmul_flops_per_s_per_chip: dict[str, float]
    #: Operand dtype pairs the MXU / tensor cores take natively, as "lhs x rhs"
    #: (e.g. "bf16 x int8"). Anything else is converted on the VPU first.
    native_matmul_dtype_pairs: tuple[str, ...]
    #: Elementwise vector throughput (VPU / CUDA cores), f32 ops per second.
    vpu_flops_per_s_per_chip: float
    #: Transcendental throughput (EUP / SFU: exp, rsqrt, ...), ops per second.
    eup_ops_per_s_per_chip: float
    #: Cross-lane unit throughput (TPU XLU: vreg transposes, lane broadcasts, permutes), vreg pushes per second
    #: over every XLU of every core: what a row sum or a per-row broadcast over a short (<= lanes) minor axis
    #: costs; None where not known (GPUs, TPUs without a deviceless compiler target).
    xlu_vreg_ops_per_s_per_chip: float | None
    #: Core clock.
    clock_hz: float | None


@dataclass(frozen=True, kw_only=True)
class Memory:
    """HBM and on-chip memories."""

    hbm_bytes_per_chip: int
    hbm_bw_bytes_per_s_per_chip: float
    #: TPU vector memory (scratchpad) per TensorCore.
    vmem_bytes_per_core: int | None
    #: Mosaic's default scoped-VMEM limit per TensorCore (raise with vmem_limit_bytes).
    vmem_default_scoped_limit_bytes_per_core: int | None
    #: TPU scalar memory per TensorCore.
    smem_bytes_per_core: int | None
    #: TPU common memory (v4 / v4i only).
    cmem_bytes_per_chip: int | None
    #: GPU shared memory / L1 per SM (or LDS per CU).
    shared_memory_bytes_per_core: int | None
    #: GPU L2 cache (the last level on NVIDIA; on AMD CDNA3 the per-XCD L2s summed).
    l2_bytes_per_chip: int | None
    #: Memory-side cache between the L2 and HBM (AMD Infinity Cache); None where there is none.
    memory_side_cache_bytes_per_chip: int | None


@dataclass(frozen=True, kw_only=True)
class Interconnect:
    """Chip-to-chip links (ICI on TPU, NVLink / Infinity Fabric on GPU)."""

    #: One direction of one link.
    ici_bw_bytes_per_s_per_link: float | None
    ici_links_per_chip: int | None
    #: Sum over links, one direction.
    ici_bw_bytes_per_s_per_chip: float | None
    #: "2d-torus", "3d-torus" (TPU ICI), "switch" (NVLink + NVSwitch) or "fully-connected" (a link to
    #: every peer: AMD Infinity Fabric); perfmodel.model.collectives derives collective bandwidth from it.
    topology: str
    #: Torus only: a slice axis has wraparound links when its length is a multiple of this many chips
    #: (v4/v5p/7x: 4, a cube edge; v5e/v6e: 16, the full pod side); None: no wraparound below a full pod
    #: is documented (or not a torus).
    torus_wraparound_multiple_chips: int | None
    max_chips_per_pod: int | None
    #: Data-centre network bandwidth per chip, one direction.
    dcn_bw_bytes_per_s_per_chip: float | None


@dataclass(frozen=True, kw_only=True)
class Overheads:
    """Fixed costs the roofline does not see (added to expected times, never to the floor)."""

    #: Fixed cost of one Pallas grid step (pipeline bookkeeping, DMA issue and wait).
    pallas_grid_step_overhead_s: float | None
    #: Device-side launch + teardown of one op: one XLA fusion on a TPU, one kernel launch on a GPU
    #: (back to back in a stream or graph; host dispatch excluded).
    op_launch_s: float | None
    #: Device-side launch + teardown of one pallas_call (TPU); None on GPUs (a kernel costs op_launch_s).
    pallas_call_launch_s: float | None
    #: Host-side dispatch of one jitted call (Python, runtime, launch queue); counted only where a user
    #: times it (wall clock around one call), never in expected_s.
    host_dispatch_s: float | None
    #: Latency of one HBM DMA from issue to first use: a transfer of B bytes takes this plus B / bandwidth,
    #: so small transfers ramp to peak.
    dma_latency_s: float | None
    #: Thermal design power of the chip.
    tdp_w: float | None


@dataclass(frozen=True, kw_only=True)
class Compiler:
    """What the TPU compiler (libtpu, Mosaic) does on this chip, and whether perfmodel's own kernels target it.

    Behaviour read from compiles and from the compiler's source, not datasheet figures; the code asks these
    fields instead of lists of chip names (hwspecs/README.md, "Compiler facts"). ``None``: not applicable (GPUs)
    or not known; code reads a ``None`` bool as false.
    """

    #: libtpu's deviceless topology the compiler-backed tools compile for (e.g. "v5e:2x2"; its first device is
    #: the compile target and reports one of ``jax_device_kinds``); None: no deviceless target (GPUs, v2, v3).
    deviceless_topology: str | None
    #: bf16 elementwise arithmetic (multiply, add, max) runs on the VPU in bf16 rather than widened to f32 (v6e,
    #: 7x). The bundled matmul then makes dynamic int8 codes of bf16 activations from a bf16 product and scales
    #: int4 blockwise weights in bf16 (kernels.matmul.rules.quantizes_in_bf16).
    vpu_bf16_arithmetic: bool | None
    #: Mosaic keeps the VMEM temporaries of bf16/int8 values at their width; false: widened through f32, so a
    #: kernel body needs more (f32) VMEM (v2-v4). The bundled kernels' VMEM estimates read it
    #: (kernels.tiling.narrow_vmem_temporaries). Not the same fact as vpu_bf16_arithmetic: v5e and v5p differ.
    mosaic_narrow_vmem_temporaries: bool | None
    #: perfmodel's bundled Pallas TPU kernels (kernels/) support the chip: every kernel keeps tuned defaults for
    #: it and `perfmodel tune --write` tunes them on it (perfmodel.schedule.catalog.pallas_chips).
    bundled_pallas_kernels: bool


@dataclass(frozen=True, kw_only=True)
class Disagreement:
    """Where public sources give different numbers for one field."""

    field: str
    chosen: float
    chosen_source: str
    other: float
    other_source: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class ChipSpec:
    """One accelerator generation. Mirrors one YAML file in hwspecs/."""

    #: Canonical name, lower-case with dashes (e.g. "tpu-v6e", "h100-sxm").
    name: str
    display_name: str
    #: Other names users type (e.g. "v6e", "trillium").
    aliases: tuple[str, ...]
    #: Exact strings ``jax.Device.device_kind`` reports for this chip.
    jax_device_kinds: tuple[str, ...]
    vendor: str
    #: "tpu" or "gpu".
    kind: str
    year: int
    cores: Cores
    compute: Compute
    memory: Memory
    interconnect: Interconnect
    overheads: Overheads
    compiler: Compiler
    #: Free-form remarks printed by ``perfmodel hw show``.
    notes: tuple[str, ...]
    #: Reference id -> citation (URL, paper, file at a commit).
    references: dict[str, str]
    #: Dotted field path -> reference id, for every number above.
    sources: dict[str, str]
    #: Dotted field path -> how the number was derived (the field is still sourced).
    derived: dict[str, str]
    disagreements: tuple[Disagreement, ...]
    #: Field of JAX's TpuInfo -> why we deliberately differ from it.
    jax_table_differences: dict[str, str]

    # ----- derived conveniences (no state, computed on demand) -----

    def matmul_rate(self, dtype: str) -> float | None:
        """Peak dense matmul FLOP/s of the chip for operand dtype, or None."""
        return self.compute.matmul_flops_per_s_per_chip.get(dtype)

    def ridge_point(self, dtype: str) -> float | None:
        """FLOPs per HBM byte at which the chip turns compute-bound for dtype."""
        rate = self.matmul_rate(dtype)
        if rate is None:
            return None
        return rate / self.memory.hbm_bw_bytes_per_s_per_chip

    def supports_matmul(self, lhs: str, rhs: str) -> bool:
        """Whether the MXU takes (lhs, rhs) operands without a VPU conversion."""
        return f"{lhs} x {rhs}" in self.compute.native_matmul_dtype_pairs


def numeric_field_paths(cls: type = ChipSpec, prefix: str = "") -> list[str]:
    """Dotted paths of every numeric field (int/float/dict of numbers) of cls."""
    import typing

    out: list[str] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        path = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            out.extend(numeric_field_paths(tp, path + "."))
            continue
        args = set(typing.get_args(tp)) - {type(None)}
        base = {tp} | args
        if base & {int, float} and bool not in base:
            out.append(path)
        elif typing.get_origin(tp) is dict and typing.get_args(tp)[1] is float:
            out.append(path)
    return out
