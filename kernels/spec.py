"""What describes a bundled kernel to tools: the data of each folder's ``entry.py`` (no jax, no perfmodel).

A kernel's :class:`KernelEntry` objects say where its public wrapper and its pure-jnp reference live, which
array arguments it takes (bound by name from ``--shape``), an example set of shapes, and which block-size fields
tile which array dimension (what the block-size advisor enumerates); its :class:`TunedKernel` says on which
representative problem its stored defaults (``tuned.json``) are tuned. ``perfmodel tune`` / ``inspect`` /
``analyze`` read them through :mod:`perfmodel.schedule.catalog`, which adds what perfmodel does with an entry
(loading the wrapper, parsing shapes, building calls).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping


@dataclass(frozen=True, kw_only=True)
class BlockAxis:
    """One block-size field and the array dimension it tiles."""

    field: str
    #: --shape name of the array, and the dimension (may be negative).
    array: str
    dim: int
    #: Candidates are multiples of this (tiling rule).
    align: int
    #: True when the block must divide the dimension (no partial last block).
    divides: bool = False
    #: Smallest candidate (blocks below it cost more in per-step overhead than they save).
    minimum: int = 128
    #: Largest candidate (None: MAX_BLOCK of perfmodel.schedule.tune), e.g. flash attention's compute slice,
    #: whose f32 score tile grows with it.
    maximum: int | None = None
    #: When the field counts finer units than the array dimension's elements: the array (--shape name) and
    #: dimension whose size multiplies it (ragged_paged_attention's block_kv counts KV tokens: pages per
    #: sequence, page_table's dim 1, times the page size, kv_pages' dim 1).
    times_array: str | None = None
    times_dim: int = 0


@dataclass(frozen=True, kw_only=True)
class ProductionCall:
    """A production-sized call of a kernel: what the compile matrix compiles on every TPU generation."""

    #: What the call is, in words (a row label).
    label: str
    #: --shape strings.
    shapes: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class KernelEntry:
    """A kernel known by name: where its wrapper and reference live, its array arguments and block-size axes."""

    name: str
    summary: str
    #: "module:attribute" of the public wrapper and of the jnp reference.
    function: str
    reference: str | None
    #: Array parameters, in call order; optional ones are passed only when given.
    arrays: tuple[str, ...]
    optional_arrays: tuple[str, ...] = ()
    #: Example --shape strings (used when none are given).
    example: tuple[str, ...]
    #: Static keyword arguments of the example (e.g. causal=True).
    static: Mapping[str, Any] = field(default_factory=dict)
    block_axes: tuple[BlockAxis, ...] = ()
    #: "module:Class" of the kernel's block-size dataclass (built with the block fields as keywords).
    block_class: str | None = None
    #: Turns block fields into the wrapper's keyword arguments (default: block_sizes=block_class(**blocks)).
    block_kwargs: Callable[[Mapping[str, int]], dict[str, Any]] | None = None
    #: Whether the wrapper takes chip= (the bundled kernels do).
    takes_chip: bool = True
    #: Blocks to compare the advisor's choice with when the wrapper has no default (e.g. the tutorial's).
    reference_blocks: Mapping[str, int] | None = None
    #: Extra keyword arguments of the reference only (e.g. mha_reference's ab=None).
    reference_static: Mapping[str, Any] = field(default_factory=dict)
    #: perfmodel op model of the call (an OpCost) from the parsed shapes (perfmodel ShapeSpecs by array name) and
    #: the static arguments, for kernels without a pl.CostEstimate from perfmodel.
    op_model: Callable[[Mapping[str, Any], Mapping[str, Any]], Any] | None = None
    #: The production-sized call the compile matrix compiles (bundled kernels; None: not in the matrix).
    production: ProductionCall | None = None

    @property
    def tunable(self) -> bool:
        """Whether the entry has block-size fields to tune."""
        return bool(self.block_axes)


@dataclass(frozen=True, kw_only=True)
class TunedConfig:
    """One dtype configuration of a kernel's defaults table and the representative problem it is tuned on."""

    #: Key in the JSON and in the kernel's lookup: "bf16", "fp32", or matmul's "bf16 x int8".
    key: str
    #: --shape strings of the representative problem.
    shapes: tuple[str, ...]
    #: Static keyword arguments of this configuration (e.g. matmul's quantize_activations=True for "int8 x int8").
    static: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class TunedKernel:
    """What ``perfmodel tune --write`` tunes for one bundled kernel (its folder's ``entry.py`` says)."""

    #: kernels/<kernel>/ package, whose tuned.json holds the result.
    kernel: str
    #: Catalog entry the advisor runs (e.g. the token-major variant of kv_cache_update).
    entry: str
    #: The representative problem in words (goes into the JSON's "about").
    problem: str
    #: Production configuration first: lookups without a dtype use the first one.
    configs: tuple[TunedConfig, ...]
    #: The chips tuned: names, or a function returning them called when tuning (e.g.
    #: :func:`kernels.perf.pallas_chips`); None: every TPU chip in the registry.
    chips: tuple[str, ...] | Callable[[], tuple[str, ...]] | None = None
    #: Extra static arguments of the wrapper, built when tuning (e.g. a PRNG key).
    extra: Callable[[], dict[str, Any]] | None = None
    #: Extra fields stored with each choice, from its blocks and the shapes (e.g. paged_attention's tokens).
    derived: Callable[[Mapping[str, int], Mapping[str, Any]], dict[str, Any]] | None = None
    #: A sentence about how to read the choice (goes into the JSON's "about").
    note: str = ""
    #: With ``--compile``: also compile this many of the model's fastest candidates outside robust_choice's pool
    #: (raised VMEM limits within MAX_RAISED_VMEM_FRACTION of the physical VMEM) where the pool kept only
    #: candidates within the default scoped limit, so the compiler-backed time, not the model's, decides
    #: whether raising the limit pays (0: the pool only).
    compile_raised: int = 0

    def chip_names(self) -> tuple[str, ...] | None:
        """The chips tuned (:attr:`chips` called where it is a function); None: every TPU chip in the registry."""
        return tuple(self.chips()) if callable(self.chips) else self.chips
