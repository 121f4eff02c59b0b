"""KV-cache capacity of one replica: how many blocks fit in HBM beside the weights and the activations.

Per chip of the tensor-parallel group (every chip holds the same number of blocks, each a share of the KV heads):
``usable = HBM x gpu_memory_utilization`` (tpu-inference's ``determine_available_memory``), minus the chip's
weights (perfmodel.model.sharding.weight_bytes_per_chip), minus the activation workspace of the largest step
(ESTIMATE: ``max_num_batched_tokens`` tokens x (4 x hidden + the QKV width + 2 x the MLP width per chip) in the
activation dtype, plus f32 logits of ``max_num_seqs`` rows x the vocabulary per chip). The rest divided by one
block's bytes (``block_size`` tokens of every layer's K and V on this chip) is the block count. Sliding-window
layers are counted as full layers (vLLM's hybrid allocator would give them fewer blocks: capacity is then
underestimated for such models).
"""

from __future__ import annotations

from dataclasses import dataclass

from perfmodel.errors import InputError
from perfmodel.model.dtypes import DTYPES
from perfmodel.serve.config import EngineConfig


@dataclass(frozen=True, kw_only=True)
class KVCapacity:
    hbm_bytes_per_chip: float
    usable_bytes_per_chip: float
    weight_bytes_per_chip: float
    workspace_bytes_per_chip: float
    kv_bytes_per_block_per_chip: float
    num_blocks: int
    block_size: int

    @property
    def tokens(self) -> int:
        """KV tokens the replica holds."""
        return self.num_blocks * self.block_size

    @property
    def kv_bytes_per_chip(self) -> float:
        return self.num_blocks * self.kv_bytes_per_block_per_chip


def workspace_bytes(cfg: EngineConfig) -> float:
    """Activation workspace of the largest step per chip (ESTIMATE, module docstring)."""
    from perfmodel.model.sharding import shard

    m, sh = cfg.model, shard(cfg.model, cfg.tp)
    act = DTYPES[cfg.act_dtype].itemsize_bytes
    qkv = (sh.q_heads + 2 * sh.kv_heads) * m.head_dim
    mlp = max(sh.intermediate, sh.expert_intermediate * (m.moe.experts_per_token if m.moe else 0))
    per_token = (4 * m.hidden_size + qkv + 2 * mlp) * act
    logits = cfg.max_num_seqs * sh.vocab * 4
    return float(cfg.max_num_batched_tokens * per_token + logits)


def kv_capacity(cfg: EngineConfig) -> KVCapacity:
    """Blocks of one replica; InputError saying what is missing when the weights, or one ``max_model_len``
    sequence, do not fit."""
    from perfmodel.model.sharding import kv_bytes_per_token_per_layer, shard, weight_bytes_per_chip

    m = cfg.model
    sh = shard(m, cfg.tp)
    hbm = float(cfg.chip.memory.hbm_bytes_per_chip)
    usable = hbm * cfg.gpu_memory_utilization
    weights = weight_bytes_per_chip(m, sh, cfg.weight_dtype, cfg.act_dtype)
    work = workspace_bytes(cfg)
    per_block = cfg.block_size * m.num_layers * kv_bytes_per_token_per_layer(m, sh, cfg.kv_cache_dtype)
    free = usable - weights - work
    gib = 2.0**30
    if free <= 0:
        raise InputError(
            f"{m.name} does not fit on {cfg.chip.name} x{cfg.tp}: weights {weights / gib:.1f} GiB + activation "
            f"workspace {work / gib:.1f} GiB per chip exceed {cfg.gpu_memory_utilization:g} x "
            f"{hbm / gib:.1f} GiB of HBM by {-free / gib:.1f} GiB; raise `tp`, quantize the weights "
            "(`weight_dtype` int8/fp8/int4) or lower `max_num_batched_tokens`")
    blocks = int(free // per_block)
    needed = -(-cfg.max_model_len // cfg.block_size)
    if blocks < needed:
        raise InputError(
            f"`max_model_len` {cfg.max_model_len}: the KV cache holds {blocks * cfg.block_size} tokens on "
            f"{cfg.chip.name} x{cfg.tp} ({free / gib:.2f} GiB per chip after weights and workspace), fewer than "
            f"one sequence needs; raise `gpu_memory_utilization` or `tp`, use `kv_cache_dtype` int8/fp8, or lower "
            "`max_model_len`")
    return KVCapacity(hbm_bytes_per_chip=hbm, usable_bytes_per_chip=usable, weight_bytes_per_chip=weights,
                      workspace_bytes_per_chip=work, kv_bytes_per_block_per_chip=per_block, num_blocks=blocks,
                      block_size=cfg.block_size)
