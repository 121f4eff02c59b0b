"""The request stream of a benchmark client, as ``vllm bench serve`` builds it.

:func:`build_requests` turns a :class:`Workload` (the client flags) into a
tuple of :class:`Request`: prompt and output lengths from the dataset, send
times from the arrival process. Everything is drawn from one
``numpy.random.Generator`` seeded with ``seed``: the same flags give the
same stream.

* ``random``: input lengths uniform over ``[L*(1-r), L*(1+r)]`` (integers,
  ``r`` = ``random_range_ratio``), output lengths likewise; a shared
  ``random_prefix_len`` tokens in front of every prompt (one prefix group).
* ``prefix-repetition``: ``num_prefixes`` prefixes of ``prefix_len`` tokens,
  each prompt one of them (round robin, shuffled) plus ``suffix_len`` own
  tokens; ``output_len`` output tokens.
* ``sharegpt``: a ShareGPT-format JSON file (a list of conversations, each
  ``{"conversations": [{"from": ..., "value": text}, ...]}``): the first two
  turns give the prompt and the completion. perfmodel has no tokenizer, so a
  text's tokens are estimated as ``ceil(chars / 4)`` (OpenAI's rule of thumb
  for English text with BPE tokenizers); as vLLM, pairs with a prompt or
  completion under 4 tokens, a prompt over 1024 or prompt + completion over
  2048 tokens are skipped. A file whose turns carry ``"tokens"`` (integer
  counts) uses those instead of the estimate.
* ``trace``: JSON Lines, one request per line: ``arrival_s``,
  ``input_tokens``, ``output_tokens`` and optionally ``prefix_group`` (any
  string or integer) with ``prefix_tokens`` (the leading tokens it shares with
  every request of its group). Arrival times come from the file.

Arrivals (not for ``trace``): ``request_rate`` inf sends every request at
t = 0; a finite rate draws gaps from a gamma distribution with shape
``burstiness`` and mean ``1 / request_rate`` (burstiness 1 is a Poisson
process), as vLLM's client does. ``max_concurrency`` is applied by the
engine simulation (a request is sent when one of the slots frees).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from perfmodel.errors import InputError

DATASETS: tuple[str, ...] = ("random", "sharegpt", "prefix-repetition", "trace")
#: Characters per token for ShareGPT text (no tokenizer here): OpenAI's rule of thumb for English BPE text.
CHARS_PER_TOKEN = 4
#: vLLM's ShareGPT filter: drop pairs with a prompt or completion under 4 tokens, a prompt over 1024 tokens or a
#: pair over 2048 tokens (vllm/benchmarks/datasets.py is_valid_sequence defaults).
SHAREGPT_MIN_TOKENS, SHAREGPT_MAX_PROMPT, SHAREGPT_MAX_TOTAL = 4, 1024, 2048


@dataclass(frozen=True, kw_only=True)
class Request:
    """One request of the stream."""

    #: Position in the stream (0-based).
    index: int
    #: Seconds after the benchmark start at which the client would send it (before any concurrency limit).
    arrival_s: float
    input_tokens: int
    output_tokens: int
    #: Requests of one group share their first ``prefix_tokens`` prompt tokens (None: no shared prefix).
    prefix_group: str | None = None
    prefix_tokens: int = 0


@dataclass(frozen=True, kw_only=True)
class Workload:
    """The flags of ``vllm bench serve`` that shape the stream (vLLM's names, underscores for dashes)."""

    dataset_name: str = "random"
    dataset_path: str | None = None
    num_prompts: int = 1000
    random_input_len: int = 1024
    random_output_len: int = 128
    random_range_ratio: float = 0.0
    random_prefix_len: int = 0
    prefix_repetition_prefix_len: int = 256
    prefix_repetition_suffix_len: int = 256
    prefix_repetition_num_prefixes: int = 10
    prefix_repetition_output_len: int = 128
    #: Requests per second; inf sends all at t = 0.
    request_rate: float = math.inf
    burstiness: float = 1.0
    #: Requests in flight at most (None: no limit).
    max_concurrency: int | None = None
    seed: int = 0


#: Bounds of a simulated stream: beyond them a run would not finish on one machine (one-line error instead).
MAX_PROMPTS = 1_000_000
MAX_TOKENS = 10_000_000
MIN_REQUEST_RATE = 1e-6


def check_workload(w: Workload) -> Workload:
    """One-line InputError naming the flag for a bad value."""
    if w.dataset_name not in DATASETS:
        raise InputError(f"`dataset_name`: got '{w.dataset_name}'; use one of {', '.join(DATASETS)}")
    if w.dataset_name in ("sharegpt", "trace") and not w.dataset_path:
        raise InputError(f"`dataset_path`: --dataset-name {w.dataset_name} reads a file; give its path")
    _whole("num_prompts", w.num_prompts, minimum=1, maximum=MAX_PROMPTS)
    for name in ("random_input_len", "random_output_len", "prefix_repetition_num_prefixes",
                 "prefix_repetition_output_len"):
        _whole(name, getattr(w, name), minimum=1, maximum=MAX_TOKENS)
    for name in ("random_prefix_len", "prefix_repetition_prefix_len", "prefix_repetition_suffix_len"):
        _whole(name, getattr(w, name), minimum=0, maximum=MAX_TOKENS)
    _whole("seed", w.seed, minimum=0, maximum=2**63 - 1)
    if not 0.0 <= w.random_range_ratio < 1.0:
        raise InputError(f"`random_range_ratio` must be in [0, 1), got {w.random_range_ratio}")
    if not (w.request_rate >= MIN_REQUEST_RATE):
        raise InputError(f"`request_rate` must be at least {MIN_REQUEST_RATE:g} requests/s, or inf, got "
                         f"{w.request_rate}")
    if not (1e-3 <= w.burstiness <= 1e3):
        raise InputError(f"`burstiness` must be in [0.001, 1000] (1 = Poisson), got {w.burstiness}")
    if w.max_concurrency is not None:
        _whole("max_concurrency", w.max_concurrency, minimum=1, maximum=MAX_PROMPTS)
    return w


def _whole(name: str, value: Any, *, minimum: int, maximum: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise InputError(f"`{name}` must be a whole number >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise InputError(f"`{name}` {value} is beyond what a simulation here can run; at most {maximum:,}")


def build_requests(w: Workload) -> tuple[Request, ...]:
    """The stream of ``w`` (see the module docstring)."""
    check_workload(w)
    rng = np.random.default_rng(w.seed)
    if w.dataset_name == "trace":
        return read_trace(w.dataset_path, limit=w.num_prompts)
    if w.dataset_name == "random":
        ins, outs = _random_lengths(rng, w)
        groups = ["random-prefix"] * len(ins) if w.random_prefix_len else [None] * len(ins)
        prefix = w.random_prefix_len
        ins = ins + prefix
    elif w.dataset_name == "prefix-repetition":
        n = w.num_prompts
        prefix = w.prefix_repetition_prefix_len
        ins = np.full(n, prefix + w.prefix_repetition_suffix_len, dtype=np.int64)
        outs = np.full(n, w.prefix_repetition_output_len, dtype=np.int64)
        which = np.arange(n) % w.prefix_repetition_num_prefixes
        rng.shuffle(which)
        groups = [f"prefix-{int(g)}" if prefix else None for g in which]
    else:
        ins, outs = _sharegpt_lengths(w.dataset_path, w.num_prompts, rng)
        groups, prefix = [None] * len(ins), 0
    if np.any(ins < 1):
        raise InputError("`random_input_len`: the drawn prompt lengths include 0 tokens; raise --random-input-len "
                         "or lower --random-range-ratio")
    arrivals = arrival_times(len(ins), w.request_rate, w.burstiness, rng)
    return tuple(Request(index=i, arrival_s=float(arrivals[i]), input_tokens=int(ins[i]), output_tokens=int(outs[i]),
                         prefix_group=groups[i], prefix_tokens=prefix if groups[i] is not None else 0)
                 for i in range(len(ins)))


def _random_lengths(rng: np.random.Generator, w: Workload) -> tuple[np.ndarray, np.ndarray]:
    """Integers uniform over [L(1-r), L(1+r)] (vLLM's RandomDataset), input then output."""
    def draw(length: int) -> np.ndarray:
        lo, hi = int(length * (1 - w.random_range_ratio)), int(length * (1 + w.random_range_ratio))
        return rng.integers(max(lo, 1), max(hi, 1) + 1, size=w.num_prompts, dtype=np.int64)
    return draw(w.random_input_len), draw(w.random_output_len)


def arrival_times(n: int, rate: float, burstiness: float, rng: np.random.Generator) -> np.ndarray:
    """Send times of ``n`` requests: all at 0 for an infinite rate, else cumulative gamma gaps (shape
    ``burstiness``, scale ``1 / (rate * burstiness)``: mean ``1 / rate``), the first request at t = 0."""
    if math.isinf(rate):
        return np.zeros(n)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    gaps[0] = 0.0
    return np.cumsum(gaps)


def _tokens(turn: Any, where: str) -> int:
    if not isinstance(turn, dict) or not isinstance(turn.get("value", ""), str):
        raise InputError(f"{where}: each turn must be an object with a text 'value'")
    if "tokens" in turn:
        t = turn["tokens"]
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise InputError(f"{where}: 'tokens' must be a whole number >= 0, got {t!r}")
        return t
    return math.ceil(len(turn.get("value", "")) / CHARS_PER_TOKEN)


def _sharegpt_lengths(path: str, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(prompt, completion) token counts of ``n`` conversations of a ShareGPT file, shuffled with ``rng``."""
    file = Path(path)
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"`dataset_path`: {path} does not exist") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"`dataset_path`: {path} is not a ShareGPT JSON file ({exc}); give a list of "
                         "{\"conversations\": [...]} objects") from None
    if not isinstance(data, list):
        raise InputError(f"`dataset_path`: {path} must hold a JSON list of conversations")
    pairs = []
    for i, conv in enumerate(data):
        turns = conv.get("conversations") if isinstance(conv, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue
        where = f"{path}: conversation {i}"
        p, c = _tokens(turns[0], where), _tokens(turns[1], where)
        if p < SHAREGPT_MIN_TOKENS or c < SHAREGPT_MIN_TOKENS or p > SHAREGPT_MAX_PROMPT or p + c > SHAREGPT_MAX_TOTAL:
            continue
        pairs.append((p, c))
    if len(pairs) < n:
        raise InputError(f"`num_prompts` {n}: {path} has only {len(pairs)} usable conversations (prompt and "
                         f"completion >= {SHAREGPT_MIN_TOKENS} tokens, prompt <= {SHAREGPT_MAX_PROMPT}, both <= "
                         f"{SHAREGPT_MAX_TOTAL}); lower --num-prompts")
    order = rng.permutation(len(pairs))[:n]
    arr = np.asarray(pairs, dtype=np.int64)[order]
    return arr[:, 0], arr[:, 1]


TRACE_FIELDS = ("arrival_s", "input_tokens", "output_tokens", "prefix_group", "prefix_tokens")


def read_trace(path: str | None, *, limit: int | None = None) -> tuple[Request, ...]:
    """Requests of a JSONL trace (see the module docstring); InputError naming ``file:line`` for a bad line."""
    file = Path(str(path))
    try:
        raw = file.read_bytes()
    except FileNotFoundError:
        raise InputError(f"`dataset_path`: {path} does not exist") from None
    out: list[Request] = []
    for lineno, line in enumerate(raw.splitlines(), 1):
        where = f"{path}:{lineno}"
        try:
            text = line.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise InputError(f"{where}: not UTF-8 text; save the trace as UTF-8 JSON Lines") from None
        if not text:
            continue
        try:
            rec = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"{where}: not a JSON object ({exc.msg}); one object per line") from None
        if not isinstance(rec, dict):
            raise InputError(f"{where}: not a JSON object; one object per line")
        unknown = [k for k in rec if k not in TRACE_FIELDS]
        if unknown:
            raise InputError(f"{where}: unknown field '{unknown[0]}'; fields: {', '.join(TRACE_FIELDS)}")
        out.append(_trace_request(rec, where, len(out)))
        if limit is not None and len(out) == limit:
            break
    if not out:
        raise InputError(f"`dataset_path`: {path} holds no requests")
    if any(b.arrival_s < a.arrival_s for a, b in zip(out, out[1:])):
        out.sort(key=lambda r: r.arrival_s)
        out = [Request(**{**r.__dict__, "index": i}) for i, r in enumerate(out)]
    return tuple(out)


def _trace_request(rec: dict, where: str, index: int) -> Request:
    for key in ("arrival_s", "input_tokens", "output_tokens"):
        if key not in rec:
            raise InputError(f"{where}: missing '{key}'; each line needs arrival_s, input_tokens, output_tokens")
    t = rec["arrival_s"]
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
        raise InputError(f"{where}: 'arrival_s' must be a finite number of seconds >= 0, got {t!r}")
    counts = {}
    for key, minimum in (("input_tokens", 1), ("output_tokens", 1), ("prefix_tokens", 0)):
        v = rec.get(key, 0)
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise InputError(f"{where}: '{key}' must be a whole number >= {minimum}, got {v!r}")
        counts[key] = v
    group = rec.get("prefix_group")
    if group is not None and (isinstance(group, bool) or not isinstance(group, (str, int))):
        raise InputError(f"{where}: 'prefix_group' must be a string or an integer, got {group!r}")
    if counts["prefix_tokens"] and group is None:
        raise InputError(f"{where}: 'prefix_tokens' needs a 'prefix_group' naming the requests that share them")
    if counts["prefix_tokens"] > counts["input_tokens"]:
        raise InputError(f"{where}: 'prefix_tokens' {counts['prefix_tokens']} exceeds 'input_tokens' "
                         f"{counts['input_tokens']}")
    return Request(index=index, arrival_s=float(t), input_tokens=counts["input_tokens"],
                   output_tokens=counts["output_tokens"], prefix_group=None if group is None else str(group),
                   prefix_tokens=counts["prefix_tokens"])
