"""`perfmodel hw`: the hardware-spec database."""

from __future__ import annotations

import click

from perfmodel.cli.common import echo_json, echo_text, json_option, user_errors
from perfmodel.errors import InputError
from perfmodel.hw import all_chips, get_chip
from perfmodel.hw import describe


@click.group(help="Browse the hardware-spec database (hwspecs/ and $PERFMODEL_HW_PATH).")
def hw() -> None:
    pass


@hw.command("list", help="One row per known chip: peaks, HBM, VMEM and bf16 ridge point.")
@json_option
@user_errors
def list_cmd(as_json: bool) -> None:
    chips = all_chips()
    if as_json:
        echo_json([describe.summary_record(c) for c in chips])
    else:
        echo_text(describe.list_table(chips))


@hw.command("show", help="Every field of one chip, with units and sources. CHIP: name, alias, JAX device_kind or spec file.")
@click.argument("chip")
@json_option
@user_errors
def show_cmd(chip: str, as_json: bool) -> None:
    spec = get_chip(chip)
    if as_json:
        echo_json(spec)
    else:
        echo_text(describe.show_text(spec))


@hw.command("compare", help="Chips side by side with ratios to the first and ridge points per dtype. "
            "CHIPS: names, aliases or spec files, space- or comma-separated (as --hw elsewhere).")
@click.argument("chips", nargs=-1, required=True)
@json_option
@user_errors
def compare_cmd(chips: tuple[str, ...], as_json: bool) -> None:
    specs = [get_chip(name.strip()) for c in chips for name in c.split(",") if name.strip()]
    if not specs:
        raise InputError("CHIPS: no chip name given; e.g. perfmodel hw compare tpu-v5e tpu-v6e")
    if as_json:
        echo_json(describe.compare_record(specs))
    else:
        echo_text(describe.compare_table(specs))
