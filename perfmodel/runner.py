"""One runner for perfmodel's embarrassingly parallel jobs (plan's simulations, serve sweeps, ...): a function over
a list of task inputs, run in this process, on a local process pool, or on a Ray cluster.

* ``inprocess``: one after another (small jobs; the default below :data:`POOL_MIN_TASKS` tasks);
* ``process``: ``concurrent.futures.ProcessPoolExecutor`` with ``workers`` processes (default: every core);
* ``thread``: a thread pool of ``workers`` threads, for tasks that wait on child processes of their own (deviceless
  compiles run in perfmodel.compiler's compile servers, one per concurrent compile): the threads share this
  process's servers, where a process pool would start servers again in every worker;
* ``ray``: Ray tasks (``address`` "auto" starts or joins a local Ray instance, else a cluster's address); Ray is the
  optional extra ``perfmodel[ray]``, imported only here and only when asked for. The function and its inputs travel
  to the workers pickled (module-level functions, plain data); a worker that runs deviceless compiles needs the
  ``tpu-compiler`` extra installed and the same environment variables as the driver (LIBTPU_INIT_ARGS, XLA_FLAGS,
  PERFMODEL_CACHE_DIR), which a Ray ``runtime_env`` carries: :func:`ray_runtime_env` builds it.

``batch`` > 1 sends that many consecutive tasks to a worker as one (the pool's and Ray's per-task cost paid once,
and a worker's per-process caches hit: plan orders a deployment's configurations one after another). Every
backend returns the same :class:`TaskResult` list in input order; a task that raised is reported with its
inputs and the error (``type: message``), never lost; ``on_result`` sees each result as it finishes (to append it
to a results file), ``progress(message, done=, total=)`` the count.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from perfmodel.errors import InputError

BACKENDS = ("auto", "inprocess", "process", "thread", "ray")
#: Fewer tasks than this run in process under "auto" (a pool's start-up costs more than it saves).
POOL_MIN_TASKS = 8
#: Environment variables a compile depends on (carried to Ray workers).
CARRIED_ENV_PREFIXES = ("JAX_", "XLA_", "LIBTPU", "TPU_", "PERFMODEL_")


@dataclass(frozen=True, kw_only=True)
class TaskResult:
    index: int
    inputs: Any
    value: Any = None
    #: "ExceptionType: message" when the task raised; None when it returned.
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def _call(fn: Callable[[Any], Any], index: int, inputs: Any) -> TaskResult:
    """Run one task, catching what it raises (module level: picklable for pools and Ray)."""
    try:
        return TaskResult(index=index, inputs=inputs, value=fn(inputs))
    except Exception as exc:  # a failed task is a result, not a lost one
        return TaskResult(index=index, inputs=inputs, error=f"{type(exc).__name__}: {exc}")


def _call_batch(fn: Callable[[Any], Any], batch: Sequence[tuple[int, Any]]) -> list[TaskResult]:
    """Run consecutive tasks in one worker, each caught on its own."""
    return [_call(fn, i, t) for i, t in batch]


def _batches(tasks: Sequence[Any], size: int) -> list[list[tuple[int, Any]]]:
    indexed = list(enumerate(tasks))
    return [indexed[i:i + size] for i in range(0, len(indexed), size)]


def ray_runtime_env() -> dict[str, Any]:
    """A Ray ``runtime_env`` carrying the environment variables compiles depend on."""
    env = {k: v for k, v in os.environ.items() if k.startswith(CARRIED_ENV_PREFIXES)}
    return {"env_vars": env} if env else {}


def run_tasks(fn: Callable[[Any], Any], tasks: Sequence[Any], *, backend: str = "auto", workers: int | None = None,
              address: str | None = None, on_result: Callable[[TaskResult], None] | None = None,
              progress: Callable[..., None] | None = None, batch: int = 1) -> list[TaskResult]:
    """``fn`` over every task (see the module docstring); results in input order."""
    if backend not in BACKENDS:
        raise InputError(f"`backend` '{backend}': use one of {', '.join(BACKENDS)}")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise InputError(f"`workers` must be a whole number >= 1, got {workers}")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise InputError(f"`batch` must be a whole number >= 1, got {batch}")
    if backend == "auto":
        backend = "ray" if address else ("process" if len(tasks) >= POOL_MIN_TASKS and (workers or 2) > 1
                                          else "inprocess")
    results: list[TaskResult | None] = [None] * len(tasks)
    finished = 0

    def done(r: TaskResult) -> None:
        nonlocal finished
        results[r.index] = r
        finished += 1
        if on_result is not None:
            on_result(r)
        if progress is not None:
            progress(f"{finished}/{len(tasks)}", done=finished, total=len(tasks))

    if backend == "inprocess":
        for i, t in enumerate(tasks):
            done(_call(fn, i, t))
    elif backend in ("process", "thread"):
        _run_pool(fn, _batches(tasks, batch), workers, done, threads=backend == "thread")
    else:
        _run_ray(fn, _batches(tasks, batch), workers, address or "auto", done)
    return [r for r in results if r is not None]


def _run_pool(fn: Callable[[Any], Any], batches: list[list[tuple[int, Any]]], workers: int | None,
              done: Callable[[TaskResult], None], *, threads: bool) -> None:
    import multiprocessing
    from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor, as_completed

    size = workers or os.cpu_count() or 1
    if threads:
        executor: Executor = ThreadPoolExecutor(max_workers=size)
    else:  # spawn: the workers start clean (no copy of a parent that may hold jax or threads)
        executor = ProcessPoolExecutor(max_workers=size, mp_context=multiprocessing.get_context("spawn"))
    with executor as pool:
        futures = [pool.submit(_call_batch, fn, b) for b in batches]
        for f in as_completed(futures):
            for r in f.result():
                done(r)


def _run_ray(fn: Callable[[Any], Any], batches: list[list[tuple[int, Any]]], workers: int | None, address: str,
             done: Callable[[TaskResult], None]) -> None:
    try:
        import ray
    except ImportError:
        raise InputError("`ray`: Ray is not installed; pip install 'perfmodel[ray]' (or drop --ray for the local "
                         "process pool)") from None
    if not ray.is_initialized():
        kw: dict[str, Any] = dict(ignore_reinit_error=True, log_to_driver=False, runtime_env=ray_runtime_env())
        if address == "auto":
            kw["num_cpus"] = workers or os.cpu_count() or 1
            try:
                ray.init(address="auto", **{k: v for k, v in kw.items() if k != "num_cpus"})
            except (ConnectionError, RuntimeError, ValueError):
                # no cluster running: start a local one, without the dashboard (its processes take CPU from
                # the workers on a small machine)
                ray.init(include_dashboard=False, **kw)
        else:
            ray.init(address=address, **kw)
    remote = ray.remote(_call_batch)
    pending = [remote.remote(fn, b) for b in batches]
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        for ref in ready:
            for r in ray.get(ref):
                done(r)
