"""Timing and memory probes shared by every microbenchmark of the profiler.

Timing: warm-up runs first (allocator growth, kernel autotuning, lazy init are not part of
steady-state training), then the minimum of repeats. Noise only ever adds time (a context
switch, a cache another process evicted, a page fault), so the fastest run is the one closest
to the work itself, and it moves least between runs and machines' loads; a median keeps half
the disturbances. On CUDA the clock is a pair of CUDA events around the work, so host-side
launch time that overlaps GPU work is not counted twice; on CPU it is the process's CPU time
when torch runs one thread (see `compute_clock`), with the wall time kept beside it.

Memory: on CUDA the allocator's own counters (what actually limits a micro-batch); on CPU,
which has no such counters, the bytes of the tensors autograd saves for backward, found with
saved-tensor hooks -- exactly what a non-checkpointed layer keeps alive between its forward
and its backward.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch


def synchronize(device: torch.device) -> None:
    """Wait for queued device work, so a host clock reading means 'done'."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def compute_clock() -> Callable[[], float]:
    """The host clock for timing CPU compute.

    With one torch thread, the process's CPU time (time.process_time): on an idle core it
    equals wall time, and unlike wall time it does not grow when other processes share the
    cores (the development machine runs several engineers' jobs on two cores; wall-clock
    medians there scatter by 30%). With several threads CPU time sums over threads, so wall
    time it is. Never for communication: waiting for a peer is not CPU time."""
    return time.process_time if torch.get_num_threads() == 1 else time.perf_counter


def clock_name(device: torch.device) -> str:
    """What `compute_clock` (or CUDA events) measure here, for a profile's record."""
    if device.type == "cuda":
        return "CUDA events"
    if torch.get_num_threads() == 1:
        return "process CPU time (time.process_time), 1 torch thread"
    return f"wall clock (time.perf_counter), {torch.get_num_threads()} torch threads"


class Stopwatch:
    """Times one region of device work: CUDA events on GPU, a host clock on CPU (and the wall
    clock beside it: `wall_seconds`)."""

    def __init__(self, device: torch.device, clock: Callable[[], float] = time.perf_counter) -> None:
        self.device = device
        self.clock = clock
        self._start: float | torch.cuda.Event = 0.0
        self._end: float | torch.cuda.Event = 0.0
        self._wall = (0.0, 0.0)

    def start(self) -> None:
        if self.device.type == "cuda":
            self._start = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._wall = (time.perf_counter(), 0.0)
            self._start = self.clock()

    def stop(self) -> None:
        if self.device.type == "cuda":
            assert isinstance(self._end, torch.cuda.Event)
            self._end.record()
        else:
            self._end = self.clock()
            self._wall = (self._wall[0], time.perf_counter())

    def seconds(self) -> float:
        """Elapsed seconds of the last start/stop pair (synchronizes on CUDA)."""
        if self.device.type == "cuda":
            assert isinstance(self._start, torch.cuda.Event) and isinstance(self._end, torch.cuda.Event)
            self._end.synchronize()
            return self._start.elapsed_time(self._end) / 1e3
        assert isinstance(self._start, float) and isinstance(self._end, float)
        return self._end - self._start

    def wall_seconds(self) -> float:
        """Wall-clock seconds of the last start/stop pair (on CUDA: the events' time)."""
        if self.device.type == "cuda":
            return self.seconds()
        return self._wall[1] - self._wall[0]


@dataclass(frozen=True)
class Timed:
    """The fastest of several runs of one piece of work: on the compute clock and on the wall."""

    seconds: float
    wall_s: float

    @staticmethod
    def best(runs: Iterable[tuple[float, float]]) -> Timed:
        """Each clock's minimum over (compute, wall) readings of the runs."""
        pairs = list(runs)
        return Timed(min(c for c, _ in pairs), min(w for _, w in pairs))


def min_time(fn: Callable[[], object], device: torch.device, *, warmup: int, repeats: int) -> Timed:
    """Fastest run of `fn()` (compute) over `repeats` runs after `warmup` untimed ones."""
    watch = Stopwatch(device, compute_clock())
    for _ in range(warmup):
        fn()
    synchronize(device)
    runs = []
    for _ in range(repeats):
        watch.start()
        fn()
        watch.stop()
        runs.append((watch.seconds(), watch.wall_seconds()))
    return Timed.best(runs)


@dataclass
class SavedBytes:
    """Running total of unique non-parameter storages autograd saved for backward."""

    total: int = 0


@contextmanager
def count_saved_bytes(params: Iterator[torch.nn.Parameter] | list[torch.nn.Parameter]) -> Iterator[SavedBytes]:
    """Sum the bytes of tensors saved for backward inside the block.

    Parameters are skipped (they are static memory, not activations), and each storage is
    counted once: several ops often save views of one tensor (e.g. q, k, v of a fused
    projection), and counting views separately would overstate memory.
    """
    param_ptrs = {p.untyped_storage().data_ptr() for p in params}
    seen: set[int] = set()
    out = SavedBytes()

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in param_ptrs and ptr not in seen:
            seen.add(ptr)
            out.total += storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield out


@dataclass(frozen=True)
class CudaMemory:
    """Allocator readings around a region: bytes held after it and the peak inside it."""

    held_bytes: int
    peak_bytes: int


@contextmanager
def cuda_memory(device: torch.device) -> Iterator[list[CudaMemory]]:
    """Allocated bytes retained by the block and its peak, both relative to its start."""
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    result: list[CudaMemory] = []
    yield result
    synchronize(device)
    result.append(CudaMemory(torch.cuda.memory_allocated(device) - before,
                             torch.cuda.max_memory_allocated(device) - before))


@contextmanager
def peak_allocated(device: torch.device) -> Iterator[list[int | None]]:
    """torch.cuda.max_memory_allocated over the block, absolute (what a plan must fit); [None] on
    a CPU, which has no allocator counters."""
    result: list[int | None] = []
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    yield result
    if device.type == "cuda":
        synchronize(device)
        result.append(torch.cuda.max_memory_allocated(device))
    else:
        result.append(None)


def held_state_bytes(model: torch.nn.Module) -> int:
    """Bytes of a bench model's parameters and their `.grad` (what it holds between steps)."""
    return sum(t.nelement() * t.element_size() for p in model.parameters() for t in (p, p.grad) if t is not None)
