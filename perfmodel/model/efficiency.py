"""Achievable share of each unit's peak: a plateau per chip and dtype, a ramp with the contraction size, and
GPU wave quantization, fitted on public measurements (``perfmodel/data/calibration/efficiency.yaml``).

:func:`mxu_factor` is what an op model multiplies into :attr:`OpCost.mxu_efficiency` (the ramp and the
waves of one GEMM shape); :func:`unit_shares` is what :func:`perfmodel.model.core.evaluate` divides each
unit's time by for ``expected_s``. Chips and dtypes the file does not list use :data:`perfmodel.model.core.ACHIEVABLE`.
No jax; the file is read once, on first use.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np

EFFICIENCY_FILE = "calibration/efficiency.yaml"


@dataclass(frozen=True, kw_only=True)
class GpuTileRule:
    """Output tiles a GPU GEMM library picks per shape to fill the SMs (DeepGEMM's rule): ``tile_m_small`` rows
    when M <= ``small_m_max``, else ``tile_m``; of the ``tile_n`` column widths, the one with the fewest waves,
    then the fullest last wave."""

    tile_m: int
    tile_m_small: int
    small_m_max: int
    tile_n: tuple[int, ...]


_TILE_RULE_FIELDS = ("tile_m", "tile_m_small", "small_m_max", "tile_n")


def _tile_rule(chip_name: str, value: dict[str, Any] | None) -> GpuTileRule | None:
    if value is None:
        return None
    where = f"{EFFICIENCY_FILE}: chips.{chip_name}.gpu_tile_rule"
    if set(value) != set(_TILE_RULE_FIELDS):
        raise ValueError(f"{where}: give exactly {', '.join(_TILE_RULE_FIELDS)} (got {', '.join(sorted(value))})")
    widths = tuple(int(w) for w in value["tile_n"])
    if not widths or min(widths) < 1:
        raise ValueError(f"{where}.tile_n: a non-empty list of positive column widths")
    return GpuTileRule(tile_m=int(value["tile_m"]), tile_m_small=int(value["tile_m_small"]),
                       small_m_max=int(value["small_m_max"]), tile_n=widths)


@dataclass(frozen=True, kw_only=True)
class ChipEfficiency:
    """The fitted figures of one chip (defaults filled in)."""

    #: Plateau share of the MXU / tensor-core peak per matmul rate key; ``default_mxu_share`` for others.
    mxu_share: dict[str, float]
    default_mxu_share: float
    #: K at which a GEMM reaches half of the plateau's per-tile efficiency gap (0: no ramp).
    mxu_k_half: float
    hbm_share: float
    #: GPU output tile (rows, cols) for wave quantization; None on TPUs (their padding is in the issued FLOPs).
    gpu_tile: tuple[int, int] | None
    #: GPU tiles chosen per shape instead of one fixed ``gpu_tile`` (None: the fixed tile, if any).
    gpu_tile_rule: GpuTileRule | None
    #: TensorCore cycles one gathered row costs (per core); None where no gather was measured.
    gather_row_cycles: float | None
    #: Achievable share of each unit's per-core peak in a Pallas kernel (the schedule model's rates,
    #: :func:`kernel_shares`), per unit ("mxu", "vpu", "eup", "hbm"); units not listed use ACHIEVABLE.
    pallas_kernel_shares: dict[str, float]
    #: Seconds every grid step of a Pallas kernel adds after its compute or copies, whichever is longer (the
    #: step's own bookkeeping, which does not overlap them); 0 where none was fitted.
    pallas_step_residual_s: float
    #: Field -> the measurement it was fitted on.
    fitted_on: dict[str, str]


@functools.lru_cache(maxsize=1)
def _table() -> dict[str, Any]:
    """The parsed file, through the spec cache (a warm run does not import yaml, a large part of a short
    `predict` process)."""
    from pathlib import Path

    from perfmodel.hw.speccache import load_data_cached

    def parse(text: str) -> Any:
        import yaml

        return yaml.safe_load(text)

    return load_data_cached(Path(str(resources.files("perfmodel.data").joinpath(EFFICIENCY_FILE))), parse)


@functools.lru_cache(maxsize=None)
def chip_efficiency(chip_name: str) -> ChipEfficiency:
    """The fitted figures for a chip name (the defaults for a chip the file does not list)."""
    from perfmodel.model.core import ACHIEVABLE

    entry = _table().get("chips", {}).get(chip_name, {})
    tile = entry.get("gpu_tile")
    return ChipEfficiency(
        mxu_share={k: float(v) for k, v in entry.get("mxu_share", {}).items()},
        default_mxu_share=ACHIEVABLE["mxu"][0],
        mxu_k_half=float(entry.get("mxu_k_half", 0)),
        hbm_share=float(entry.get("hbm_share", ACHIEVABLE["hbm"][0])),
        gpu_tile=None if tile is None else (int(tile[0]), int(tile[1])),
        gpu_tile_rule=_tile_rule(chip_name, entry.get("gpu_tile_rule")),
        gather_row_cycles=_gather_cycles(entry),
        pallas_kernel_shares=_kernel_shares(chip_name, entry.get("pallas_kernel_shares", {})),
        pallas_step_residual_s=_step_residual(chip_name, entry.get("pallas_step_residual_s", 0.0)),
        fitted_on=dict(entry.get("fitted_on", {})),
    )


#: The units a Pallas kernel's per-core rates are scaled for (perfmodel.schedule.timing.core_rates).
KERNEL_UNITS = ("mxu", "vpu", "eup", "hbm")


def _kernel_shares(chip_name: str, value: dict[str, Any]) -> dict[str, float]:
    unknown = sorted(set(value) - set(KERNEL_UNITS))
    if unknown:
        raise ValueError(f"{EFFICIENCY_FILE}: chips.{chip_name}.pallas_kernel_shares: unknown unit(s) "
                         f"{', '.join(unknown)}; use {', '.join(KERNEL_UNITS)}")
    shares = {u: float(v) for u, v in value.items()}
    for u, v in shares.items():
        if not 0 < v <= 1:
            raise ValueError(f"{EFFICIENCY_FILE}: chips.{chip_name}.pallas_kernel_shares.{u} = {v}: a share of "
                             "peak is in (0, 1]")
    return shares


def kernel_shares(chip: Any) -> dict[str, float]:
    """Achievable share of each unit's per-core peak inside a Pallas kernel on ``chip`` (the schedule model's
    rates): the chip's fitted ``pallas_kernel_shares`` where the file has them, else
    :data:`perfmodel.model.core.ACHIEVABLE`. A kernel runs on TensorCores, so the one-device view of a chip
    (``tpu-7x/core``) has the chip's figures."""
    from perfmodel.model.core import ACHIEVABLE

    fitted = fitted_kernel_shares(chip)
    return {u: fitted.get(u, ACHIEVABLE[u][0]) for u in KERNEL_UNITS}


def step_residual_s(chip: Any) -> float:
    """Seconds a grid step of a Pallas kernel on ``chip`` adds after the longer of its compute and its copies
    (the chip's fitted ``pallas_step_residual_s``; 0 where none was fitted). The one-device view of a chip
    (``tpu-7x/core``) has the chip's figure."""
    return _kernel_chip_efficiency(chip).pallas_step_residual_s


def _step_residual(chip_name: str, value: Any) -> float:
    seconds = float(value)
    if not 0 <= seconds < 1e-3:
        raise ValueError(f"{EFFICIENCY_FILE}: chips.{chip_name}.pallas_step_residual_s = {value}: seconds per grid "
                         "step, in [0, 1e-3)")
    return seconds


def fitted_kernel_shares(chip: Any) -> dict[str, float]:
    """Only the units whose Pallas-kernel share :func:`kernel_shares` takes from a fit on measurements of the
    chip (empty where none was measured)."""
    return dict(_kernel_chip_efficiency(chip).pallas_kernel_shares)


def _kernel_chip_efficiency(chip: Any) -> ChipEfficiency:
    """The fitted figures a Pallas kernel on ``chip`` runs at: the whole chip's, for its one-device view too
    (a kernel runs on a TensorCore either way)."""
    from perfmodel.hw.views import split_device_suffix

    return chip_efficiency(split_device_suffix(chip.name)[0])


def _gather_cycles(entry: dict[str, Any]) -> float | None:
    value = entry.get("gather_row_cycles", _table().get("tpu_gather_row_cycles"))
    return None if value is None else float(value)


def gather_row_cycles(chip: Any) -> float | None:
    """Cycles per gathered row per TensorCore on a TPU (the chip's own fit, else the TPU-wide figure)."""
    if chip.kind != "tpu":
        return None
    return chip_efficiency(chip.name).gather_row_cycles


def xla_ragged_contraction_share(n: Any) -> np.ndarray:
    """Share of the bf16 MXU peak XLA's ragged-contraction convolution runs at (``jax.lax.ragged_dot_general``
    with the groups on the contracting rows: out[g] = lhs[rows of g]^T @ rhs[rows of g], [m, n] per group): a
    line in n, the output's minor (column) count, fitted with its fit points in the calibration file, capped at
    1."""
    fit = _table()["xla_ragged_contraction_mxu_share"]
    share = float(fit["base"]) + float(fit["per_column"]) * np.asarray(n, dtype=float)
    return np.minimum(share, 1.0)


def mxu_share(chip: Any, rate_key: str) -> float:
    """Plateau share of the chip's peak for matmuls at ``rate_key`` (e.g. "bf16")."""
    eff = chip_efficiency(chip.name)
    return eff.mxu_share.get(rate_key, eff.default_mxu_share)


def contraction_ramp(chip: Any, k: Any) -> np.ndarray:
    """K / (K + k_half): the share of the plateau a GEMM with contraction K reaches (1 without a ramp)."""
    half = chip_efficiency(chip.name).mxu_k_half
    k = np.asarray(k, dtype=float)
    return k / (k + half) if half else np.ones_like(k)


def wave_efficiency(chip: Any, m: Any, n: Any, batch: Any = 1) -> np.ndarray:
    """GPU wave quantization: output tiles over (waves x cores) slots; 1 on TPUs.

    Worked case: 4096 x 4096 outputs in 128 x 256 tiles = 512 tiles on 148 SMs = 4 waves of 148 slots
    (592), so 512 / 592 = 0.865 of the slots do work. With a per-shape rule (:class:`GpuTileRule`) the column
    width with the fewest waves, then the fullest last one, is taken."""
    eff = chip_efficiency(chip.name)
    tile, rule = eff.gpu_tile, eff.gpu_tile_rule
    shape = np.broadcast(np.asarray(m), np.asarray(n), np.asarray(batch)).shape
    if (tile is None and rule is None) or chip.kind != "gpu":
        return np.ones(shape)
    cores = chip.cores.cores_per_chip
    m, n, batch = (np.asarray(v, dtype=float) for v in (m, n, batch))
    if rule is None:
        return _fill(batch * np.ceil(m / tile[0]) * np.ceil(n / tile[1]), cores)
    rows = batch * np.ceil(m / np.where(m <= rule.small_m_max, rule.tile_m_small, rule.tile_m))
    tiles = np.stack([np.broadcast_to(rows * np.ceil(n / w), shape) for w in rule.tile_n])
    fills = _fill(tiles, cores)
    best = np.argmin(np.ceil(tiles / cores) + 0.5 * (1.0 - fills), axis=0)  # fewest waves (integers), then the fullest
    return np.take_along_axis(fills, best[None], axis=0)[0]


def _fill(tiles: np.ndarray, cores: int) -> np.ndarray:
    """The share of (waves x cores) tile slots that hold a tile."""
    return tiles / (np.ceil(tiles / cores) * cores)


def mxu_factor(chip: Any, *, m: Any, n: Any, k: Any, batch: Any = 1) -> np.ndarray:
    """The per-shape multiplier on the MXU share: contraction ramp x GPU waves (1 when chip is None)."""
    if chip is None:
        return np.ones(())
    return contraction_ramp(chip, k) * wave_efficiency(chip, m, n, batch)


def unit_shares(chip: Any, rate_key: str) -> dict[str, float]:
    """Achievable share of peak per unit for an op at ``rate_key``: mxu and hbm from the file, the other
    units from :data:`perfmodel.model.core.ACHIEVABLE` (assumptions, not fitted)."""
    from perfmodel.model.core import ACHIEVABLE

    shares = {u: v[0] for u, v in ACHIEVABLE.items()}
    shares["mxu"] = mxu_share(chip, rate_key)
    shares["hbm"] = chip_efficiency(chip.name).hbm_share
    return shares
