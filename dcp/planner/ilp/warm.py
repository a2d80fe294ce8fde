"""The ILP's warm start: never worse than any strategy the planner could have run. dcp-greedy runs
first (the fallback: tens of milliseconds at tens of thousands of samples), then a quick heuristic
(under ZeRO-3, `knobs.ZERO3_FILL_FIRST_STAGE`, dcp-greedy-inter and the fill between them); every
other baseline runs unless a bound on its busy time rules it out (`bounds.baseline_busy`), whatever the
time. Then, while the warm share lasts: the fill, the heuristic's other targets, local search on its
groups and the incumbent's, and best fit (`bestfit`). A baseline is re-priced at each micro-batch's
fewest layers.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import dcp.planner.knobs as knobs
from dcp.costmodel import CostModel
from dcp.planner.baselines import (
    bucket_layout,
    packed_layout,
    packing_budget,
    smallest_fitting_sp,
    solve_bucket,
    solve_packed,
    static_sp_size,
)
from dcp.planner.bounds import baseline_busy
from dcp.planner.greedy import greedy_layout, solve_greedy
from dcp.planner.ilp.bestfit import best_fit
from dcp.planner.ilp.budget import Budget
from dcp.planner.ilp.columns import shapes_of
from dcp.planner.ilp.costs import CostTable
from dcp.planner.ilp.fill import fill_layouts, lockstep_layouts
from dcp.planner.ilp.heuristic import heuristic
from dcp.planner.ilp.incumbent import Incumbent
from dcp.planner.ilp.pack import estimate, improve
from dcp.planner.options import BucketOptions, GreedyOptions, PackedOptions, StrategyOptions
from dcp.planner.plan import Plan
from dcp.planner.pricing import BatchArrays, Pricer
from dcp.planner.sample import Sample


def baseline_options(batch: Sequence[Sample], cm: CostModel, sizes: Sequence[int]) -> list[StrategyOptions]:
    """The strategies the ILP must never lose to, dcp-greedy first, then dcp-greedy-inter,
    bucket- and packed-per-batch, and bucket and packing at each larger static size that fits
    (the static baselines run at one; under ZeRO-3 few large micro-batches there can beat all)."""
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
    """The baselines' plans (those that succeed; failures go to `notes`): the ILP's yardstick."""
    solvers = {GreedyOptions: solve_greedy, BucketOptions: solve_bucket, PackedOptions: solve_packed}
    plans = []
    for opts in baseline_options(batch, cm, sizes):
        try:
            plans.append(solvers[type(opts)](batch, cm, opts))
        except Exception as e:  # a baseline's failure must not stop the ILP planner
            if notes is not None:
                notes.append(f"baseline {describe(opts)} failed ({type(e).__name__}: {e}); not a warm start")
    return plans


def warm_start(inc: Incumbent, budget: Budget, batch: Sequence[Sample], cm: CostModel, sizes: Sequence[int],
               arrays: BatchArrays, pricer: Pricer, table: CostTable, floor_s: float, notes: list[str]) -> None:
    """Fill the incumbent (module docstring); `floor_s`: a proven busy bound, the heuristic's."""
    warm_until = budget.until(knobs.WARM_SHARE)
    n = cm.cluster.num_gpus
    options = baseline_options(batch, cm, sizes)

    lockstep = cm.training.zero_stage >= knobs.ZERO3_FILL_FIRST_STAGE

    def fill(until: float) -> None:
        if time.perf_counter() >= until:
            budget.skip("fill")
            return
        deadline = budget.deadline_for("fill", until)
        layouts = (lockstep_layouts(arrays, cm, sizes, pricer, deadline, inc.winning_busy_s) if lockstep
                   else fill_layouts(arrays, cm, sizes, pricer, deadline, inc.winning_busy_s))
        for layout in layouts:
            inc.offer_layout(layout, "fill", aligned=lockstep)

    # dcp-greedy first, whatever the load; under ZeRO-3 dcp-greedy-inter and the fill too, with
    # most of the time: its lined-up slots likely win, and rule out plans unpriced (`Incumbent`).
    head = 2 if lockstep else 1  # the baselines run before the heuristic
    for opts in options[:head]:  # under ZeRO-3 dcp-greedy lines its slots up itself
        _offer(opts, inc, notes, batch, cm, sizes, arrays, pricer, aligned=lockstep)
    if lockstep:
        fill(budget.started + knobs.ZERO3_FILL_SHARE * max(budget.deadline - budget.started, 0.0))
    first = None
    if time.perf_counter() < budget.search_deadline:
        first = heuristic(table, n, floor_s, targets=knobs.HEURISTIC_TARGETS[:1])
        inc.offer_groups(first, "heuristic")
    else:
        budget.skip("the heuristic")
    # Every other baseline runs unless a bound on its own step time proves it cannot win; the
    # time limit never skips one (the floor: a plan never worse than any baseline, at any load).
    for opts in options[head:]:  # the static size and token budget as `baselines` chooses them
        sp = static_sp_size(batch, cm, sizes, getattr(opts, "static_sp", None),
                            getattr(opts, "dataset_longest_tokens", None), longest_tokens=int(arrays.tokens.max()))
        tokens = packing_budget(getattr(opts, "token_budget", None), arrays, cm, sp)
        bound = baseline_busy(opts, cm, sizes, arrays, pricer, sp, tokens)
        if bound >= inc.winning_busy_s:
            notes.append(f"baseline {describe(opts)} not run: its busy time is at least {bound:.3f} s, "
                         f"no faster than the incumbent's {inc.busy_s:.3f} s"
                         + (f" and step {inc.fastest_step[0]:.3f} s" if inc.fastest_step is not None else ""))
        else:
            _offer(opts, inc, notes, batch, cm, sizes, arrays, pricer)
    if not lockstep:
        fill(warm_until)
    if time.perf_counter() < warm_until:  # the heuristic's other targets, while the share lasts
        other = heuristic(table, n, floor_s, budget.deadline_for("heuristic targets", warm_until),
                          knobs.HEURISTIC_TARGETS[1:])
        if first is None or estimate(other, table) < estimate(first, table):
            first = other
            inc.offer_groups(first, "heuristic")
    else:
        budget.skip("heuristic targets")
    for name, groups in [("heuristic", first), ("incumbent", inc.groups)]:
        if groups is None:
            continue
        if time.perf_counter() >= warm_until:
            budget.skip(f"local search on the {name}")
            continue
        groups = improve(groups, table, budget.deadline_for(f"local search on the {name}", warm_until),
                         knobs.IMPROVE_STEPS, n)
        inc.offer_groups(groups, f"{inc.source}+search" if name == "incumbent" else "heuristic+search")
    if not lockstep:
        _best_fit(inc, budget, table, n, floor_s)


def _best_fit(inc: Incumbent, budget: Budget, table: CostTable, n: int, floor_s: float) -> None:
    """The best-fit packings (`bestfit`) between the bound and the incumbent's busy time, each
    offered and the least level's locally searched, in `knobs.BEST_FIT_SHARE` of the time left.
    Skipped for batches of few shapes: the column program packs them exactly and needs the time."""
    if shapes_of(table) is not None or inc.busy_s <= floor_s * (1 + 1e-9):
        return  # (or the incumbent's busy time meets the floor already)
    if time.perf_counter() >= budget.search_deadline:
        budget.skip("best fit")
        return
    until = budget.until(knobs.BEST_FIT_SHARE)
    found = best_fit(table, n, floor_s, inc.busy_s, budget.deadline_for("best fit", until))
    for groups in found:
        inc.offer_groups(groups, "best fit")
    if not found:
        return
    if time.perf_counter() >= until:
        budget.skip("local search on the best fit")
        return
    groups = improve(found[-1], table, budget.deadline_for("local search on the best fit", until), knobs.IMPROVE_STEPS, n)
    inc.offer_groups(groups, "best fit+search")


def _offer(opts: StrategyOptions, inc: Incumbent, notes: list[str], batch: Sequence[Sample], cm: CostModel,
           sizes: Sequence[int], arrays: BatchArrays, pricer: Pricer, aligned: bool = False) -> None:
    """Run one baseline and offer its layout; its failure is a note, not the planner's."""
    try:
        layout = _layout(opts, batch, cm, sizes, arrays, pricer)
    except Exception as e:  # a baseline's failure must not stop the ILP planner
        notes.append(f"baseline {describe(opts)} failed ({type(e).__name__}: {e}); not a warm start")
        return
    inc.offer_layout(layout, describe(opts), aligned=aligned)


def _layout(opts: StrategyOptions, batch: Sequence[Sample], cm: CostModel, sizes: Sequence[int],
            arrays: BatchArrays, pricer: Pricer):  # noqa: ANN202 (a pricing.Layout)
    if isinstance(opts, GreedyOptions):
        return greedy_layout(batch, cm, opts, sizes, arrays, pricer)[0]
    if isinstance(opts, BucketOptions):
        return bucket_layout(batch, cm, opts, sizes, arrays)[0]
    return packed_layout(batch, cm, opts, sizes, arrays, pricer)[0]
