"""A wall clock that runs `speed` times fast, for the test option `--clock-speed N`.

Everything the planner and executor time with (`time.perf_counter`, `time.monotonic` and their
`_ns` variants) reads `anchor + speed * (real - anchor)`: to code that times itself, the machine
looks `speed` times slower (or loaded), while its CPU time (`time.process_time`) is unchanged,
as on a shared core. A test whose verdict holds only when the machine is fast fails under it.

`install` replaces the functions in the `time` module and sweeps modules already imported for
references to the real ones: module-level `from time import perf_counter` bindings, default
arguments (`clock=time.perf_counter`) and closure cells (a dataclass's
`field(default_factory=time.perf_counter)` lives in its `__init__`'s closure). Modules imported
later read the fake from `time` itself. The anchor is a real reading shared through the
environment (`ENV`), so every process of a session (spawned planner workers, `dcp` subprocesses,
which load `sitecustomize.py` from this folder) reads the same fake time. The standard library's
own bindings (`threading`, `queue`, `subprocess` timeouts) are left real: they guard against
hangs, they do not decide a result.
"""

from __future__ import annotations

import os
import sys
import time
import types
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

ENV = "DCP_TEST_CLOCK"
"""`speed:perf_anchor:monotonic_anchor` (real readings), set by the first `install`."""

NAMES = ("perf_counter", "monotonic")

REAL: dict[str, Callable[[], float]] = {name: getattr(time, name) for name in NAMES}
REAL.update({f"{name}_ns": getattr(time, f"{name}_ns") for name in NAMES})
"""The real clocks, as imported before any patching (`time`'s attributes may be fakes later)."""

_installed: dict[str, Callable[[], float]] = {}


def fake(real: Callable[[], float], speed: float, anchor: float) -> Callable[[], float]:
    """A clock reading `anchor + speed * (real() - anchor)` (seconds)."""

    def clock() -> float:
        return anchor + speed * (real() - anchor)

    clock.__name__ = clock.__qualname__ = getattr(real, "__name__", "clock")
    clock.fake_speed = speed  # type: ignore[attr-defined]
    return clock


def fake_ns(real_ns: Callable[[], int], speed: float, anchor: float) -> Callable[[], int]:
    """The nanosecond variant of `fake` (same anchor, in seconds)."""
    anchor_ns = int(anchor * 1e9)

    def clock_ns() -> int:
        return anchor_ns + int(speed * (real_ns() - anchor_ns))

    clock_ns.__name__ = clock_ns.__qualname__ = getattr(real_ns, "__name__", "clock_ns")
    clock_ns.fake_speed = speed  # type: ignore[attr-defined]
    return clock_ns


def clocks(speed: float, anchors: dict[str, float],
           base: dict[str, Callable[[], float]] | None = None) -> dict[str, Callable[[], float]]:
    """The four fake clocks, each `speed` times as fast as its `base` (default: the real one)
    from its anchor (a reading of the base)."""
    base = REAL if base is None else base
    out: dict[str, Callable[[], float]] = {}
    for name in NAMES:
        out[name] = fake(base[name], speed, anchors[name])
        out[f"{name}_ns"] = fake_ns(base[f"{name}_ns"], speed, anchors[name])
    for name, clock in out.items():  # how fast against the real clock
        clock.fake_speed = speed * getattr(base[name], "fake_speed", 1.0)  # type: ignore[attr-defined]
    return out


def replace_references(objects: Iterable[object], swap: dict[int, Callable]) -> int:
    """Replace every reference to a function in `swap` (keyed by `id` of the real one) held by
    `objects` (modules): attributes, default arguments and closure cells of their functions,
    and of the methods of their classes. Returns how many references were replaced."""
    done = 0
    seen: set[int] = set()

    def patch_function(fn: object) -> None:
        nonlocal done
        fn = getattr(fn, "__func__", fn)  # classmethod, staticmethod, bound method
        if not isinstance(fn, types.FunctionType) or id(fn) in seen:
            return
        seen.add(id(fn))
        if fn.__defaults__ and any(id(d) in swap for d in fn.__defaults__):
            fn.__defaults__ = tuple(swap.get(id(d), d) for d in fn.__defaults__)
            done += 1
        if fn.__kwdefaults__:
            for key, value in fn.__kwdefaults__.items():
                if id(value) in swap:
                    fn.__kwdefaults__[key] = swap[id(value)]
                    done += 1
        for cell in fn.__closure__ or ():
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if id(value) in swap:
                cell.cell_contents = swap[id(value)]
                done += 1
            elif isinstance(value, types.FunctionType):
                patch_function(value)

    def patch_class(cls: type) -> None:
        if id(cls) in seen:
            return
        seen.add(id(cls))
        for value in list(vars(cls).values()):
            if isinstance(value, property):
                for f in (value.fget, value.fset, value.fdel):
                    patch_function(f)
            elif isinstance(value, type):
                patch_class(value)
            else:
                patch_function(value)

    for module in objects:
        for key, value in list(vars(module).items()):
            if id(value) in swap:
                setattr(module, key, swap[id(value)])
                done += 1
            elif isinstance(value, type) and value.__module__ == module.__name__:
                patch_class(value)
            elif isinstance(value, types.FunctionType) and value.__module__ == module.__name__:
                patch_function(value)
    return done


PREFIXES = ("dcp", "tests", "benchmarks", "examples")
"""Top-level packages whose modules are swept for clock references (and test modules, `test_*`)."""


def install(speed: float) -> int:
    """Make the clocks run `speed` times fast in this process (and in the processes it starts:
    `ENV`). Modules of `PREFIXES` that are already imported are swept (`replace_references`);
    returns how many references that replaced."""
    if speed <= 0:
        raise ValueError(f"clock speed must be positive, got {speed}")
    spec = os.environ.get(ENV)
    if spec:  # a parent process chose the anchors: read the same fake time
        _, perf_anchor, mono_anchor = (float(x) for x in spec.split(":"))
    else:
        perf_anchor, mono_anchor = REAL["perf_counter"](), REAL["monotonic"]()
        os.environ[ENV] = f"{speed}:{perf_anchor!r}:{mono_anchor!r}"
    _installed.update(clocks(speed, {"perf_counter": perf_anchor, "monotonic": mono_anchor}))
    swap = {id(REAL[name]): _installed[name] for name in REAL}
    for name, clock in _installed.items():
        setattr(time, name, clock)
    return replace_references(_sweepable(), swap)


def _sweepable() -> list[types.ModuleType]:
    return [m for name, m in list(sys.modules.items())
            if m is not None and (name.split(".")[0] in PREFIXES or name.startswith("test_"))]


@contextmanager
def running(speed: float) -> Iterator[None]:
    """The clocks run `speed` times as fast as the real ones inside (0.01: a hundred times slow,
    so a solve's time limit of 1 s gives it 100 s of this machine), in this process only; on
    leaving, the clocks in place before come back (a session's `--clock-speed` one included).
    For a test of what a planner finds when time is not what stops it."""
    if speed <= 0:
        raise ValueError(f"clock speed must be positive, got {speed}")
    before = {name: getattr(time, name) for name in REAL}
    now = {"perf_counter": before["perf_counter"](), "monotonic": before["monotonic"]()}
    inner = clocks(speed, now, {name: before[name] for name in REAL})
    modules = _sweepable()
    for name, clock in inner.items():
        setattr(time, name, clock)
    replace_references(modules, {id(before[name]): inner[name] for name in REAL})
    try:
        yield
    finally:
        for name, clock in before.items():
            setattr(time, name, clock)
        replace_references(_sweepable(), {id(inner[name]): before[name] for name in REAL})


class Stepping:
    """A clock that moves only when read: each reading is `tick` seconds after the one before
    (`reads` counts them). Time then follows the work's clock reads, not the machine: a solve
    under it takes the same steps, and stops at the same point, on any machine at any load."""

    def __init__(self, tick: float, start: float = 1000.0) -> None:
        self.tick, self.start, self.now, self.reads = tick, start, start, 0

    @property
    def elapsed(self) -> float:
        """Seconds on this clock since it began (`reads` ticks)."""
        return self.now - self.start

    def __call__(self) -> float:
        self.reads += 1
        self.now += self.tick
        return self.now

    def ns(self) -> int:
        return int(self() * 1e9)


@contextmanager
def stepping(tick: float) -> Iterator[Stepping]:
    """`time.perf_counter` and `time.monotonic` (and the `_ns` variants) read one `Stepping`
    clock inside (in this process, wherever the planner reads them), the clocks before after."""
    if tick <= 0:
        raise ValueError(f"clock tick must be positive, got {tick}")
    clock = Stepping(tick)
    before = {name: getattr(time, name) for name in REAL}
    # One function per clock name, though all read `clock`: leaving swaps each reference back by
    # the id of what replaced it, and a shared object would bring every one back as the last name.
    inner = {name: _named(clock.ns if name.endswith("_ns") else clock, name) for name in REAL}
    modules = _sweepable()
    for name, fn in inner.items():
        setattr(time, name, fn)
    replace_references(modules, {id(before[name]): inner[name] for name in REAL})
    try:
        yield clock
    finally:
        for name, fn in before.items():
            setattr(time, name, fn)
        replace_references(_sweepable(), {id(inner[name]): before[name] for name in REAL})


def _named(read: Callable[[], float], name: str) -> Callable[[], float]:
    """A function of its own that calls `read`, named `name`."""

    def clock() -> float:
        return read()

    clock.__name__ = clock.__qualname__ = name
    return clock


def install_from_env() -> None:
    """`install` at the speed `ENV` names, if it is set (`sitecustomize.py`)."""
    spec = os.environ.get(ENV)
    if spec:
        install(float(spec.split(":")[0]))


def speed() -> float:
    """How fast the installed clock runs (1.0 when none is)."""
    return float(getattr(time.perf_counter, "fake_speed", 1.0))
