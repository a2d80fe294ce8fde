"""The fast clock of `--clock-speed` (tests/fakeclock): its arithmetic, its sweep of bound
references, and its reach into processes a test starts."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
import types

import fakeclock
import pytest
from conftest import FAKECLOCK_DIR


def test_fake_clock_runs_speed_times_fast_from_its_anchor() -> None:
    readings = iter([10.0, 10.0, 11.0, 12.5])
    clock = fakeclock.fake(lambda: next(readings), speed=8, anchor=10.0)
    assert [clock() for _ in range(4)] == [10.0, 10.0, 18.0, 30.0]
    ns = iter([5_000_000_000, 6_000_000_000])
    clock_ns = fakeclock.fake_ns(lambda: next(ns), speed=3, anchor=4.0)
    assert [clock_ns(), clock_ns()] == [7_000_000_000, 10_000_000_000]  # 4 s + 3 x (1 s, 2 s)


def _real() -> float:
    return 1.0


def _fast() -> float:
    return 2.0


def test_sweep_replaces_bindings_defaults_and_dataclass_factories(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("probe")
    monkeypatch.setitem(sys.modules, "probe", module)
    module.real = _real
    exec(  # noqa: S102 - a module of every way code holds on to a clock
        "import dataclasses\n"
        "clock = real\n"
        "def timed(c=real, *, k=real):\n    return c() + k()\n"
        "@dataclasses.dataclass\n"
        "class Budget:\n"
        "    started: float = dataclasses.field(default_factory=real)\n"
        "    def later(self):\n        return self.started\n"
        "class Holder:\n"
        "    @staticmethod\n    def at(c=real):\n        return c()\n",
        vars(module))
    assert module.Budget().started == 1.0 and module.timed() == 2.0
    replaced = fakeclock.replace_references([module], {id(_real): _fast})
    assert module.clock is _fast and module.real is _fast
    assert module.timed() == 4.0
    assert module.Budget().started == 2.0
    assert module.Holder.at() == 2.0
    assert replaced == 6  # two bindings, two defaults, the dataclass factory, the static method's default


def test_a_started_python_process_reads_the_same_fast_clock() -> None:
    anchor = fakeclock.REAL["perf_counter"]()
    env = {**os.environ, fakeclock.ENV: f"4:{anchor!r}:{fakeclock.REAL['monotonic']()!r}",
           "PYTHONPATH": FAKECLOCK_DIR}
    child = ("import time, fakeclock\n"
             "r0 = fakeclock.REAL['perf_counter'](); f = time.perf_counter(); r1 = fakeclock.REAL['perf_counter']()\n"
             "print(time.perf_counter.fake_speed, r0, f, r1)")
    out = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    speed, r0, f, r1 = (float(x) for x in out.stdout.split())
    assert speed == 4
    assert anchor + 4 * (r0 - anchor) <= f <= anchor + 4 * (r1 - anchor)


@pytest.mark.skipif(fakeclock.speed() == 1, reason="only under --clock-speed")
def test_the_session_clock_reaches_the_planner() -> None:
    from dcp.planner.ilp import budget

    speed = fakeclock.speed()
    assert budget.time.perf_counter is time.perf_counter and time.perf_counter.fake_speed == speed
    reals = {id(f) for f in fakeclock.REAL.values()}
    held = [c.cell_contents for c in budget.Budget.__init__.__closure__ or ()]
    assert not any(id(v) in reals for v in held)
    assert any(getattr(v, "fake_speed", None) == speed for v in held)  # wall_started's factory
    r0 = fakeclock.REAL["perf_counter"]()
    b = budget.Budget(0.0, 1.0, 0.0)
    r1 = fakeclock.REAL["perf_counter"]()
    anchor = float(os.environ[fakeclock.ENV].split(":")[1])
    assert anchor + speed * (r0 - anchor) <= b.wall_started <= anchor + speed * (r1 - anchor)
    assert dataclasses.is_dataclass(b)


def test_a_slow_clock_inside_a_block_reaches_the_planner_and_goes_away_after() -> None:
    from dcp.planner.ilp import budget

    def factory() -> object:
        return next(c.cell_contents for c in budget.Budget.__init__.__closure__
                    if getattr(c.cell_contents, "__name__", "") == "perf_counter")

    before, held, session = time.perf_counter, factory(), fakeclock.speed()
    with fakeclock.running(0.01):
        inner = time.perf_counter
        assert inner is not before and factory() is inner
        assert inner.fake_speed == pytest.approx(0.01 * session)
        b0, f0, c0 = before(), inner(), before()
        time.sleep(0.02)
        b1, f1, c1 = before(), inner(), before()
        assert 0.01 * (b1 - c0) <= f1 - f0 <= 0.01 * (c1 - b0)
    assert time.perf_counter is before and factory() is held


def test_a_stepping_clock_gives_each_reference_back_its_own_clock() -> None:
    """Inside `stepping` perf_counter and monotonic read one clock; after it each reference held
    by the planner is the clock it held before (the dataclass factory of `Budget` included), not
    the last name's: a perf_counter reference left on monotonic reads another time base."""
    from dcp.planner.ilp import budget

    def held() -> list[object]:
        return [c.cell_contents for c in budget.Budget.__init__.__closure__ or ()]

    before = {name: getattr(time, name) for name in fakeclock.REAL}
    cells = held()
    with fakeclock.stepping(1e-3) as clock:
        assert time.perf_counter() == pytest.approx(clock.now) and time.monotonic() == pytest.approx(clock.now)
        assert any(getattr(c, "__name__", "") == "perf_counter" and c() == pytest.approx(clock.now)
                   for c in held())
    assert {name: getattr(time, name) for name in fakeclock.REAL} == before
    assert held() == cells and before["perf_counter"] in cells
