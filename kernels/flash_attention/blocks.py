"""Block sizes of the flash-attention (prefill) kernel and their per-chip defaults."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kernels.tiling import LANES, SUBLANES_32BIT, sublane_multiple, scoped_vmem_limit_bytes

if TYPE_CHECKING:  # pragma: no cover
    from perfmodel.hw.spec import ChipSpec

#: Bytes of one f32 element (softmax statistics, accumulator, scores).
F32_BYTES = 4
#: Pallas double-buffers every pipelined input and output block.
PIPELINE_BUFFERS = 2


@dataclass(frozen=True, kw_only=True)
class FlashAttentionBlockSizes:
    """Tile sizes of one grid step.

    ``block_q`` query rows and ``block_kv`` key/value rows are DMA'd per grid
    step; the step walks its K/V block in ``block_kv_compute``-row slices, so
    the f32 score tile is ``block_q x block_kv_compute``. Sequences need not be
    multiples of the blocks: edge blocks are masked, and a block longer than
    its sequence is shrunk to fit (see :meth:`effective`).
    """

    block_q: int
    block_kv: int
    #: Defaults to ``block_kv`` (one score tile per K/V block).
    block_kv_compute: int | None = None

    def __post_init__(self) -> None:
        for name in ("block_q", "block_kv", "block_kv_compute"):
            value = getattr(self, name)
            if value is None and name == "block_kv_compute":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"block_sizes.{name}: must be a positive int, got {value!r}")
        if self.block_q % SUBLANES_32BIT:
            raise ValueError(
                f"block_sizes.block_q: {self.block_q} is not a multiple of {SUBLANES_32BIT} "
                "(the sublane tile); use e.g. 128, 256 or 512"
            )
        for name in ("block_kv", "block_kv_compute"):
            value = getattr(self, name)
            if value is not None and value % LANES:
                raise ValueError(
                    f"block_sizes.{name}: {value} is not a multiple of {LANES} (the lane tile; "
                    "key positions are the lane axis of the score tile); use e.g. 128, 256 or 512"
                )
        if self.block_kv % self.kv_compute:
            raise ValueError(
                f"block_sizes.block_kv_compute: {self.kv_compute} does not divide "
                f"block_kv={self.block_kv}; pick a divisor such as {LANES}"
            )

    @property
    def kv_compute(self) -> int:
        """``block_kv_compute`` with its default filled in."""
        return self.block_kv if self.block_kv_compute is None else self.block_kv_compute

    def effective(self, *, q_len: int, kv_len: int) -> tuple[int, int, int]:
        """(block_q, block_kv, block_kv_compute) actually used for these sequence lengths.

        A block longer than its sequence is shrunk: to the whole sequence when it
        fits in one compute slice, else to the largest multiple of the compute
        slice that fits (the last block is then a masked partial block).
        """
        bq = min(self.block_q, q_len)
        bkc = self.kv_compute
        if kv_len <= bkc:
            return bq, kv_len, kv_len
        bk = min(self.block_kv, (kv_len // bkc) * bkc)
        return bq, bk, bkc

    def validate(self, *, q_dtype: Any, kv_dtype: Any, head_dim: int, group: int, q_len: int, kv_len: int,
                 spec: "ChipSpec") -> None:
        """Dtype-dependent tiling and the VMEM budget of ``spec``; ValueError naming the field."""
        packing = sublane_multiple(q_dtype)
        if self.block_q % packing and self.block_q < q_len:
            raise ValueError(
                f"block_sizes.block_q: {self.block_q} is not a multiple of {packing}, the sublane tile "
                f"of {_name(q_dtype)} queries; use a multiple of {packing}"
            )
        need = self.vmem_bytes(q_dtype=q_dtype, kv_dtype=kv_dtype, head_dim=head_dim, group=group, q_len=q_len,
                               kv_len=kv_len)
        limit = scoped_vmem_limit_bytes(spec)
        if need > limit:
            raise ValueError(
                f"block_sizes: block_q={self.block_q}, block_kv={self.block_kv}, "
                f"block_kv_compute={self.kv_compute} need {need} B of VMEM for {group} q heads per kv head, "
                f"over the {limit} B scoped limit of {spec.name}; use smaller blocks"
            )

    def vmem_bytes(self, *, q_dtype: Any, kv_dtype: Any, head_dim: int, group: int, q_len: int,
                   kv_len: int) -> int:
        """VMEM one grid step needs: double-buffered q/k/v/out blocks, scratch and score tiles.

        A step holds the ``group`` q heads of one kv head: q, out and the
        softmax scratch scale with it; the score tiles do not (heads take turns).
        """
        import numpy as np

        bq, bk, bkc = self.effective(q_len=q_len, kv_len=kv_len)
        q_bytes = np.dtype(q_dtype).itemsize
        kv_bytes = np.dtype(kv_dtype).itemsize
        pipelined = PIPELINE_BUFFERS * (2 * group * bq * head_dim * q_bytes + 2 * bk * head_dim * kv_bytes)
        scratch = F32_BYTES * group * bq * (2 * LANES + head_dim)
        # Scores and probabilities in f32, plus probabilities cast to the V dtype.
        temporaries = bq * bkc * (2 * F32_BYTES + kv_bytes)
        return int(pipelined + scratch + temporaries)


def _name(dtype: Any) -> str:
    import numpy as np

    return np.dtype(dtype).name


#: Defaults per TPU generation. v6e/v7x have 256-wide MXUs and 32 MiB of
#: scoped VMEM, so they take wider K/V blocks; earlier chips 16 MiB.
DEFAULT_BLOCK_SIZES: dict[str, FlashAttentionBlockSizes] = {
    "tpu-v4": FlashAttentionBlockSizes(block_q=512, block_kv=512, block_kv_compute=512),
    "tpu-v5e": FlashAttentionBlockSizes(block_q=512, block_kv=1024, block_kv_compute=512),
    "tpu-v5p": FlashAttentionBlockSizes(block_q=512, block_kv=1024, block_kv_compute=512),
    "tpu-v6e": FlashAttentionBlockSizes(block_q=512, block_kv=2048, block_kv_compute=512),
    "tpu-7x": FlashAttentionBlockSizes(block_q=512, block_kv=2048, block_kv_compute=512),
}


def default_block_sizes(chip: str, *, q_dtype: Any = "bfloat16", kv_dtype: Any = "bfloat16",
                        head_dim: int = 128, group: int = 1, q_len: int = 8192, kv_len: int = 8192,
                        vmem_limit: int | None = None) -> FlashAttentionBlockSizes:
    """The chip's tuned defaults, with block_q halved while a step would overflow ``vmem_limit``.

    Large GQA groups multiply the per-step query state, hence the shrinking.
    ValueError naming ``chip`` if it has no defaults.
    """
    import dataclasses

    try:
        sizes = DEFAULT_BLOCK_SIZES[chip]
    except KeyError:
        known = ", ".join(DEFAULT_BLOCK_SIZES)
        raise ValueError(
            f"chip: no flash_attention block-size defaults for '{chip}'; use one of {known} "
            "or pass block_sizes=FlashAttentionBlockSizes(...)"
        ) from None
    if vmem_limit is None:
        return sizes
    floor = sublane_multiple(q_dtype)
    while sizes.block_q > floor and sizes.vmem_bytes(
            q_dtype=q_dtype, kv_dtype=kv_dtype, head_dim=head_dim, group=group, q_len=q_len,
            kv_len=kv_len) > vmem_limit:
        sizes = dataclasses.replace(sizes, block_q=max(floor, sizes.block_q // 2))
    return sizes
