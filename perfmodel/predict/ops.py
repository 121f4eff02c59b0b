"""The op of each ``perfmodel predict`` command, built from flat keyword parameters.

Each builder takes ``chip=`` and the parameters as the command has them
(one value each; a sweep calls it once per point), fills in the defaults
that depend on other parameters (KV heads default to the query heads, the
KV length to the query length, ...) and returns an
:class:`~perfmodel.model.core.OpCost` or ``{variant: OpCost}``.
:func:`predict_op` runs one over chips x points (see
:mod:`perfmodel.predict.sweep`). Errors name the keyword arguments
(`` `context_lens` ``); the CLI turns them into its flags. No jax.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Mapping, Sequence

from perfmodel.errors import InputError, naming
from perfmodel.predict.sweep import Builder, OpSweep, predict_sweep

_CONTEXT_FIELDS = ("context", "context_lens", "context_dist")


# ----------------------------------------------------------------------------- per-sequence context lengths


def context_lengths(context: int | None = None, context_lens: Any = None, context_dist: str | None = None,
                    batch: int | None = None) -> tuple[Any, Any]:
    """``(context_lens, batch)`` arguments of the paged-attention models from exactly one of:

    * ``context`` (one length shared by ``batch`` sequences, default 1): ``(context, batch)``;
    * ``context_lens``, one length per sequence (a list, or text such as ``"4096,100"`` or ``"2048x31,8192"``):
      ``(lengths, None)``;
    * ``context_dist``, ``batch`` quantiles of ``uniform:LO:HI``, ``normal:MEAN:STD`` or
      ``lognormal:MEDIAN:SIGMA``: ``(lengths, None)``.
    """
    from perfmodel.model.distributions import quantile_lengths
    from perfmodel.model.shapes import sizes

    given = [n for n, v in zip(_CONTEXT_FIELDS, (context, context_lens, context_dist)) if v is not None]
    if len(given) != 1:
        raise InputError("give exactly one of `context`, `context_lens`, `context_dist`"
                         + (f" (got {', '.join(f'`{g}`' for g in given)})" if given else ""), fields=_CONTEXT_FIELDS)
    if batch is not None:
        sizes("batch", batch)
    if context is not None:
        return sizes("context", context), (1 if batch is None else batch)
    if context_lens is not None:
        if batch is not None:
            raise InputError("`batch`: not with `context_lens` (the list gives one length per sequence)",
                             fields=("batch", "context_lens"))
        return length_list(context_lens, "context_lens"), None
    with naming("context_dist"):
        return quantile_lengths(context_dist, 1 if batch is None else batch, "`context_dist`"), None


def length_list(value: Any, field: str) -> Any:
    """Lengths from a list or from text like ``"1x64,512x2"`` (VALUExCOUNT); errors name ``field``."""
    import numpy as np

    from perfmodel.model.distributions import parse_length_list

    if not isinstance(value, str):
        return np.asarray(value, dtype=np.int64)
    with naming(field):
        return parse_length_list(value, f"`{field}`")


def context_field(context: Any = None, context_lens: Any = None, context_dist: Any = None) -> str:
    """The context parameter that was given (for error messages); ``context_lens`` when none or several."""
    given = [n for n, v in zip(_CONTEXT_FIELDS, (context, context_lens, context_dist)) if v is not None]
    return given[0] if len(given) == 1 else "context_lens"


@contextlib.contextmanager
def blame_context(field: str) -> Iterator[None]:
    """Prefix the model's too-small page table error ("a context of N tokens needs ... --pages-per-seq ...",
    which cannot know which parameter gave the lengths) with the context parameter given."""
    try:
        yield
    except InputError as exc:
        if str(exc).startswith("a context of "):
            raise InputError(f"`{field}`: {exc}", fields=exc.fields + (field,)) from None
        raise


# ----------------------------------------------------------------------------- builders


def gemm(*, chip: Any, groups: Any = None, group_sizes: Any = None, block_m: Any = None, implementation: Any = None,
         ragged: Any = None, **params: Any) -> Any:
    """[batch, M, K] x [batch, K, N] GEMM (perfmodel.model.gemm.gemm); with ``groups`` (M rows split evenly; K rows
    with ``ragged`` contraction) or ``group_sizes`` the grouped GEMM of mixture of experts
    (perfmodel.model.gemm.grouped_gemm)."""
    from perfmodel.model import gemm as models

    if groups is None and group_sizes is None:
        for name, value in (("block_m", block_m), ("implementation", implementation), ("ragged", ragged)):
            if value is not None:
                raise InputError(f"`{name}`: only for a grouped GEMM; add `groups` or `group_sizes`",
                                 fields=(name, "groups"))
        return models.gemm(chip=chip, **params)
    if groups is not None and group_sizes is not None:
        raise InputError("give one of `groups` (even split) and `group_sizes`", fields=("groups", "group_sizes"))
    unsupported = [f for f in ("scale_block", "precision") if params.get(f) not in (None, "default")]
    unsupported += [f for f in ("quantize_activations", "epilogue") if params.get(f)]
    unsupported += [f for f in ("batch",) if params.get(f, 1) != 1]
    if unsupported:
        raise InputError(f"`{unsupported[0]}`: not modelled for a grouped GEMM (the grouped kernel has none)",
                         fields=(unsupported[0],))
    m, k = params.get("m"), params.get("k")
    split = k if ragged == "contraction" else m  # the dimension the groups split
    if groups is not None and split is None:
        name = "k" if ragged == "contraction" else "m"
        raise InputError(f"`groups` splits `{name}` evenly: give `{name}` (or `group_sizes`)", fields=(name, "groups"))
    sizes = models.uniform_group_sizes(split, groups) if groups is not None else models.group_size_list(group_sizes)
    return models.grouped_gemm(chip=chip, group_sizes=sizes, m=m, n=params["n"], k=k,
                               lhs_dtype=params.get("lhs_dtype", "bf16"), rhs_dtype=params.get("rhs_dtype", "bf16"),
                               out_dtype=params.get("out_dtype", "bf16"), weight_scale=params.get("weight_scale"),
                               block_m=block_m, implementation=implementation or "kernel", ragged=ragged or "rows")


def attention(*, chip: Any, q_len: Any, kv_len: Any = None, q_heads: Any = 32, kv_heads: Any = None,
              **params: Any) -> Any:
    """Flash prefill attention; the KV length defaults to the query length, KV heads to the query heads."""
    from perfmodel.model.attention import flash_attention

    return flash_attention(chip=chip, q_len=q_len, kv_len=q_len if kv_len is None else kv_len, q_heads=q_heads,
                           kv_heads=q_heads if kv_heads is None else kv_heads, **params)


def chunked_attention(*, chip: Any, q_len: Any, kv_len: Any = None, q_heads: Any = 32, kv_heads: Any = None,
                      **params: Any) -> Any:
    """XLA's chunked attention (a loop over query and key chunks); the KV length defaults to the query length,
    KV heads to the query heads."""
    from perfmodel.model.xla_chunked_attention import xla_chunked_attention

    return xla_chunked_attention(chip=chip, q_len=q_len, kv_len=q_len if kv_len is None else kv_len,
                                 q_heads=q_heads, kv_heads=q_heads if kv_heads is None else kv_heads, **params)


def decode_attention(*, chip: Any, context: Any = None, context_lens: Any = None, context_dist: Any = None,
                     batch: Any = None, q_heads: Any = 32, kv_heads: Any = None, **params: Any) -> Any:
    """One paged decode step; contexts from :func:`context_lengths`, KV heads default to the query heads."""
    from perfmodel.model.paged_attention import paged_decode_attention

    lens, b = context_lengths(context, context_lens, context_dist, batch)
    with blame_context(context_field(context, context_lens, context_dist)):
        return paged_decode_attention(chip=chip, context_lens=lens, batch=b, q_heads=q_heads,
                                      kv_heads=q_heads if kv_heads is None else kv_heads, **params)


def ragged_attention(*, chip: Any, query_lens: Any, context_lens: Any, q_heads: Any = 32, kv_heads: Any = None,
                     **params: Any) -> Any:
    """A mixed batch of prefill chunks and decode tokens; lengths as lists or VALUExCOUNT text."""
    from perfmodel.model.paged_attention import ragged_paged_attention

    queries, contexts = length_list(query_lens, "query_lens"), length_list(context_lens, "context_lens")
    with blame_context("context_lens"):
        return ragged_paged_attention(chip=chip, query_lens=queries, context_lens=contexts, q_heads=q_heads,
                                      kv_heads=q_heads if kv_heads is None else kv_heads, **params)


def mla_decode(*, chip: Any, context: Any = None, context_lens: Any = None, context_dist: Any = None,
               batch: Any = None, **params: Any) -> Any:
    """DeepSeek-style MLA decode; contexts from :func:`context_lengths`."""
    from perfmodel.model.paged_attention import mla_decode as model

    lens, b = context_lengths(context, context_lens, context_dist, batch)
    with blame_context(context_field(context, context_lens, context_dist)):
        return model(chip=chip, context_lens=lens, batch=b, **params)


def sampling(*, chip: Any, method: str = "both", projection_hidden: Any = None, temperature: bool = True,
             **params: Any) -> Any:
    """Sampling; ``method="both"`` gives the threshold and sort forms side by side when a filter is set."""
    from perfmodel.model.sampling import sampling as model
    from perfmodel.model.shapes import sizes

    filtering = params.get("top_k") is not None or params.get("top_p") is not None
    if not temperature and (filtering or params.get("min_p") is not None):
        raise InputError("greedy sampling takes the argmax and applies no filters; drop `top_k` / `top_p` / `min_p` "
                         "or sample with `temperature`", fields=("top_k", "top_p", "min_p", "temperature"))
    if projection_hidden is not None:
        sizes("projection_hidden", projection_hidden)
    methods = ["threshold", "sort"] if method == "both" and filtering else (
        ["threshold"] if method == "both" else [method])
    costs = {m: model(chip=chip, method=m, temperature=temperature, include_projection_hidden=projection_hidden,
                      **params) for m in methods}
    return costs if len(costs) > 1 else costs[methods[0]]


def kv_update(*, chip: Any, tokens: Any, **params: Any) -> Any:
    """Writing ``tokens`` new tokens' K / V into their page slots."""
    from perfmodel.model.kvcache import kv_cache_update
    from perfmodel.model.shapes import sizes

    return kv_cache_update(chip=chip, num_tokens=sizes("tokens", tokens), **params)


def kv_gather(*, chip: Any, context: Any = None, context_lens: Any = None, context_dist: Any = None,
              batch: Any = None, **params: Any) -> Any:
    """Copying sequences' pages into a contiguous buffer; contexts from :func:`context_lengths`."""
    from perfmodel.model.kvcache import kv_gather as model

    lens, b = context_lengths(context, context_lens, context_dist, batch)
    return model(chip=chip, context_lens=lens, batch=b, **params)


def copy(*, chip: Any, shape: Any = None, **params: Any) -> Any:
    """One pass over an array (a copy, or ``x + 1`` with ``elementwise``); ``shape`` is the array's dims."""
    from perfmodel.model.memops import copy as model

    if shape is not None:
        if params.get("array_elements") is not None:
            raise InputError("give `shape` or `array_elements`, not both", fields=("shape", "array_elements"))
        params["array_elements"] = _product(parse_dims(shape), "shape")
    return model(chip=chip, **params)


def gather(*, chip: Any, **params: Any) -> Any:
    """Rows gathered from a table by index (embedding lookup, jnp.take along axis 0)."""
    from perfmodel.model.memops import gather as model

    return model(chip=chip, **params)


def _product(dims: list[int], field: str) -> int:
    if not dims or any(d <= 0 for d in dims):
        raise InputError(f"`{field}`: dims must be positive integers, got {dims}", fields=(field,))
    out = 1
    for d in dims:
        out *= d
    return out


def _fused(name: str) -> Builder:
    """The fused and unfused forms of perfmodel.model.fused.<name> side by side."""

    def build(*, chip: Any, form: str | None = None, **params: Any) -> Any:
        """``form``: "fused" or "unfused" alone (one prediction); None: both."""
        from perfmodel.model import fused
        from perfmodel.model.shapes import choice

        fn = getattr(fused, name)
        forms = ("fused", "unfused") if form is None else (choice("form", form, ("fused", "unfused")),)
        costs = {f: fn(chip=chip, fused=f == "fused", **params) for f in forms}
        return costs if form is None else costs[form]

    return build


def parse_dims(value: Any, field: str = "shape") -> list[int]:
    """``"8,4096"`` or ``"8x4096"`` (or a list) -> [8, 4096]; errors name ``field``."""
    if not isinstance(value, str):
        return [int(d) for d in value]
    try:
        return [int(d) for d in value.replace("x", ",").split(",") if d.strip()]
    except ValueError:
        raise InputError(f"`{field}`: '{value}' must be comma-separated integers, e.g. 8,4096",
                         fields=(field,)) from None


def _collective(kind: str) -> Builder:
    def build(*, chip: Any, shape: Any = None, bytes_per_chip: Any = None, **params: Any) -> Any:
        from perfmodel.model.collectives import COLLECTIVES

        dims = None if shape is None else parse_dims(shape)
        return COLLECTIVES[kind](chip=chip, shape=dims, bytes_per_chip=bytes_per_chip, **params)

    return build


#: op name -> the groups of its size parameters that its model multiplies together (FLOPs, array elements and
#: bytes); perfmodel.inputcheck.option_values keeps each product within 2**58. Block and tile sizes and the other
#: side's head count are never in one product with all of them, so they are not in a group (a real long-context
#: shape is never refused for their sake). "a|b": a, or b when a is not given (the builder's default).
SIZE_PRODUCTS: dict[str, tuple[tuple[str, ...], ...]] = {
    "gemm": (("batch", "m", "n", "k"),),
    "attention": (("batch", "q_heads", "q_len", "kv_len|q_len", "head_dim"),),
    "chunked-attention": (("batch", "q_heads", "q_len", "kv_len|q_len", "head_dim"),
                          ("batch", "q_heads", "q_len", "kv_len|q_len", "v_head_dim|head_dim")),
    "decode-attention": (("batch", "q_heads", "context", "head_dim"),
                         ("batch", "pages_per_seq", "page_size", "kv_heads|q_heads", "head_dim")),
    "ragged-attention": (("pages_per_seq", "page_size", "kv_heads|q_heads", "head_dim"),),
    "mla-decode": (("batch", "q_heads", "context", "kv_lora_rank"), ("batch", "q_heads", "context", "rope_head_dim"),
                   ("batch", "pages_per_seq", "page_size", "kv_lora_rank")),
    "sampling": (("batch", "vocab", "passes"), ("batch", "vocab", "draft_tokens"),
                 ("batch", "vocab", "projection_hidden")),
    "kv-cache update": (("tokens", "kv_heads", "head_dim"), ("page_size", "kv_heads", "head_dim")),
    "kv-cache gather": (("batch", "context", "kv_heads", "head_dim"), ("page_size", "kv_heads", "head_dim")),
    "copy": (("array_elements",),),
    "gather": (("rows", "row_elements"),),
    "rms-norm": (("tokens", "hidden"),),
    "swiglu": (("tokens", "intermediate"),),
    "geglu": (("tokens", "intermediate"),),
    "rope": (("tokens", "heads", "head_dim"),),
    "dequant-gemm": (("m", "n", "k"),),
}

#: op name (as `perfmodel predict` prints it) -> builder.
BUILDERS: dict[str, Builder] = {
    "gemm": gemm,
    "attention": attention,
    "chunked-attention": chunked_attention,
    "decode-attention": decode_attention,
    "ragged-attention": ragged_attention,
    "mla-decode": mla_decode,
    "sampling": sampling,
    "kv-cache update": kv_update,
    "kv-cache gather": kv_gather,
    "copy": copy,
    "gather": gather,
    "rms-norm": _fused("rms_norm"),
    "swiglu": _fused("swiglu"),
    "geglu": _fused("geglu"),
    "rope": _fused("rope"),
    "dequant-gemm": _fused("dequant_gemm"),
    "all-gather": _collective("all-gather"),
    "reduce-scatter": _collective("reduce-scatter"),
    "all-reduce": _collective("all-reduce"),
}


def predict_op(op: str, params: Mapping[str, Any], *, chips: Sequence[Any],
               points: Sequence[Mapping[str, Any]] = ({},), progress: Callable[..., None] | None = None) -> OpSweep:
    """The op named ``op`` (a key of :data:`BUILDERS`) over chips x points (``progress``: as
    :func:`perfmodel.predict.sweep.predict_sweep`'s)."""
    if op not in BUILDERS:
        raise InputError(f"`op`: unknown op '{op}'; one of {', '.join(BUILDERS)}", fields=("op",))
    return predict_sweep(op, BUILDERS[op], params, chips=chips, points=points, progress=progress)
