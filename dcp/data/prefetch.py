"""Planning ahead: the plans of the next global batches are solved in worker processes while
the current step trains, so a planner that is faster than a step costs the step nothing.

`PlanAhead.plans(jobs)` keeps `depth` batches in flight beyond the one being trained and yields
plans in job order with the time the consumer had to wait for each. Planner failures come back
as `PlanningError` naming the epoch and step; a worker that dies or overruns `timeout_s` does too,
and never leaves the training loop waiting forever. Never imports torch.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from dcp.costmodel import CostModel
from dcp.planner.options import StrategyOptions
from dcp.planner.plan import Plan
from dcp.planner.sample import Sample

Planner = Callable[[Sequence[Sample]], Plan]
"""Plans one global batch. Must be picklable (a module-level function, a dataclass instance,
a functools.partial of one) when plans are made in worker processes."""

START_TIMEOUT_S = 120.0
"""How long starting the worker processes may take (each imports dcp and unpickles the planner)."""

StepKey = tuple[int, int]
"""(epoch, step within epoch) of a global batch."""


class PlanningError(RuntimeError):
    """The planner failed, hung past its timeout, or its worker process died, for one step."""

    def __init__(self, message: str, *, epoch: int, step: int) -> None:
        super().__init__(message)
        self.epoch = epoch
        self.step = step


@dataclass(frozen=True)
class SolvePlanner:
    """The default planner: `dcp.planner.solve` with the job's cost model and strategy options.

    A dataclass rather than a closure so it pickles into worker processes."""

    cost_model: CostModel
    options: StrategyOptions | None = None

    def __call__(self, batch: Sequence[Sample]) -> Plan:
        from dcp.planner import solve

        return solve(batch, self.cost_model.cluster, self.cost_model, self.options)


# The planner lives in each worker once (set by the pool initializer), so a task ships only its
# batch, not the cost model.
_WORKER_PLANNER: Planner | None = None


def _init_worker(planner: Planner) -> None:
    global _WORKER_PLANNER
    _WORKER_PLANNER = planner


def _plan_in_worker(batch: Sequence[Sample]) -> Plan:
    assert _WORKER_PLANNER is not None, "worker started without a planner"
    return _WORKER_PLANNER(batch)


def _worker_pid() -> int:
    return os.getpid()


class _Inline:
    """A future-like that plans in the caller's process when its result is asked for."""

    def __init__(self, planner: Planner, batch: Sequence[Sample]) -> None:
        self._planner, self._batch = planner, batch

    def result(self, timeout: float | None = None) -> Plan:
        return self._planner(self._batch)

    def cancel(self) -> bool:
        return True


class PlanAhead:
    """Solves plans for upcoming steps in a process pool (or inline when `workers` is 0).

    Use as a context manager or call `close()`; the pool starts on first use or `start()`."""

    def __init__(self, planner: Planner, *, workers: int = 1, depth: int = 2,
                 mp_context: str = "spawn", timeout_s: float | None = None) -> None:
        if workers < 0:
            raise ValueError(f"plan workers must be >= 0, got {workers}")
        if depth < 0:
            raise ValueError(f"plan-ahead depth must be >= 0, got {depth}")
        if mp_context not in ("spawn", "forkserver"):
            # fork would copy the trainer's threads and CUDA state into the planner workers.
            raise ValueError(f"mp_context must be 'spawn' or 'forkserver', got {mp_context!r}")
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"plan timeout must be positive, got {timeout_s}")
        self.planner = planner
        self.workers = workers
        self.depth = depth
        self.mp_context = mp_context
        self.timeout_s = timeout_s
        self._pool: ProcessPoolExecutor | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start the worker processes and wait until each has loaded the planner."""
        if self.workers == 0 or self._pool is not None:
            return
        ctx = multiprocessing.get_context(self.mp_context)
        self._pool = ProcessPoolExecutor(self.workers, mp_context=ctx, initializer=_init_worker,
                                         initargs=(self.planner,))
        # Concurrent no-op tasks make the pool spawn every worker now, not in the first step. A
        # spawned worker imports dcp (seconds on a loaded machine): `timeout_s` bounds a plan, not this.
        wait_s = max(START_TIMEOUT_S, self.timeout_s or 0.0)
        try:
            warm = [self._pool.submit(_worker_pid) for _ in range(self.workers)]
            for f in warm:
                f.result(timeout=wait_s)
        except TimeoutError as e:
            self._abort()
            raise RuntimeError(f"planner worker processes did not start within {wait_s:.0f} s; the machine may "
                               "be overloaded: pass workers=0 to plan in the training process") from e
        except (BrokenProcessPool, RuntimeError) as e:
            self._abort()
            raise RuntimeError(
                f"planner worker processes failed to start ({type(e).__name__}: {e}). With "
                f"{self.mp_context}, each worker re-imports the training script: guard its entry point "
                "with `if __name__ == '__main__':`, make the planner picklable, or pass workers=0"
            ) from e

    def close(self) -> None:
        """Cancel plans not yet started and stop the workers (waits for a plan in progress)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def _abort(self) -> None:
        """Stop the pool without waiting: a worker is hung or dead."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        # Python 3.11 has no public way to kill a hung worker (3.14 adds terminate_workers);
        # without this, interpreter exit would join it forever.
        for proc in list(getattr(pool, "_processes", {}).values()):
            proc.kill()
        pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> PlanAhead:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- planning ----------------------------------------------------------------------------
    def _submit(self, batch: Sequence[Sample]) -> Future[Plan] | _Inline:
        if self.workers == 0:
            return _Inline(self.planner, batch)
        self.start()
        assert self._pool is not None
        try:
            return self._pool.submit(_plan_in_worker, batch)
        except BrokenProcessPool as e:
            # A worker died planning an earlier step that is still pending: this step reports the
            # broken pool in its turn, after that step's own error, which names the step.
            failed: Future[Plan] = Future()
            failed.set_exception(e)
            return failed

    def plans(self, jobs: Iterable[tuple[StepKey, Sequence[Sample]]]) -> Iterator[tuple[StepKey, Plan, float]]:
        """(key, plan, seconds waited) for each (key, batch) job, in order, `depth` jobs ahead.

        While the consumer holds the plan of step k, steps k+1..k+depth are being planned."""
        source = iter(jobs)
        pending: deque[tuple[StepKey, Future[Plan] | _Inline]] = deque()
        exhausted = False
        try:
            while True:
                while not exhausted and len(pending) <= self.depth:
                    job = next(source, None)
                    if job is None:
                        exhausted = True
                    else:
                        pending.append((job[0], self._submit(job[1])))
                if not pending:
                    return
                key, future = pending.popleft()
                started = time.perf_counter()
                plan = self._result(key, future)
                yield key, plan, time.perf_counter() - started
        finally:
            for _, future in pending:
                future.cancel()

    def _result(self, key: StepKey, future: Future[Plan] | _Inline) -> Plan:
        epoch, step = key
        where = f"epoch {epoch} step {step}"
        try:
            return future.result(timeout=self.timeout_s)
        except TimeoutError:
            self._abort()
            raise PlanningError(f"planning {where} took longer than {self.timeout_s} s; planner workers "
                                f"stopped", epoch=epoch, step=step) from None
        except Exception as e:
            if isinstance(e, BrokenProcessPool):
                self._abort()
            raise PlanningError(f"planning {where} failed: {type(e).__name__}: {e}", epoch=epoch,
                                step=step) from e

