"""What-if sweeps: the same planning pipeline over many clusters, models and workloads.

    base = Scenario(model="llama-7b", gpus=32, workload="wikipedia")
    frame = sweep(grid(base, gpus=[8, 16, 32, 64]), steps=2, time_limit_s=0.2)

One row per (scenario, strategy) with predicted step time, throughput, idle and communication
shares, planner solve time, memory headroom, and each strategy's speedup over the baselines of
the same scenario. A scenario no strategy can plan (a model too large for the cluster, say)
gives rows whose `status` says why instead of stopping the sweep. Never imports torch.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from dcp.costmodel import DEFAULT_HARDWARE, DEFAULT_MODEL, CostModel, CostModelError
from dcp.data.batches import make_batches
from dcp.data.workloads import Workload, load_workload
from dcp.planner.plan import InfeasibleError, Plan
from dcp.planner.report import checkpoint_share, memory_headroom
from dcp.planner.run import build_cost_model, plan_steps, strategy_metrics
from dcp.planner.sample import Sample

SWEEP_STRATEGIES = ("ilp", "dcp-greedy", "bucket", "packed")
BASELINES = ("bucket", "packed")
"""The static baselines speedups are reported against: one SP size for the whole training, the
smallest that fits the workload's longest sample (the DCP paper's; see `dcp.planner.STRATEGIES`)."""


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """One what-if point: a model trained on a workload on a cluster."""

    model: str = DEFAULT_MODEL
    """Model preset name or JSON path (see `dcp presets`)."""
    hardware: str = DEFAULT_HARDWARE
    """Hardware preset name or a profile JSON from `dcp profile`."""
    gpus: int = 32
    workload: str = "wikipedia"
    """A workload spec as `dcp plan --workload` takes it."""
    zero_stage: int = 1
    """ZeRO stage; a 70B model needs 3 (its weights alone overflow one GPU otherwise)."""
    gpus_per_node: int | None = None
    """None: the hardware profile's."""
    memory_gb: float | None = None
    """Usable memory per GPU (1e9 bytes); None: the hardware profile's."""
    global_batch: int | None = None
    """Samples per global batch; None with no `tokens_per_gpu`: 512, as `dcp plan`."""
    tokens_per_gpu: int | None = None
    """Global batches of about `tokens_per_gpu * gpus` tokens: the batch grows with the cluster
    (weak scaling), which is how a cluster is usually sized."""

    def __post_init__(self) -> None:
        if self.global_batch is not None and self.tokens_per_gpu is not None:
            raise ValueError("give global_batch or tokens_per_gpu, not both")
        if self.gpus < 1:
            raise ValueError(f"gpus must be positive, got {self.gpus}")

    def cost_model(self) -> CostModel:
        return build_cost_model(self.model, self.hardware, self.gpus, self.gpus_per_node, self.memory_gb,
                                self.zero_stage)

    def batches(self, cm: CostModel, steps: int, seed: int = 0,
                workload: Workload | None = None) -> list[list[Sample]]:
        """`steps` global batches of the workload (`workload`: the scenario's, already loaded)."""
        tokens = None if self.tokens_per_gpu is None else self.tokens_per_gpu * self.gpus
        return make_batches(workload or self.workload, cm, global_batch=self.global_batch, global_tokens=tokens,
                            steps=steps, seed=seed)


def grid(base: Scenario, **axes: Sequence[Any]) -> list[Scenario]:
    """Every combination of the given field values, the other fields from `base`.

    grid(base, gpus=[8, 16], model=["llama-7b", "llama-13b"]) gives four scenarios."""
    names = list(axes)
    return [dataclasses.replace(base, **dict(zip(names, values, strict=True)))
            for values in itertools.product(*(axes[n] for n in names))]


def _metrics(plans: Sequence[Plan], cm: CostModel) -> dict[str, float]:
    return {
        **strategy_metrics(plans, cm),
        # The worst step is the one that runs out of memory: report its headroom.
        "memory_headroom": min(memory_headroom(p) for p in plans),
        "checkpoint_share": sum(checkpoint_share(p) for p in plans) / len(plans),
    }


def _batch_facts(batches: Sequence[Sequence[Sample]]) -> dict[str, float]:
    tokens = [s.tokens for b in batches for s in b]
    return {"max_sample_tokens": max(tokens), "mean_sample_tokens": sum(tokens) / len(tokens),
            "batch_tokens": sum(tokens) / len(batches), "batch_samples": len(tokens) / len(batches)}


def run_scenario(scenario: Scenario, strategies: Sequence[str] = SWEEP_STRATEGIES, *, steps: int = 2,
                 time_limit_s: float | None = None, seed: int = 0) -> list[dict[str, Any]]:
    """Rows for one scenario, one per strategy; a strategy that cannot plan it gets its reason
    in `status` (the planner's infeasibility, or a profile asked beyond its fitted range)."""
    cm = scenario.cost_model()
    workload = load_workload(scenario.workload, seed=seed)
    batches = scenario.batches(cm, steps, seed, workload)
    base = {**dataclasses.asdict(scenario), **_batch_facts(batches)}
    longest = int(workload.tokens.max())  # the static baselines' SP size fits the dataset's longest
    rows = []
    for name in strategies:
        try:
            plans = plan_steps(batches, cm, name, time_limit_s, dataset_longest_tokens=longest)
            metrics: dict[str, Any] = {"status": "ok", **_metrics(plans, cm)}
        except (InfeasibleError, CostModelError) as e:
            metrics = {"status": f"cannot plan: {e}"}
        rows.append({**base, "strategy": name, **metrics})
    return rows


def sweep(scenarios: Iterable[Scenario], strategies: Sequence[str] = SWEEP_STRATEGIES, *, steps: int = 2,
          time_limit_s: float | None = None, seed: int = 0,
          progress: Callable[[int, Scenario], None] | None = None) -> Any:
    """Plan and simulate every scenario with every strategy (pandas DataFrame, one row each).

    Columns: the scenario's fields, `scenario` (its index), batch facts (`max_sample_tokens`,
    `batch_tokens`, ...), `strategy`, `status`, the metrics of `dcp compare`, `memory_headroom`
    (free fraction at the fullest micro-batch of the worst step), `checkpoint_share`, and
    `speedup_vs_<baseline>` for each baseline strategy that ran in the same scenario.
    `progress(i, scenario)` is called before each scenario."""
    import pandas as pd

    rows = []
    for i, scenario in enumerate(scenarios):
        if progress is not None:
            progress(i, scenario)
        rows += [{"scenario": i, **row} for row in run_scenario(scenario, strategies, steps=steps,
                                                                time_limit_s=time_limit_s, seed=seed)]
    frame = pd.DataFrame(rows)
    if "mean_step_time_s" not in frame:
        frame["mean_step_time_s"] = float("nan")
    for baseline in BASELINES:
        ref = frame[frame["strategy"] == baseline].set_index("scenario")["mean_step_time_s"]
        frame[f"speedup_vs_{baseline}"] = frame["scenario"].map(ref) / frame["mean_step_time_s"]
    return frame
