"""The client flags of ``vllm bench serve`` (dataset, lengths, prompts, rate, concurrency, seed) shared by
``perfmodel serve`` and ``perfmodel plan``, and the goodput SLO arguments that may follow ``--goodput`` as vLLM
writes them (``--goodput ttft:500 tpot:50``)."""

from __future__ import annotations

import math
import re
from typing import Any, Callable

import click

from perfmodel.errors import InputError

#: Workload keyword names of perfmodel.serve.workload.Workload taken from the command's options.
WORKLOAD_FIELDS = ("dataset_name", "dataset_path", "num_prompts", "random_input_len", "random_output_len",
                   "random_range_ratio", "random_prefix_len", "prefix_repetition_prefix_len",
                   "prefix_repetition_suffix_len", "prefix_repetition_num_prefixes", "prefix_repetition_output_len",
                   "request_rate", "burstiness", "max_concurrency", "seed")
GOODPUT_ITEM = re.compile(r"^(ttft|tpot|e2el):")


def _rate(ctx: click.Context, param: click.Parameter, value: str) -> float:
    try:
        return math.inf if value == "inf" else float(value)
    except ValueError:
        raise click.BadParameter(f"'{value}': give requests per second or inf") from None


def workload_options(fn: Callable) -> Callable:
    """The client flags, vLLM's names and defaults (``--num-prompts`` 1000, random 1024 in / 128 out, ...)."""
    opts = [
        click.option("--dataset-name", type=click.Choice(["random", "sharegpt", "prefix-repetition", "trace"]),
                     default="random", show_default=True),
        click.option("--dataset-path", default=None, help="ShareGPT JSON, or the trace (JSONL: arrival_s, "
                     "input_tokens, output_tokens, optional prefix_group, prefix_tokens)."),
        click.option("--num-prompts", type=int, default=1000, show_default=True),
        click.option("--random-input-len", type=int, default=1024, show_default=True),
        click.option("--random-output-len", type=int, default=128, show_default=True),
        click.option("--random-range-ratio", type=float, default=0.0, show_default=True),
        click.option("--random-prefix-len", type=int, default=0, show_default=True),
        click.option("--prefix-repetition-prefix-len", type=int, default=256, show_default=True),
        click.option("--prefix-repetition-suffix-len", type=int, default=256, show_default=True),
        click.option("--prefix-repetition-num-prefixes", type=int, default=10, show_default=True),
        click.option("--prefix-repetition-output-len", type=int, default=128, show_default=True),
        click.option("--request-rate", default="inf", show_default=True, callback=_rate,
                     help="Requests per second (Poisson with --burstiness 1) or inf (all at once)."),
        click.option("--burstiness", type=float, default=1.0, show_default=True,
                     help="Gamma shape of the arrival gaps."),
        click.option("--max-concurrency", type=int, default=None, help="Requests in flight at most."),
        click.option("--seed", type=int, default=0, show_default=True),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def workload_from(options: dict[str, Any]) -> Any:
    """The Workload of the command's client options (popped from ``options``)."""
    from perfmodel.serve.workload import Workload

    return Workload(**{k: options.pop(k) for k in WORKLOAD_FIELDS})


def split_model_and_goodput(args: tuple[str, ...], goodput: tuple[str, ...],
                            config_path: str | None) -> tuple[str | None, tuple[str, ...]]:
    """(MODEL or None with --config, the goodput SLOs): arguments that look like METRIC:MS belong to --goodput."""
    names = [a for a in args if not GOODPUT_ITEM.match(a)]
    goodput = goodput + tuple(a for a in args if GOODPUT_ITEM.match(a))
    if len(names) > 1:
        raise InputError(f"one MODEL, got {' '.join(names)}; goodput SLOs are METRIC:MS after --goodput")
    if (not names) == (config_path is None):
        raise InputError("give a MODEL or --config PATH (one of them); perfmodel predict model --list shows models")
    return (names[0] if names else None), goodput
