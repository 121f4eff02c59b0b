"""Pure functions from chip specs to tables and JSON-able records (for `perfmodel hw`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from perfmodel import units
from perfmodel.hw.spec import MATMUL_DTYPES, ChipSpec
from perfmodel.hw.views import devices_text

_LIST_DTYPES = ("bf16", "int8", "fp8")
#: The spec's sections, in the order `perfmodel hw show` prints them.
SECTIONS = ("cores", "compute", "memory", "interconnect", "overheads", "compiler")


def _tflops(chip: ChipSpec, dtype: str) -> str:
    rate = chip.matmul_rate(dtype)
    return "-" if rate is None else f"{rate / 1e12:,.0f}"


def ridge_text(ridge: float | None) -> str:
    """A ridge point as every `perfmodel hw` view prints it: ``ridge_text(1835.6) == "1,836 FLOP/B"``."""
    return "-" if ridge is None else f"{ridge:,.0f} FLOP/B"


def _count_text(value: int | float) -> str:
    """A unitless count: an integer (also one stored as a float, e.g. 8.0) with thousands separators."""
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return f"{int(value):,}"
    return f"{value:g}"


def summary_record(chip: ChipSpec) -> dict[str, Any]:
    """The headline numbers of one chip, in base units, with explicit names."""
    return {
        "name": chip.name,
        "display_name": chip.display_name,
        "vendor": chip.vendor,
        "year": chip.year,
        "cores_per_chip": chip.cores.cores_per_chip,
        "jax_devices_per_chip": chip.cores.jax_devices_per_chip,
        "matmul_flops_per_s_per_chip": dict(chip.compute.matmul_flops_per_s_per_chip),
        "hbm_bytes_per_chip": chip.memory.hbm_bytes_per_chip,
        "hbm_bw_bytes_per_s_per_chip": chip.memory.hbm_bw_bytes_per_s_per_chip,
        "vmem_bytes_per_core": chip.memory.vmem_bytes_per_core,
        "ridge_point_flops_per_byte": {d: chip.ridge_point(d) for d in MATMUL_DTYPES if chip.matmul_rate(d)},
    }


def list_table(chips: list[ChipSpec]) -> str:
    """`perfmodel hw list`: one row per chip."""
    headers = ["chip", "year", "bf16 TFLOP/s", "int8 TOP/s", "fp8 TFLOP/s", "HBM", "HBM BW", "VMEM/core", "ridge bf16"]
    rows = []
    for c in sorted(chips, key=lambda c: (c.kind != "tpu", c.year, c.name)):
        rows.append(
            [
                c.name,
                str(c.year),
                _tflops(c, "bf16"),
                _tflops(c, "int8"),
                _tflops(c, "fp8"),
                units.si(c.memory.hbm_bytes_per_chip, "B"),
                units.bandwidth(c.memory.hbm_bw_bytes_per_s_per_chip),
                units.binary(c.memory.vmem_bytes_per_core) if c.memory.vmem_bytes_per_core else "-",
                ridge_text(c.ridge_point("bf16")),
            ]
        )
    return units.table(headers, rows)


def _fmt_field(name: str, value: Any, int_ops: bool = False) -> str:
    """Format one spec value by the unit its field name carries."""
    if value is None:
        return "n/a (not public)"
    if isinstance(value, bool) or isinstance(value, str):
        return str(value)
    if isinstance(value, (tuple, list)):
        return ", ".join(str(v) for v in value) or "-"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_fmt_field(name, v, int_ops=k.startswith('int'))}" for k, v in value.items())
    if "_bytes_per_s" in name:
        return units.bandwidth(value)
    if "_flops_per_s" in name:
        return units.si(value, "OP/s") if int_ops else units.flops(value)
    if "_ops_per_s" in name:
        return units.si(value, "op/s")
    if "_bytes" in name:
        return f"{units.binary(value)} ({units.si(value, 'B')})"
    if name.endswith("_hz"):
        return units.si(value, "Hz")
    if name.endswith("_w"):
        return units.si(value, "W")
    if name.endswith("_s"):
        return units.seconds(value)
    if isinstance(value, (int, float)):
        return _count_text(value)
    return str(value)


def show_text(chip: ChipSpec) -> str:
    """`perfmodel hw show`: every field with its value, unit and source."""
    lines = [f"{chip.display_name} ({chip.name}), {chip.vendor}, {chip.year}"]
    lines.append(f"  aliases: {', '.join(chip.aliases) or '-'}")
    lines.append(f"  JAX device_kind: {', '.join(chip.jax_device_kinds) or '-'}")
    lines.append(f"  JAX devices per chip: {devices_text(chip)}")
    for section in SECTIONS:
        lines.append(f"{section}:")
        obj = getattr(chip, section)
        for f in dataclasses.fields(obj):
            path = f"{section}.{f.name}"
            value = getattr(obj, f.name)
            src = chip.sources.get(path)
            if isinstance(value, dict):
                srcs = {chip.sources.get(f"{path}.{k}", src) for k in value}
                src = ", ".join(sorted(s for s in srcs if s)) or None
            mark = " (derived)" if path in chip.derived else ""
            tail = f"  [{src}]" if src and value is not None else ""
            # compiler behaviour is known or absent, never "not public" (e.g. tpu-v2 has no deviceless target)
            text = "n/a" if value is None and section == "compiler" else _fmt_field(f.name, value)
            lines.append(f"  {f.name}: {text}{mark}{tail}")
    lines.append("ridge points (peak FLOP/s / HBM B/s):")
    for d in MATMUL_DTYPES:
        ridge = chip.ridge_point(d)
        if ridge is not None:
            lines.append(f"  {d}: {ridge_text(ridge)}")
    if chip.derived:
        lines.append("derived:")
        lines.extend(f"  {path}: {how}" for path, how in chip.derived.items())
    if chip.disagreements:
        lines.append("where sources disagree:")
        for d in chip.disagreements:
            leaf = d.field.rsplit(".", 1)[-1]  # the unit is in the field name
            chosen, other = _fmt_field(leaf, d.chosen), _fmt_field(leaf, d.other)
            lines.append(f"  {d.field}: chose {chosen} [{d.chosen_source}] over {other} [{d.other_source}]: {d.reason}")
    if chip.notes:
        lines.append("notes:")
        lines.extend(f"  {n}" for n in chip.notes)
    lines.append("references:")
    lines.extend(f"  [{ref}] {cite}" for ref, cite in chip.references.items())
    return "\n".join(lines)


def compare_table(chips: list[ChipSpec]) -> str:
    """`perfmodel hw compare`: chips side by side, ratios against the first."""
    base = chips[0]
    headers = ["", *(c.name for c in chips)]
    rows: list[list[str]] = []

    def add(label: str, getter, fmt, ratio: bool = True) -> None:
        vals = [getter(c) for c in chips]
        rows.append([label, *(fmt(v) for v in vals)])
        ref = vals[0]
        if ratio and ref and len(chips) > 1:
            rows.append([f"  x {base.name}", *("-" if v is None else f"{v / ref:.2f}x" for v in vals)])

    add("year", lambda c: c.year, str, ratio=False)
    add("cores/chip", lambda c: c.cores.cores_per_chip, str, ratio=False)
    for d in MATMUL_DTYPES:
        if any(c.matmul_rate(d) for c in chips):
            unit = "OP/s" if d.startswith("int") else "FLOP/s"
            add(f"{d} peak", lambda c, d=d: c.matmul_rate(d), lambda v, u=unit: "-" if v is None else units.si(v, u))
    add("HBM", lambda c: c.memory.hbm_bytes_per_chip, lambda v: units.si(v, "B"))
    add("HBM BW", lambda c: c.memory.hbm_bw_bytes_per_s_per_chip, units.bandwidth)
    add("VMEM/core", lambda c: c.memory.vmem_bytes_per_core, lambda v: "-" if v is None else units.binary(v))
    add("ICI BW/chip", lambda c: c.interconnect.ici_bw_bytes_per_s_per_chip, lambda v: "-" if v is None else units.bandwidth(v))
    for d in MATMUL_DTYPES:
        if any(c.ridge_point(d) for c in chips):
            rows.append([f"ridge {d}", *(ridge_text(c.ridge_point(d)) for c in chips)])
    return units.table(headers, rows)


def compare_record(chips: list[ChipSpec]) -> dict[str, Any]:
    base = chips[0]
    out = {"chips": [summary_record(c) for c in chips], "ratios_vs": base.name, "ratios": {}}
    for c in chips:
        r: dict[str, float | None] = {}
        for d in MATMUL_DTYPES:
            a, b = c.matmul_rate(d), base.matmul_rate(d)
            r[f"{d}_flops"] = None if not (a and b) else a / b
        r["hbm_bw"] = c.memory.hbm_bw_bytes_per_s_per_chip / base.memory.hbm_bw_bytes_per_s_per_chip
        r["hbm_capacity"] = c.memory.hbm_bytes_per_chip / base.memory.hbm_bytes_per_chip
        out["ratios"][c.name] = r
    return out
