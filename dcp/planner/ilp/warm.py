"""The ILP's warm start: never worse than any strategy the planner could have run.

dcp-greedy runs first (the fallback, tens of milliseconds at tens of thousands of samples)
unless it would take more than half the budget, then a quick heuristic on the cost table. Every
other baseline (dcp-greedy-inter, bucket-per-batch, packed-per-batch, and bucket and packing at
each larger static SP size: the static `bucket` and `packed` run at one of them, and packing
there wins under ZeRO-3's heavy per-micro-batch costs) either runs and is offered, or is
proven unable to beat the incumbent by a lower bound on its own step time (`baseline_bound`), or,
when the budget's warm-start share is spent, is skipped and the plan's notes say so. Then the
few large micro-batches of `fill` where fixed costs are heavy; the heuristic's groups and the
incumbent's are improved by local search (`pack.improve`). A baseline is
re-priced with the fewest checkpointed layers of each micro-batch, never slower than itself.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from dcp.costmodel import CostModel
from dcp.planner.baselines import (
    bucket_layout,
    packed_layout,
    smallest_fitting_sp,
    solve_bucket,
    solve_packed,
)
from dcp.planner.greedy import greedy_layout, solve_greedy
from dcp.planner.ilp.budget import Budget
from dcp.planner.ilp.costs import CostTable
from dcp.planner.ilp.fill import fill_layouts
from dcp.planner.ilp.heuristic import HEURISTIC_TARGETS, heuristic
from dcp.planner.ilp.incumbent import Incumbent
from dcp.planner.ilp.pack import IMPROVE_STEPS, estimate, improve
from dcp.planner.options import BucketOptions, GreedyOptions, PackedOptions, StrategyOptions
from dcp.planner.plan import Plan
from dcp.planner.pricing import BatchArrays, Pricer
from dcp.planner.sample import Sample

WARM_SHARE = 0.3
"""Optional warm-start work (baselines past dcp-greedy, fill, local search) stops once this
share of the budget is gone; the program gets the rest."""
GREEDY_PASSES = 40
"""dcp-greedy costs up to this many plain passes over the samples (measured: 5 to 100)..."""
GREEDY_SHARE = 0.5
"""...and runs when that fits this share of the budget (it is the fallback: under load too)."""


def baseline_options(batch: Sequence[Sample], cm: CostModel, sizes: Sequence[int]) -> list[StrategyOptions]:
    """The strategies the ILP must never lose to, dcp-greedy first: dcp-greedy, dcp-greedy-inter,
    bucket-per-batch, packed-per-batch, and bucket and packing at every larger static SP size
    that fits the batch: the static baselines `bucket` and `packed` run at one of those (the size
    the dataset's longest sample needs), and with ZeRO-3's per-micro-batch parameter gathers few
    large micro-batches at a larger size can beat all."""
    sp = tuple(sizes)
    smallest = smallest_fitting_sp(max(s.tokens for s in batch), cm, sizes)
    larger = [p for p in sizes if p > smallest]
    return ([GreedyOptions(sp_sizes=sp), GreedyOptions(sp_sizes=sp, pyramid=False), BucketOptions(sp_sizes=sp),
             PackedOptions(sp_sizes=sp)] + [PackedOptions(sp_sizes=sp, static_sp=p) for p in larger]
            + [BucketOptions(sp_sizes=sp, static_sp=p) for p in larger])


def describe(options: StrategyOptions) -> str:
    """A baseline's strategy name as the plan's notes show it (with its static SP size)."""
    if isinstance(options, GreedyOptions):
        return "dcp-greedy" if options.pyramid else "dcp-greedy-inter"
    static = getattr(options, "static_sp", None)
    return f"{options.name} (static SP {static})" if static else f"{options.name}-per-batch"


def baseline_plans(batch: Sequence[Sample], cm: CostModel, sizes: Sequence[int],
                   notes: list[str] | None = None) -> list[Plan]:
    """The baseline strategies' plans for this batch (those that succeed); why one failed goes to
    `notes`. What the ILP's result is checked against."""
    solvers = {GreedyOptions: solve_greedy, BucketOptions: solve_bucket, PackedOptions: solve_packed}
    plans = []
    for opts in baseline_options(batch, cm, sizes):
        try:
            plans.append(solvers[type(opts)](batch, cm, opts))
        except Exception as e:  # a baseline's failure must not stop the ILP planner
            if notes is not None:
                notes.append(f"baseline {describe(opts)} failed ({type(e).__name__}: {e}); not a warm start")
    return plans


def baseline_bound(options: StrategyOptions, batch: Sequence[Sample], cm: CostModel, sizes: Sequence[int],
                   arrays: BatchArrays, pricer: Pricer) -> float:
    """A lower bound on the busy time of the baseline's plan, whatever it packs: each of its
    micro-batches costs at least fixed + per_token T + per_pair A at the fewest layers its
    samples allow (all K for bucket and dcp-greedy-inter), so its groups carry at least the
    sum of their samples' marginal costs; a static strategy spreads them over N / p groups, a
    mixed one over N GPUs (GPU-seconds); and no group is shorter than its longest sample."""
    k, n = cm.model.num_layers, cm.cluster.num_gpus
    if isinstance(options, GreedyOptions):
        if options.pyramid:
            return 0.0  # dcp-greedy itself: always run, never bounded away
        work, longest = np.full(len(arrays.tokens), np.inf), np.full(len(arrays.tokens), np.inf)
        for p in sizes:
            solo = pricer.times(p, arrays.tokens, arrays.pairs, k)
            lin = cm.linear_time(p, k)
            marginal = p * (lin.per_token * arrays.tokens + lin.per_pair * arrays.pairs)
            work = np.minimum(work, np.where(np.isfinite(solo), marginal, np.inf))
            longest = np.minimum(longest, solo)
        return max(float(work.sum()) / n, float(longest.max()))
    from dcp.planner.baselines import static_sp_size

    p = static_sp_size(batch, cm, sizes, getattr(options, "static_sp", None),
                       getattr(options, "dataset_longest_tokens", None))
    ckpt = k if isinstance(options, BucketOptions) else None
    solo = pricer.times(p, arrays.tokens, arrays.pairs, ckpt)
    lin = cm.linear_time(p, k if ckpt is not None else 0)
    marginal = lin.per_token * arrays.tokens + lin.per_pair * arrays.pairs
    return max(float(marginal.sum()) / (n // p), float(solo.max()))


def warm_start(inc: Incumbent, budget: Budget, batch: Sequence[Sample], cm: CostModel, sizes: Sequence[int],
               arrays: BatchArrays, pricer: Pricer, table: CostTable, floor_s: float, notes: list[str]) -> None:
    """Fill the incumbent (see the module docstring); `floor_s` is a proven bound on the busy
    time (the heuristic's target)."""
    warm_until = budget.until(WARM_SHARE)
    # dcp-greedy first, unless the limit is too short for it (its cost guessed from a plain pass
    # over the samples); then the heuristic; later baselines cost about what the one before did
    # and run while the warm share lasts.
    last_s = GREEDY_PASSES * budget.sample_pass_s + 0.005
    greedy_fits = last_s <= GREEDY_SHARE * (budget.search_deadline - time.perf_counter())
    first = None
    for opts in baseline_options(batch, cm, sizes):
        name = describe(opts)
        greedy = isinstance(opts, GreedyOptions) and opts.pyramid
        if not greedy and first is None:
            first = heuristic(table, cm.cluster.num_gpus, floor_s, targets=HEURISTIC_TARGETS[:1])
            inc.offer_groups(first, "heuristic")
        bound = baseline_bound(opts, batch, cm, sizes, arrays, pricer)
        if bound >= inc.busy_s:
            notes.append(f"baseline {name} not run: its busy time is at least {bound:.3f} s, "
                         f"the incumbent's is {inc.busy_s:.3f} s")
            continue
        if not greedy_fits if greedy else time.perf_counter() + last_s > warm_until:
            budget.skip(f"baseline {name}")
            continue
        t0 = time.perf_counter()
        try:
            layout = _layout(opts, batch, cm, sizes, arrays, pricer)
        except Exception as e:  # a baseline's failure must not stop the ILP planner
            notes.append(f"baseline {name} failed ({type(e).__name__}: {e}); not a warm start")
            continue
        finally:
            last_s = time.perf_counter() - t0
        inc.offer_layout(layout, name)
    if first is None:
        first = heuristic(table, cm.cluster.num_gpus, floor_s, targets=HEURISTIC_TARGETS[:1])
        inc.offer_groups(first, "heuristic")
    if time.perf_counter() < warm_until:
        for layout in fill_layouts(arrays, cm, sizes, pricer, warm_until):
            inc.offer_layout(layout, "fill")
    else:
        budget.skip("fill")
    if time.perf_counter() < warm_until:  # the heuristic's other targets, while the share lasts
        other = heuristic(table, cm.cluster.num_gpus, floor_s, warm_until, HEURISTIC_TARGETS[1:])
        if estimate(other, table) < estimate(first, table):
            first = other
            inc.offer_groups(first, "heuristic")
    for name, groups in [("heuristic", first), ("incumbent", inc.groups)]:
        if groups is not None and time.perf_counter() < warm_until:
            groups = improve(groups, table, warm_until, IMPROVE_STEPS)
            inc.offer_groups(groups, f"{inc.source}+search" if name == "incumbent" else "heuristic+search")


def _layout(opts: StrategyOptions, batch: Sequence[Sample], cm: CostModel, sizes: Sequence[int],
            arrays: BatchArrays, pricer: Pricer):  # noqa: ANN202 (a pricing.Layout)
    if isinstance(opts, GreedyOptions):
        return greedy_layout(batch, cm, opts, sizes, arrays, pricer)[0]
    if isinstance(opts, BucketOptions):
        return bucket_layout(batch, cm, opts, sizes, arrays)[0]
    return packed_layout(batch, cm, opts, sizes, arrays, pricer)[0]
