"""Multi-phase plans: the single layout or the batch split into phases, whichever is faster, against
a bound any runnable plan respects (docs/design.md). `solve_phased`'s stages, in one deadline:

0. the backfill plan (2+ samples per GPU) or else the nested plan, before the ILP, which then skips
   assembling its own plan when that cannot win (`solve_ilp_against`);
1. the single-layout ILP (`ilp.solve_ilp`) in its window (`timebudget`); for few-shape batches of
   under `knobs.NESTED_COLUMNS_PER_GPU` samples per GPU, then nested column plans;
2. unless within the solver's gap of `bounds.multi_phase_bound`: splits "the k longest samples, then
   the rest", every k priced by a bound (`bounds.split_busy`), the best planned;
3. the fastest plan found, with its bound, gap and notes (`_report`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import numpy as np

import dcp.planner.knobs as knobs
from dcp.costmodel import Cluster, CostModel
from dcp.planner.backfill import backfill_plan
from dcp.planner.bounds import (
    multi_phase_bound,
    multi_phase_busy,
    sample_arrays,
    sample_floors,
    split_busy,
)
from dcp.planner.common import assemble, chain
from dcp.planner.feasibility import allowed_sp_sizes, check_feasible
from dcp.planner.ilp import SECONDS, SOURCE, Beaten, solve_ilp, solve_ilp_against
from dcp.planner.ilp.budget import Budget, final_pricing_s
from dcp.planner.ilp.columns import shapes_of
from dcp.planner.ilp.costs import batch_costs
from dcp.planner.nested import nested_plan
from dcp.planner.nested_columns import nested_column_plan
from dcp.planner.options import IlpOptions
from dcp.planner.plan import InfeasibleError, Plan, PlanError
from dcp.planner.pricing import BatchArrays, Pricer
from dcp.planner.sample import Sample
from dcp.planner.status import CUT_SHORT
from dcp.planner.timebudget import TimeBudget

_TOL = 1e-9
BACKFILL = "backfill (the samples that need SP > 1 first, the rest after them at SP 1)"
NESTED = "nested (the samples at the largest size first, the rest after them at their own sizes)"
NESTED_COLUMNS = "nested columns (each group split into smaller ones first, then whole)"
"""How the phase notes name the plan built before the ILP (its source is the first word)."""


def split_order(batch: Sequence[Sample], cm: CostModel, sizes: Sequence[int], makespan_s: float,
                arrays: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The batch's indices, those needing the largest groups first (ties: longer), and the SP size
    each needs: the smallest where it fits and runs alone within `makespan_s` (else the largest)."""
    tokens, pairs = arrays if arrays is not None else sample_arrays(batch)
    pricer = Pricer(cm, sizes)
    need = np.full(len(batch), max(sizes))
    for p in sorted(sizes, reverse=True):
        need = np.where(pricer.times(p, tokens, pairs) <= makespan_s * (1 + _TOL), p, need)
    order = np.lexsort((-pairs, -tokens, -need))
    return order, need[order]


def split_candidates(need: np.ndarray, sizes: Sequence[int]) -> list[int]:
    """Phase-1 sizes k: per SP size q > 1, largest first, how many samples need q GPUs or more."""
    out: list[int] = []
    for q in sorted(sizes, reverse=True):
        k = int((need >= q).sum())
        if q > 1 and 0 < k < len(need) and k not in out:
            out.append(k)
    return out


def solve_phased(batch: Sequence[Sample], cm: CostModel, options: IlpOptions, started: float | None = None, *,
                 warn: bool = True) -> Plan:
    """The ILP's plan of up to `options.max_phases` phases (module docstring) within `time_limit_s`
    from `started` (perf_counter, default now); `warn` on the single layout's solver failure."""

    started = time.perf_counter() if started is None else started
    # What the time stops outside the single layout's budget: the status and notes say it.
    cuts = Budget.start(options.time_limit_s, len(batch), started)
    sizes = allowed_sp_sizes(cm, options.sp_sizes)
    arrays = BatchArrays.of(batch)  # read from the samples once, for the bounds and the ILP
    check_feasible(batch, cm, sizes, arrays.tokens)
    bound_arrays = (arrays.tokens, arrays.pairs)
    bound_s, busy_s = multi_phase_bound(batch, cm, sizes, bound_arrays), multi_phase_busy(batch, cm, sizes, bound_arrays)
    splits, order, need, estimate = _splits(batch, cm, options, sizes, busy_s, bound_arrays)
    # A split whose own bound meets the batch's can reach it: the search gets more time.
    reaches = bool(splits) and min(estimate[k - 1] for k in splits) <= busy_s * (1 + options.mip_rel_gap)
    pricing_s = final_pricing_s(len(batch))
    times = TimeBudget.divide(options.time_limit_s, pricing_s, search=bool(splits), reaching=reaches)
    deadline = started + times.search_deadline_s
    # The backfill plan first: the single layout gets what is left, unassembled if it cannot win.
    costs = batch_costs(arrays, cm, sizes)  # the cost table both read
    fill, fill_source, fill_how = None, "backfill", BACKFILL
    if options.max_phases >= 2:
        fill = backfill_plan(batch, cm, sizes, busy_s, arrays, options.max_microbatches, costs, options.time_limit_s,
                             started, cut=cuts.deadline_for("backfill targets", deadline))
        if fill is None:  # fewer samples than the backfill needs: the nested plan
            fill, fill_source, fill_how = nested_plan(batch, cm, sizes, busy_s, arrays, options.max_microbatches,
                                                      costs, options.time_limit_s,
                                                      cut=cuts.deadline_for("nested targets", deadline)), "nested", NESTED
    # Nested column plans get what the single layout, run first, leaves.
    tiny = len(batch) <= knobs.EXACT_MAX_SAMPLES and cm.cluster.num_gpus <= knobs.EXACT_MAX_GPUS  # the exact program's
    nested_ok = (options.max_phases >= 2 and not tiny and len(batch) < knobs.NESTED_COLUMNS_PER_GPU * cm.cluster.num_gpus
                 and TimeBudget.nested_columns_fit(options.time_limit_s)
                 and cm.training.zero_stage != 3 and len(sizes) >= 2 and shapes_of(costs[1]) is not None)
    if nested_ok:
        times = TimeBudget.divide(options.time_limit_s, pricing_s, search=bool(splits), reaching=reaches,
                                  nested_columns=True)
    single = solve_ilp_against(batch, cm, dataclasses.replace(options, time_limit_s=times.single_s), started, arrays,
                               warn=warn, beat_s=fill.step_time_s if fill is not None else None, costs=costs)
    if nested_ok:
        now = min(p.step_time_s for p in (single, fill) if isinstance(p, Plan))  # the fastest in hand
        if now > bound_s / (1 - options.mip_rel_gap):
            nested = nested_column_plan(batch, cm, sizes, busy_s, arrays, options.max_microbatches, costs,
                                        cuts.deadline_for("nested column levels", deadline),
                                        seed=single if isinstance(single, Plan) else None)
            if nested is not None and nested.step_time_s < now:
                fill, fill_source, fill_how = nested, "nested columns", NESTED_COLUMNS
    if isinstance(single, Beaten):
        assert fill is not None
        why = f"phases: {fill_how}, {fill.step_time_s:.3f} s; the single layout cannot run faster (not assembled)"
        if fill_source == "nested":  # few samples: a split, planned by the ILP part by part, may still beat it
            phased, how = _search(batch, cm, options, fill, bound_s, deadline, splits, order, need, estimate, cuts,
                                  against="the nested plan's")
            if phased is not None:
                return _report(phased, single, bound_s, f"{how}; {why}", started, cuts, source="a split of the batch")
        return _report(fill, single, bound_s, why, started, cuts, source=fill_source)
    phased, why = _search(batch, cm, options, single, bound_s, deadline, splits, order, need, estimate, cuts)
    best = phased or single
    if fill is not None and fill.step_time_s < best.step_time_s * (1 - _TOL):
        why = (f"phases: {fill_how}, {fill.step_time_s:.3f} s against the single layout's "
               f"{single.step_time_s:.3f} s" + (f" and the split's {phased.step_time_s:.3f} s" if phased else "")
               + f"; {why}")
        best = fill
    source = None if best is single else fill_source if best is fill else "a split of the batch"
    return _report(best, single, bound_s, why, started, cuts, source=source)


def _splits(batch: Sequence[Sample], cm: CostModel, options: IlpOptions, sizes: Sequence[int], busy_s: float,
            arrays: tuple[np.ndarray, np.ndarray]) -> tuple[list[int], np.ndarray, np.ndarray, np.ndarray]:
    """The splits worth planning, their order and bounds (`bounds.split_busy`); none unless a
    sample needs `knobs.MIN_NEED_SHARE` of the GPUs (smaller groups cost a single layout little)."""
    if options.max_phases < 2 or len(batch) < 2 or cm.training.zero_stage == 3:
        return [], np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0)
    order, need = split_order(batch, cm, sizes, busy_s, arrays)
    least = max(2, knobs.MIN_NEED_SHARE * cm.cluster.num_gpus)
    splits = split_candidates(need, [q for q in sizes if q >= least])
    return splits, order, need, split_busy(batch, cm, sizes, order) if splits else np.zeros(0)


def _search(batch: Sequence[Sample], cm: CostModel, options: IlpOptions, single: Plan, bound_s: float,
            deadline: float, splits: list[int], order: np.ndarray, need: np.ndarray,
            estimate: np.ndarray, cuts: Budget, against: str = "the single layout's") -> tuple[Plan | None, str]:
    """The best multi-phase plan faster than `single` (or None) and what the search did."""
    if options.max_phases < 2 or len(batch) < 2:
        return None, "phases: one allowed" if options.max_phases < 2 else "phases: one sample"
    if cm.training.zero_stage == 3:
        return None, "phases not searched: ZeRO stage 3 runs one layout (lockstep slots)"
    if not splits:
        return None, "phases not searched: no sample needs a large group"
    if single.step_time_s <= bound_s / (1 - options.mip_rel_gap):
        return None, f"phases not searched: the single layout is within {100 * options.mip_rel_gap:.1f}% of the bound"
    single_busy = single.step_time_s - cm.grad_sync_s()
    n = cm.cluster.num_gpus
    own = {k: 1 << max(int(need[:k].sum()) - 1, 0).bit_length() for k in splits}  # the k's GPUs, aligned
    # A split beside the k (when they leave GPUs free) is bounded by the batch's bound alone.
    ranked = [k for k in splits if own[k] < n or estimate[k - 1] < single_busy * (1 - _TOL)][:knobs.MAX_SPLITS]
    if not ranked:
        return None, "phases not searched: no split's bound beats the single layout"
    best: Plan | None = None
    best_k, best_how, tried = 0, "", 0
    for i, k in enumerate(ranked):
        left = deadline - time.perf_counter()
        if left < knobs.SPLIT_MIN_S:
            cuts.skip(f"splits {i + 1}-{len(ranked)}")
            break
        if best is not None and own[k] >= n and estimate[k - 1] >= best.busy_s() * (1 - _TOL):
            continue
        # The first split gets most of the time (the ILP stops early once it proves its plan).
        seconds = left * (knobs.FIRST_SPLIT_SHARE if i == 0 and len(ranked) > 1 else 1 / (len(ranked) - i))
        found: list[tuple[Plan | None, str]] = []
        if own[k] < n:
            if seconds * knobs.BESIDE_SHARE >= knobs.MIN_BESIDE_S:
                found.append((_plan_beside(batch, cm, options, order, k, own[k], seconds * knobs.BESIDE_SHARE, bound_s,
                                           cuts), f"on {own[k]} GPUs, the rest beside them"))
                seconds *= 1 - knobs.BESIDE_SHARE
            else:
                cuts.skip(f"split {k} beside the rest")
        if estimate[k - 1] < single_busy * (1 - _TOL):
            found.append((_plan_split(batch, cm, options, order, k, seconds, bound_s, cuts), "first"))
        tried += 1
        for plan, how in found:
            if plan is not None and plan.step_time_s < (best or single).step_time_s * (1 - _TOL):
                best, best_k, best_how = plan, k, how
    cut = f", {CUT_SHORT}" if tried < len(ranked) and cuts.cut else ""
    if best is None:
        return None, f"phases: {tried} of {len(ranked)} promising splits planned, none beat {against[:-2]}{cut}"
    return best, (f"phases: the {best_k} longest sample{'s' * (best_k > 1)} {best_how}, {best.step_time_s:.3f} s "
                  f"against {against} {single.step_time_s:.3f} s ({tried} of {len(ranked)} splits planned{cut})")


def _plan_split(batch: Sequence[Sample], cm: CostModel, options: IlpOptions, order: np.ndarray, k: int,
                seconds: float, bound_s: float, cuts: Budget | None = None) -> Plan | None:
    """The first `k` samples of `order`, then the rest (as laid out or mirrored); None if
    unplannable."""
    head = [batch[i] for i in order[:k].tolist()]
    tail = [batch[i] for i in order[k:].tolist()]
    t0 = time.perf_counter()
    try:
        first = solve_ilp(head, cm, dataclasses.replace(options, time_limit_s=max(seconds * knobs.HEAD_SHARE, 1e-3)),
                          warn=False)
        rest_s = max(seconds - (time.perf_counter() - t0), 1e-3)
        sub = dataclasses.replace(options, time_limit_s=rest_s, max_phases=options.max_phases - 1)
        second = solve_phased(tail, cm, sub, warn=False) if sub.max_phases > 1 else solve_ilp(tail, cm, sub, warn=False)
    except InfeasibleError:
        return None
    _record_parts(cuts, f"split {k}", first, second)
    out = None
    for mirror in (False, True):
        try:
            plan = chain("ilp", batch, [first, second], cm, mirror=[False, mirror], lower_bound_s=bound_s)
        except PlanError:  # a mirrored group off its alignment (a cluster that is not a power of two)
            continue
        if out is None or plan.step_time_s < out.step_time_s * (1 - _TOL):
            out = plan
    return out


def sub_cluster(cm: CostModel, gpus: int) -> CostModel:
    """`cm` on its first `gpus` GPUs, each with its room in the whole cluster (ZeRO shards)."""
    c = cm.cluster
    shape = Cluster(num_gpus=gpus, gpus_per_node=min(c.gpus_per_node, gpus), memory_bytes=c.memory_bytes)
    part = CostModel(cm.model, cm.hardware, shape, cm.training)
    return CostModel(cm.model, cm.hardware,
                     dataclasses.replace(shape, memory_bytes=c.memory_bytes + part.static_bytes - cm.static_bytes),
                     cm.training)


def _plan_beside(batch: Sequence[Sample], cm: CostModel, options: IlpOptions, order: np.ndarray, k: int,
                 gpus: int, seconds: float, bound_s: float, cuts: Budget | None = None) -> Plan | None:
    """The first `k` samples on the first `gpus` GPUs, the rest beside them (on the others) and
    after them (on theirs), split so both end together; priced as one plan."""
    n = cm.cluster.num_gpus
    head = [batch[i] for i in order[:k].tolist()]
    rest = order[k:]
    t0 = time.perf_counter()
    near, far = sub_cluster(cm, gpus), sub_cluster(cm, n - gpus)
    try:
        first = solve_ilp(head, near, dataclasses.replace(options, time_limit_s=max(seconds * knobs.HEAD_SHARE, 1e-3)),
                          warn=False)
        tokens, pairs = sample_arrays([batch[i] for i in rest.tolist()])
        work, solo = sample_floors(tokens, pairs, cm, allowed_sp_sizes(cm, options.sp_sizes))
        busy = first.busy_s()
        end = (float(work.sum()) + gpus * busy) / n  # when both parts end, if the work spreads evenly
        share_b = max(0.0, gpus * (end - busy)) / max(float(work.sum()), 1e-12)
        # Along the order, each sample to the part furthest behind its share of the work.
        done_a = done_b = 0.0
        part_a, part_b = [], []
        for i, w, alone in zip(rest.tolist(), work.tolist(), solo.tolist(), strict=True):
            if share_b > 0 and alone <= (end - busy) / 2 and done_b * (1 - share_b) <= done_a * share_b:
                part_b.append(batch[i])
                done_b += w
            else:
                part_a.append(batch[i])
                done_a += w
        left = max(seconds - (time.perf_counter() - t0), 1e-3)
        share = len(part_a) / max(len(part_a) + len(part_b), 1)
        plan_a = solve_ilp(part_a, far, dataclasses.replace(options, time_limit_s=max(left * share, 1e-3)), warn=False) \
            if part_a else None
        left = max(seconds - (time.perf_counter() - t0), 1e-3)
        plan_b = solve_ilp(part_b, near, dataclasses.replace(options, time_limit_s=left), warn=False) if part_b else None
    except InfeasibleError:
        return None
    _record_parts(cuts, f"split {k} beside the rest", first, plan_a, plan_b)

    def groups(plan: Plan | None, offset: int) -> list[tuple[int, int, list[list[int]]]]:
        if plan is None:
            return []
        return [(g.ranks[0] + offset, g.sp, [list(mb.samples) for mb in g.microbatches]) for g in plan.groups]

    try:
        now = assemble("ilp", head + part_a, cm, groups(first, 0) + groups(plan_a, gpus), lower_bound_s=0.0)
        parts = [now] + ([assemble("ilp", part_b, cm, groups(plan_b, 0), lower_bound_s=0.0)] if part_b else [])
        return chain("ilp", batch, parts, cm, lower_bound_s=bound_s)
    except (PlanError, ValueError):
        return None


def _record_parts(cuts: Budget | None, what: str, *parts: Plan | None) -> None:
    """Record `what` in `cuts` (when given) when the time limit cut one of `parts`' solves short."""
    if cuts is not None and any(p is not None and CUT_SHORT in p.solver_status for p in parts):
        cuts.stop(what)


def _report(plan: Plan, single: Plan | Beaten, bound_s: float, why: str, started: float, cuts: Budget, *,
            source: str | None = None) -> Plan:
    """`plan` with the bound any runnable plan respects, its gap, and notes on how it came about."""
    single_bound_s = single.lower_bound_s  # read first: `plan` may be `single`
    step = plan.step_time_s
    plan.lower_bound_s = min(bound_s, step)
    plan.gap = max(0.0, (step - plan.lower_bound_s) / step) if step > 0 else 0.0
    notes = [n for n in single.notes if not n.startswith(SECONDS)]
    if source is not None and notes and notes[0].startswith(SOURCE):
        notes[0] = f"{SOURCE}{source} (the single layout's: {notes[0][len(SOURCE):]})"
    if single_bound_s > bound_s * (1 + _TOL):
        notes.append(f"bound {single_bound_s:.3f} s for single-layout plans only (the solver's); "
                     f"every plan, multi-phase included: {bound_s:.3f} s")
    notes += [f"{what} skipped: {CUT_SHORT}" for what in cuts.cut] + [f"{what} cut short: {CUT_SHORT}"
                                                                        for what in cuts.stopped]
    notes.append(why)
    notes += [n for n in single.notes if n.startswith(SECONDS)]
    plan.notes = notes
    status = single.solver_status
    if (cuts.cut or cuts.stopped) and CUT_SHORT not in status:
        status += f", {CUT_SHORT} (phase search)"
    plan.solver_status = status + (f", {plan.num_phases} phases" if plan.num_phases > 1 else "")
    plan.solve_time_s = time.perf_counter() - started
    return plan
