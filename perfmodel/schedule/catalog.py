"""Kernels `perfmodel tune` and `perfmodel inspect` know by name.

A bundled kernel is one folder, ``kernels/<name>/``: kernel, blocks,
reference, ``entry.py`` (its :class:`kernels.spec.KernelEntry` objects and the
:class:`kernels.spec.TunedKernel` problem its defaults are tuned on) and ``tuned.json``
(the stored defaults). :func:`entries` builds the registry from the folders
that ``kernels.BUNDLED`` names (each entry made a catalog :class:`KernelEntry`,
which adds what perfmodel does with one), then JAX's example kernels (:data:`EXTERNAL`).

Each entry says where the kernel's public wrapper and its pure-jnp reference
live, which array arguments it takes (bound by name from ``--shape``), an
example set of shapes, and which block-size fields tile which array
dimension (what the advisor enumerates). The bundled kernels come first;
``jax-matmul`` and ``jax-flash-attention`` are JAX's own example kernels
(``jax.experimental.pallas.ops.tpu``), the first being the kernel of the JAX
Pallas TPU matmul guide whose published v5e timings calibrate the model.

Nothing here imports jax or the kernels until an entry is used.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from kernels import spec as kernel_spec
from kernels.spec import BlockAxis, TunedKernel
from perfmodel.errors import InputError
from perfmodel.hw.spec import ChipSpec
from perfmodel.schedule.shapes import ShapeSpec, abstract, materialize, parse_shape


@dataclass(frozen=True, kw_only=True)
class KernelEntry(kernel_spec.KernelEntry):
    """A kernel's catalog entry: the data of :class:`kernels.spec.KernelEntry` with what perfmodel does with it
    (load the wrapper, parse --shape texts, build the call with perfmodel's chip). :func:`as_entry` makes one of
    a kernel folder's entries."""

    def wrapper(self) -> Callable:
        return load(self.function, "KERNEL")

    def reference_fn(self) -> Callable | None:
        return load(self.reference, "KERNEL") if self.reference else None

    def kwargs(self, blocks: Mapping[str, int] | None, chip: ChipSpec) -> dict[str, Any]:
        """Static keyword arguments of one call: the example's, block sizes, chip."""
        out = dict(self.static)
        if self.takes_chip:
            from perfmodel.hw.registry import chip_argument

            out["chip"] = chip_argument(chip)
        if blocks is not None:
            if self.block_kwargs is not None:
                out.update(self.block_kwargs(blocks))
            elif self.block_class is not None:
                cls = load(self.block_class, "KERNEL")
                try:
                    out["block_sizes"] = cls(**dict(blocks))
                except (TypeError, ValueError) as exc:
                    raise InputError(f"--block: {self.name} block sizes {dict(blocks)} rejected: {exc}") from None
        return out

    def specs(self, shape_texts: Sequence[str]) -> dict[str, ShapeSpec]:
        """Parse --shape texts (the example when empty) and check them against the entry's arrays."""
        texts = list(shape_texts) or list(self.example)
        specs = {}
        for t in texts:
            s = parse_shape(t)
            specs[s.name] = s
        known = set(self.arrays) | set(self.optional_arrays)
        for name in specs:
            if name not in known:
                raise InputError(f"--shape: '{name}' is not an array argument of {self.name}; "
                                 f"it takes {', '.join(self.arrays + self.optional_arrays)}")
        missing = [a for a in self.arrays if a not in specs]
        if missing:
            example = " ".join(f"--shape {t}" for t in self.example)
            raise InputError(f"--shape: {self.name} needs {', '.join(missing)}; e.g. {example}")
        return specs

    def names(self, specs: Mapping[str, ShapeSpec]) -> list[str]:
        return [a for a in self.arrays + self.optional_arrays if a in specs]

    def arguments(self, specs: Mapping[str, ShapeSpec], *, concrete: bool = True) -> tuple[Any, ...]:
        """The array arguments in call order: concrete where a fill is given (or ShapeDtypeStructs only)."""
        return tuple(materialize(specs[n]) if concrete else abstract(specs[n]) for n in self.names(specs))

    def make_function(self, specs: Mapping[str, ShapeSpec], blocks: Mapping[str, int] | None, chip: ChipSpec, *,
                 reference: bool = False, extra: Mapping[str, Any] | None = None) -> Callable:
        """A function of the arrays (positional, in call order) running the kernel (or its reference)."""
        names = self.names(specs)
        target = self.reference_fn() if reference else self.wrapper()
        if target is None:
            raise InputError(f"{self.name} has no jnp reference")
        static = {**self.static, **self.reference_static} if reference else self.kwargs(blocks, chip)
        static.update(extra or {})

        if reference:
            # References take the required arrays positionally (jnp.matmul's are a, b), optional ones by name.
            required = [n for n in names if n in self.arrays]

            def fn(*arrays: Any) -> Any:
                by_name = dict(zip(names, arrays))
                optional = {n: v for n, v in by_name.items() if n not in self.arrays}
                return target(*(by_name[n] for n in required), **optional, **static)
        else:
            def fn(*arrays: Any) -> Any:
                return target(**dict(zip(names, arrays)), **static)

        fn.__name__ = (f"{self.name}_reference" if reference else self.name).replace("-", "_")
        return fn

    def dims(self, specs: Mapping[str, ShapeSpec]) -> dict[str, int]:
        """Size of the dimension each block field tiles."""
        out = {}
        for ax in self.block_axes:
            size = int(specs[ax.array].shape[ax.dim])
            if ax.times_array is not None:
                size *= int(specs[ax.times_array].shape[ax.times_dim])
            out[ax.field] = size
        return out


def pallas_chips() -> tuple[str, ...]:
    """The chips the attention, grouped-matmul and sampling kernels keep defaults for (the others fall back, see
    their blocks.py): the registry's chips (hwspecs/ and $PERFMODEL_HW_PATH) whose spec sets
    ``compiler.bundled_pallas_kernels``, oldest first. Read when tuning, not at import: a kernel's entry.py names
    :func:`kernels.perf.pallas_chips`, which asks this function (``TunedKernel(chips=pallas_chips)``)."""
    from perfmodel.hw.registry import all_chips

    chips = sorted((c for c in all_chips() if c.compiler.bundled_pallas_kernels), key=lambda c: (c.year, c.name))
    return tuple(c.name for c in chips)


def as_entry(entry: kernel_spec.KernelEntry) -> KernelEntry:
    """The catalog entry of a kernel folder's :class:`kernels.spec.KernelEntry` (``entry`` itself when it is one)."""
    if isinstance(entry, KernelEntry):
        return entry
    return KernelEntry(**{f.name: getattr(entry, f.name) for f in dataclasses.fields(entry)})


def load(target: str, flag: str) -> Any:
    """Import "module:attr.attr" (from the current directory too); InputError naming flag when it cannot."""
    module, _, attr = target.partition(":")
    if not module or not attr:
        raise InputError(f"{flag} '{target}': expected MODULE:FUNCTION, e.g. kernels.matmul:matmul")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # modules in the current directory import, as with `python -m`
    try:
        obj: Any = importlib.import_module(module)
    except ImportError as exc:
        raise InputError(f"{flag} '{target}': cannot import module '{module}' ({type(exc).__name__}: {exc})") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise InputError(f"{flag} '{target}': module '{module}' has no attribute '{attr}'")
        obj = getattr(obj, part)
    return obj


def _jax_matmul_blocks(b: Mapping[str, int]) -> dict[str, Any]:
    return {"block_shape": (b["bm"], b["bn"]), "block_k": b["bk"]}


def _jax_flash_blocks(b: Mapping[str, int]) -> dict[str, Any]:
    fa = importlib.import_module("jax.experimental.pallas.ops.tpu.flash_attention")
    return {"block_sizes": fa.BlockSizes(block_q=b["block_q"], block_k_major=b["block_k"], block_k=b["block_k"],
                                         block_b=1)}


def _model_dtype(spec: ShapeSpec) -> str:
    from perfmodel.model.dtypes import parse_dtype

    return parse_dtype(spec.dtype)


def _jax_matmul_op(specs: Mapping[str, ShapeSpec], static: Mapping[str, Any]) -> Any:
    from perfmodel.model.gemm import gemm

    x, y = specs["x"], specs["y"]
    return gemm(m=x.shape[0], k=x.shape[1], n=y.shape[1], lhs_dtype=_model_dtype(x), rhs_dtype=_model_dtype(y),
                out_dtype=_model_dtype(x), chip=None)


def _jax_flash_op(specs: Mapping[str, ShapeSpec], static: Mapping[str, Any]) -> Any:
    from perfmodel.model.attention import flash_attention

    q, k = specs["q"].shape, specs["k"].shape
    return flash_attention(batch=q[0], q_len=q[2], kv_len=k[2], q_heads=q[1], kv_heads=k[1], head_dim=q[3],
                           causal=bool(static.get("causal", False)), dtype=_model_dtype(specs["q"]))


#: Kernels perfmodel did not write, known by name (the bundled ones come from their folders, see entries()).
EXTERNAL: tuple[KernelEntry, ...] = (
    KernelEntry(
        name="jax-matmul", summary="JAX's example matmul (jax.experimental.pallas.ops.tpu.matmul; the matmul guide's kernel)",
        function="jax.experimental.pallas.ops.tpu.matmul:matmul", reference="jax.numpy:matmul",
        arrays=("x", "y"), example=("x=4096x4096:bf16", "y=4096x4096:bf16"),
        block_axes=(BlockAxis(field="bm", array="x", dim=0, align=16, divides=True),
                    BlockAxis(field="bk", array="x", dim=1, align=128, divides=True),
                    BlockAxis(field="bn", array="y", dim=1, align=128, divides=True)),
        block_kwargs=_jax_matmul_blocks, takes_chip=False,
        reference_blocks={"bm": 512, "bk": 1024, "bn": 1024}, op_model=_jax_matmul_op,
    ),
    KernelEntry(
        name="jax-flash-attention", summary="JAX's example flash attention (jax.experimental.pallas.ops.tpu.flash_attention)",
        function="jax.experimental.pallas.ops.tpu.flash_attention:flash_attention",
        reference="jax.experimental.pallas.ops.tpu.flash_attention:mha_reference",
        arrays=("q", "k", "v"),
        example=("q=1x8x2048x128:bf16", "k=1x8x2048x128:bf16", "v=1x8x2048x128:bf16"),
        static={"causal": True},
        block_axes=(BlockAxis(field="block_q", array="q", dim=2, align=128, divides=True),
                    BlockAxis(field="block_k", array="k", dim=2, align=128, divides=True)),
        block_kwargs=_jax_flash_blocks, takes_chip=False,
        reference_blocks={"block_q": 128, "block_k": 128}, op_model=_jax_flash_op, reference_static={"ab": None},
    ),
)


@functools.cache
def bundled() -> tuple[KernelEntry, ...]:
    """The bundled kernels' entries, each from its folder's ``entry.py`` (``kernels.BUNDLED`` lists the folders)."""
    import kernels

    return tuple(as_entry(e) for name in kernels.BUNDLED for e in _kernel_module(name).ENTRIES)


@functools.cache
def tuned_kernels() -> tuple[TunedKernel, ...]:
    """What ``perfmodel tune --write`` tunes: every bundled kernel folder with stored defaults."""
    import kernels

    found = (_kernel_module(name).TUNED for name in kernels.BUNDLED)
    return tuple(t for t in found if t is not None)


def _kernel_module(name: str) -> Any:
    return importlib.import_module(f"kernels.{name}.entry")


def entries() -> tuple[KernelEntry, ...]:
    """Every kernel known by name: the bundled ones, then JAX's example kernels."""
    return bundled() + EXTERNAL


def get_entry(name: str) -> KernelEntry:
    known = entries()
    for e in known:
        if e.name == name or e.name.replace("-", "_") == name.replace("-", "_"):
            return e
    raise InputError(f"KERNEL '{name}' is not known; known kernels: {', '.join(e.name for e in known)}")


def get_tuned_kernel(kernel: str) -> TunedKernel:
    for t in tuned_kernels():
        if t.kernel == kernel:
            return t
    known = ", ".join(t.kernel for t in tuned_kernels())
    raise InputError(f"--write: '{kernel}' has no tuned defaults; kernels with block sizes: {known}")
