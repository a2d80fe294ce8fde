"""Few large micro-batches, balanced on exact prices: a warm start where fixed costs are heavy
(under ZeRO-3 every micro-batch gathers all parameters), which the search's canonical micro-batching
(`costs`) cannot express and static packing balances by tokens, not time. Per SP size, every sample,
longest first, goes to the micro-batch that least lengthens its group (exact times,
`pricing.Pricer`), past the longest `knobs.FILL_ONE_BY_ONE` in rounds of one per group. Under ZeRO-3
the warm start takes `lockstep_layouts` instead.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np

import dcp.planner.knobs as knobs
from dcp.costmodel import CostModel
from dcp.costmodel.schedule import slot_link_s
from dcp.planner.baselines import lpt_assign
from dcp.planner.bounds import one_size_busy
from dcp.planner.ilp.budget import Deadline
from dcp.planner.pricing import BatchArrays, Layout, Pricer
from dcp.planner.slots import align


def fill_layouts(arrays: BatchArrays, cm: CostModel, sizes: Sequence[int], pricer: Pricer,
                 deadline: float | Deadline = math.inf, upper: float = math.inf) -> list[Layout]:
    """One layout per SP size at which every sample fits and fixed costs are worth it
    (`knobs.FILL_WORTH_IT`), until `deadline` (which drops an interrupted fill and records it).
    Sizes go lowest bound on their busy time first (`_ranked`), none at or above `upper` (the
    incumbent's): the fill most likely to win runs first."""
    layouts = []
    k = cm.model.num_layers
    deadline = Deadline.of(deadline)
    worth_it = []
    for p in sizes:
        no_ckpt, full = cm.linear_time(p, 0), cm.linear_time(p, k)
        worth = no_ckpt.fixed / max((full.per_token - no_ckpt.per_token) * cm.max_tokens(p, 0), 1e-30)
        if worth >= knobs.FILL_WORTH_IT and (worth >= knobs.FILL_HEAVY or len(arrays.tokens) <= knobs.FILL_MAX_SAMPLES):
            worth_it.append(p)
    for p in _ranked(arrays, cm, worth_it, pricer, upper):
        if deadline.passed():
            break
        layout = _fill(arrays, cm, p, pricer, deadline)
        if layout is not None:
            layouts.append(layout)
    return layouts


def _ranked(arrays: BatchArrays, cm: CostModel, sizes: Sequence[int], pricer: Pricer, upper: float) -> list[int]:
    """The sizes by `bounds.one_size_busy`, lowest first (ties: the larger size), leaving out
    those at or above `upper` or where a sample fits nowhere."""
    ranked = []
    for p in sizes:
        bound = one_size_busy(arrays, cm, p, pricer)
        if bound < upper and math.isfinite(bound):
            ranked.append((bound, p))
    return [p for _, p in sorted(ranked, key=lambda bp: (bp[0], -bp[1]))]


def lockstep_layouts(arrays: BatchArrays, cm: CostModel, sizes: Sequence[int], pricer: Pricer,
                     deadline: Deadline, upper: float = math.inf) -> Iterator[Layout]:
    """ZeRO-3's fill: at each size (in `_ranked` order) the samples over the N / p groups by
    marginal time, longest first, each group's micro-batches cut into slots that line up
    (`slots.align`: what decides the step there), yielded until the deadline (which records it)."""
    k, n = cm.model.num_layers, cm.cluster.num_gpus
    link = slot_link_s(cm)
    for p in _ranked(arrays, cm, sizes, pricer, upper):
        if deadline.passed():
            return
        lin = cm.linear_time(p, k)
        groups = lpt_assign(lin.per_token * arrays.tokens + lin.per_pair * arrays.pairs, n // p)
        found = align([(g * p, p, [jobs]) for g, jobs in enumerate(groups) if jobs], arrays, pricer, link,
                      deadline=deadline.at)
        if found is not None:
            yield found[0]


def _fill(arrays: BatchArrays, cm: CostModel, p: int, pricer: Pricer, deadline: Deadline) -> Layout | None:
    groups = cm.cluster.num_gpus // p
    tokens, pairs = arrays.tokens, arrays.pairs

    def price(t: np.ndarray, a: np.ndarray) -> np.ndarray:
        return pricer.times(p, t, a)

    if not np.isfinite(price(tokens, pairs)).all():
        return None
    full = cm.max_tokens(p, cm.model.num_layers)
    per_group = max(1, math.ceil(tokens.sum() / (groups * full))) + knobs.FILL_EXTRA_MICROBATCHES
    n_bins = groups * per_group
    owner = np.arange(n_bins) // per_group  # the group of each micro-batch
    bin_tok, bin_pair, bin_time = np.zeros(n_bins), np.zeros(n_bins), np.zeros(n_bins)
    group_time = np.zeros(groups)
    where = np.full(len(tokens), -1)
    solo = price(tokens, pairs)
    order = np.lexsort((np.arange(len(tokens)), -solo))
    singles = knobs.FILL_ONE_BY_ONE

    def place(i: int) -> bool:
        new = price(bin_tok + tokens[i], bin_pair + pairs[i])
        after = group_time[owner] - bin_time + new
        b = int(np.argmin(after))
        if not math.isfinite(after[b]):
            return False
        group_time[owner[b]] = after[b]
        bin_tok[b] += tokens[i]
        bin_pair[b] += pairs[i]
        bin_time[b] = new[b]
        where[i] = b
        return True

    pos = step = 0
    while pos < len(order):
        if step % knobs.FILL_CHECK_EVERY == 0 and deadline.passed():
            return None
        step += 1
        if pos < singles or groups == 1:
            if not place(int(order[pos])):
                return None
            pos += 1
            continue
        # A round: each group's best micro-batch for the round's longest sample; the round's
        # samples, longest first, dealt to the groups in the order they would end with it.
        size = max(groups, -(-(len(order) - pos) // max(1, knobs.FILL_ROUNDS - (step - 1 - singles))))
        chunk = order[pos:pos + size]
        new = price(bin_tok + tokens[chunk[0]], bin_pair + pairs[chunk[0]])
        after = (group_time[owner] - bin_time + new).reshape(groups, per_group)
        best_bin = np.argmin(after, axis=1) + np.arange(groups) * per_group
        targets = np.resize(best_bin[np.lexsort((np.arange(groups), after.min(axis=1)))], len(chunk))
        t_new, a_new = bin_tok.copy(), bin_pair.copy()
        np.add.at(t_new, targets, tokens[chunk])
        np.add.at(a_new, targets, pairs[chunk])
        touched = np.unique(targets)
        times = price(t_new[touched], a_new[touched])
        if not np.isfinite(times).all():  # more than a micro-batch holds: one at a time
            if not all(place(int(i)) for i in chunk):
                return None
            pos += len(chunk)
            continue
        bin_tok, bin_pair = t_new, a_new
        bin_time[touched] = times
        group_time = np.bincount(owner, weights=bin_time, minlength=groups)
        where[chunk] = targets
        pos += len(chunk)
    members = np.argsort(where, kind="stable")
    cuts = np.searchsorted(where[members], np.arange(n_bins + 1))
    return [(g * p, p, [members[cuts[b]:cuts[b + 1]].tolist() for b in range(g * per_group, (g + 1) * per_group)
                        if bin_tok[b] > 0]) for g in range(groups)]
