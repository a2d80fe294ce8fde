"""The floor that time cannot cut: `ilp`'s plan is never slower than any baseline's, at any load.

The ILP's warm start runs every baseline that no bound on its own step time rules out, and the
time limit never skips one (`dcp.planner.ilp.warm`). Here the solves run with a clock 16 times
fast (in a process of its own, `tests/fakeclock`): to the planner the machine looks 16 times
slower, the time limit cuts most of the search, and the plan must still be no slower than each
baseline's, planned in this process (deterministic, no clock).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dcp.planner import Plan
from dcp.planner.feasibility import allowed_sp_sizes
from dcp.planner.ilp.warm import baseline_plans
from tests.conftest import ZERO3_LENGTHS, cost_model, make_batch

ROOT = Path(__file__).resolve().parents[1]
FAKECLOCK_DIR = ROOT / "tests" / "fakeclock"

CASES = {
    "zero3": (dict(gpus=32, zero_stage=3), ZERO3_LENGTHS),
    "long tail": (dict(gpus=16), [300 * (1 + (7 * i) % 23) for i in range(60)] + [60_000, 30_000]),
    "short": (dict(gpus=8), [16 + (997 * i) % 12_000 for i in range(40)]),
    "tiny": (dict(gpus=2, gpus_per_node=2), [16, 16, 17]),
}
"""Batches whose plans the time limit cuts at 16x: ZeRO-3's fill takes most of the time before
the other baselines, a long tail, short samples, and three tiny ones where only packing's one
micro-batch is fastest (before the floor, the limit skipped packed there: 0.112 s against its
0.082 s)."""

CHILD = """
import json, sys
sys.path.insert(0, {fakeclock!r})
import fakeclock
fakeclock.install(16)
sys.path.insert(0, {root!r})
from dcp.planner import IlpOptions, solve
from tests.conftest import cost_model, make_batch
from tests.test_ilp_floor import CASES
for name, (shape, lengths) in CASES.items():
    cm = cost_model(**shape)
    plan = solve(make_batch(lengths), cm.cluster, cm, IlpOptions(time_limit_s=0.5))
    print(json.dumps(plan.to_dict()))
"""


@pytest.fixture(scope="module")
def fast_clock_plans() -> dict[str, Plan]:
    env = {k: v for k, v in os.environ.items() if k != "DCP_TEST_CLOCK"}  # the child sets its own speed
    code = CHILD.format(fakeclock=str(FAKECLOCK_DIR), root=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return {name: Plan.from_dict(json.loads(line)) for name, line in zip(CASES, out.stdout.splitlines(), strict=True)}


@pytest.mark.parametrize("name", list(CASES))
def test_ilp_is_no_slower_than_any_baseline_under_a_16x_clock(name: str, fast_clock_plans: dict[str, Plan]) -> None:
    shape, lengths = CASES[name]
    cm = cost_model(**shape)
    plan = fast_clock_plans[name]
    plan.validate()
    assert plan.strategy == "ilp"
    others = baseline_plans(make_batch(lengths), cm, allowed_sp_sizes(cm))
    assert len(others) >= 4  # dcp-greedy, dcp-greedy-inter, bucket and packed per batch at least
    for other in others:
        assert plan.step_time_s <= other.step_time_s * (1 + 1e-9), (other.strategy, other.notes, plan.notes)
