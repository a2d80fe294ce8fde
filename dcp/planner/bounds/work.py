"""The work bound (`bounds.lower_bound`'s argument): work(M), the GPU-seconds a batch needs when
no group runs longer than M (`_Work`), per SP size's levels (`SizeLevels`), raised to the largest
M where it does not fit N GPUs (`_makespan_bound`), and its variant charged against the gradient
reductions (`_exposure_bound`); the rounding of many samples into few classes (`round_down`)."""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence

import numpy as np

import dcp.planner.knobs as knobs
from dcp.costmodel import CostModel
from dcp.costmodel.schedule import least_exposed_s
from dcp.planner.levels import climb, geometric, narrow
from dcp.planner.pricing import exact_times

_MEMORY_RTOL = 1e-9
"""`Plan.validate` lets a micro-batch exceed the memory limit by this fraction; capacities here do too."""
_RTOL = 1e-5
_LEVELS: weakref.WeakKeyDictionary[CostModel, dict[tuple[int, bool], SizeLevels]] = weakref.WeakKeyDictionary()
"""Each cost model's `SizeLevels` per (SP size, charged below): a pure function of them, which
every batch's bounds read."""


class SizeLevels:
    """One SP size's coefficients at r = 0..K and the tokens that fit memory (and the profile's
    priceable range) at each, with the validator's tolerance. `fixed`, `per_token` and
    `per_pair` are the micro-batch's time; the `charge_` ones what the work bound charges, the
    same, or with `below` the time less the backward below the top layer
    (`CostModel.linear_less_below`: `_exposure_bound`)."""

    def __init__(self, cm: CostModel, p: int, below: bool = False) -> None:
        k = cm.model.num_layers
        room = cm.cluster.memory_bytes * (1 + _MEMORY_RTOL) - cm.static_bytes
        lin = [cm.linear_time(p, r) for r in range(k + 1)]
        self.fixed = np.array([c.fixed for c in lin])
        self.per_token = np.array([c.per_token for c in lin])
        self.per_pair = np.array([c.per_pair for c in lin])
        charged = [cm.linear_less_below(p, r) for r in range(k + 1)] if below else lin
        self.charge_fixed = np.array([c.fixed for c in charged])
        self.charge_per_token = np.array([c.per_token for c in charged])
        self.charge_per_pair = np.array([c.per_pair for c in charged])
        # Each GPU holds ceil(T/p) tokens (CostModel.memory_bytes: the executor pads), so a
        # micro-batch fits when ceil(T/p) <= room / bytes per token on one GPU: T <= p * floor(..)
        # (CostModel.max_tokens, which also pads for rings and takes the least over layouts).
        memory = cm.cluster.memory_bytes * (1 + _MEMORY_RTOL)
        self.memory_cap = np.array([float(cm.max_tokens(p, r, memory)) if room > 0 else 0.0 for r in range(k + 1)])
        with np.errstate(divide="ignore", invalid="ignore"):
            self.memory_share = np.where(self.charge_fixed > 0, self.charge_fixed / self.memory_cap, 0.0)
        self.candidates = self._candidates()

    def _candidates(self) -> list[list[int]]:
        """For a sample whose fewest layers at p are r0: the levels r >= r0 its cheapest cost can
        be at, for every makespan M. Level r2 > r1 never beats r1 when both fit, if the per-token
        price it adds is at least the memory share it saves (per_token(r2) - per_token(r1) >=
        fixed(r1) / cap(r1) - fixed(r2) / cap(r2), in the charged prices): every other term, the
        time share and solo time included, is no smaller at r2, as fixed, per_token and per_pair
        (the time's and the charged) grow with r. When they do not grow with r every level stays a
        candidate."""
        k = len(self.fixed) - 1
        grows = all((np.diff(c) >= 0).all() for c in (self.fixed, self.per_token, self.per_pair, self.charge_fixed,
                                                       self.charge_per_token, self.charge_per_pair))
        out = []
        for r0 in range(k + 1):
            if not grows:
                out.append(list(range(r0, k + 1)))
                continue
            with np.errstate(invalid="ignore"):  # inf - inf: neither level holds a token
                saved = self.memory_share[r0] - self.memory_share[r0 + 1:]
            added = self.charge_per_token[r0 + 1:] - self.charge_per_token[r0]
            out.append([r0] + [r0 + 1 + int(i) for i in np.flatnonzero(added < saved)])
        return out


def size_levels(cm: CostModel, p: int, below: bool = False) -> SizeLevels:
    """`SizeLevels(cm, p, below)`, built once per cost model."""
    cached = _LEVELS.setdefault(cm, {})
    if (p, below) not in cached:
        cached[p, below] = SizeLevels(cm, p, below)
    return cached[p, below]


def _makespan_bound(work: _Work, n: int, start: float = 0.0, extra: float = 0.0) -> float:
    """The largest M proven below every plan's busy time: max(longest sample, work(inf) / N,
    `start`, a proven bound), raised while work(M) + `extra` > N * M by regula falsi (Illinois)
    on that decreasing function; one evaluation more when it does not hold at the start."""

    def excess(m: float) -> float:
        return work(m) + extra - n * m

    lo = max(work.longest, (work(math.inf) + extra) / n, start)
    f_lo = excess(lo) if 0 < lo < math.inf else 0.0
    if not f_lo > 0:
        return lo
    seen = {lo: f_lo}

    def fits(m: float) -> bool:
        seen[m] = excess(m)
        return not seen[m] > 0

    # work(M) falls towards work(inf) <= n * lo - extra, so some doubling fits.
    failed, hi = climb(fits, geometric(2 * lo, 2.0))
    lo = lo if failed is None else failed
    return narrow(excess, lo, hi, steps=knobs.BOUND_MAX_STEPS, rtol=_RTOL, values=(seen[lo], seen[hi]))[0]


def _exposure_bound(coarse: _Work, cm: CostModel, sizes: Sequence[int], start_s: float, chain: np.ndarray) -> float:
    """Stages 0-2: a bound on the step S from every rank's need to hide the reduction chain
    after its own last micro-batch: `start_s` (a proven step bound), raised where it holds.

    Why it holds: rank c ends its last micro-batch at e_c and issues layer K-1's reduction at
    e_c - below_c, below_c being that micro-batch's backward and recompute of layers K-2..0,
    and the step ends no sooner than that plus `reduction_chain_s`[K-1] (`schedule.least_step_s`);
    a rank in no group issues at 0. Summed over the N ranks: N S >= sum of (e_c - below_c) +
    N chain[K-1]. A rank runs its micro-batches one after another, so the e_c sum to at least
    every micro-batch's p times its time, and below_c is that of its last one: charging every
    micro-batch p (time - below), which is at least its linear form less the linear backward
    below the top layer (`CostModel.linear_less_below`), undercharges. That is `_Work` with
    those coefficients, each micro-batch within the busy time M <= S - `least_exposed_s`, so
    work'(S - least) + N chain[K-1] <= N (S - least) + N least for every plan, and any S where it
    fails is below all of them (`_makespan_bound` on M = S - least, from `start_s` - least).
    Multi-phase plans too: a rank's group may change between micro-batches, and its last
    micro-batch issues its reductions.

    Where the chain is long against the step (`knobs.BOUND_CAPPED_CHAIN_SHARE`) each micro-batch's charge
    is capped by the release instead: every micro-batch a rank runs ends by e_c, and e_c less the
    last one's backward below is at most R = S - chain[K-1], so the charge of each (its time, or
    its time less that backward for the last) is at most R. That is `_Work`'s argument again in
    charged seconds (`capped`: the token shares, the time shares at the cap R, and each size's
    weighting), on the same sum: work''(R) <= N R, and S = R + chain[K-1] (docs/tuning-log.md).

    The charge is at most `ratio` (the largest of charged over time coefficients) times the
    work bound's cost, at every level, and the work bound fits N M at M = `start_s` - least
    (above its own root): where that ratio of it plus the chain fits too, it cannot raise the
    bound and is not computed (a screen only: returning `start_s` is always valid)."""
    n, least = cm.cluster.num_gpus, least_exposed_s(cm)
    extra = n * (float(chain[-1]) - least)
    ratio = 0.0
    for p in sizes:
        lv = size_levels(cm, p, below=True)
        for t, c in ((lv.fixed, lv.charge_fixed), (lv.per_token, lv.charge_per_token),
                     (lv.per_pair, lv.charge_per_pair)):
            ratio = max(ratio, float(np.max(np.divide(c, t, out=np.zeros_like(c), where=t > 0))))
    if ratio * n * (start_s - least) + extra <= n * (start_s - least):
        return start_s
    tokens, pairs, weight = coarse.tokens, coarse.pairs, coarse.weight
    if len(tokens) > knobs.BOUND_EXPOSURE_CLASSES:
        tokens, pairs, weight = round_down(tokens, pairs, weight, knobs.BOUND_EXPOSURE_CLASSES)
    work = _Work(tokens, pairs, weight, cm, sizes, below=True, longest=coarse.longest)
    raised = max(start_s, _makespan_bound(work, n, start_s - least, extra) + least)
    last = float(chain[-1])
    if last <= knobs.BOUND_CAPPED_CHAIN_SHARE * raised:
        return raised
    # Each micro-batch's charge is also at most S - chain (the release, below): on that cap, in
    # charged seconds throughout, with each size's fixed costs weighed as `_Work.weigh` picks.
    capped = _Work(tokens, pairs, weight, cm, sizes, below=True, longest=0.0, capped=True)
    release = _makespan_bound(capped, n, raised - last)
    if capped.weigh(release):
        release = _makespan_bound(capped, n, release)
    return max(raised, release + last)


def _front(tokens: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """The indices of the samples that no other has at least as many tokens and pairs as, with
    more of one (equal ones all kept): the maximal ones, whatever order the costs take."""
    order = np.lexsort((-pairs, -tokens))  # most tokens first, then most pairs
    t, a = tokens[order], pairs[order]
    first = np.concatenate([[True], t[1:] != t[:-1]])  # each token count's most pairs come first
    group = np.cumsum(first) - 1
    starts = np.flatnonzero(first)
    above = np.concatenate([[-math.inf], np.maximum.accumulate(a)[starts[1:] - 1]])  # most pairs with more tokens
    return order[(a == a[starts][group]) & (a > above[group])]


def _coarse(work: _Work) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`work`'s samples in at most `knobs.BOUND_COARSE` classes: the `knobs.BOUND_COARSE_EXACT` longest as they are
    (the group bound charges the longest), the rest rounded down (`round_down`)."""
    order = np.argsort(work.tokens, kind="stable")
    rest, top = order[:-knobs.BOUND_COARSE_EXACT], order[-knobs.BOUND_COARSE_EXACT:]
    t, a, w = round_down(work.tokens[rest], work.pairs[rest], work.weight[rest], knobs.BOUND_COARSE - knobs.BOUND_COARSE_EXACT)
    return (np.concatenate([t, work.tokens[top]]), np.concatenate([a, work.pairs[top]]),
            np.concatenate([w, work.weight[top]]))


def round_down(tokens: np.ndarray, pairs: np.ndarray, weight: np.ndarray,
               most: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """At most about `most` classes of samples on a geometric grid of token counts, each standing
    for its members with the least tokens and the least pairs among them: every cost in the
    bound grows with both, so the bound can only fall."""
    spread = math.log(float(tokens.max()) / float(tokens.min())) if len(tokens) else 0.0
    step = max(spread / most, 1e-6)
    key = np.floor(np.log(tokens) / step).astype(np.int64)
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    starts = np.searchsorted(inverse[order], np.arange(len(first)))
    return (np.minimum.reduceat(tokens[order], starts), np.minimum.reduceat(pairs[order], starts),
            np.add.reduceat(weight[order], starts))


class _Work:
    """work(M): GPU-seconds the batch needs if no group runs longer than M (see `lower_bound`),
    over every level (p, r) that can be a sample's cheapest (`SizeLevels.candidates`); inf when some
    sample fits no micro-batch within M. Also `longest`, the largest over samples of their least
    solo time at a level where they fit.

    For sample i at level l: cost = p (per_token t_i + per_pair a_i) + p t_i fixed / cap, where
    fixed / cap = max(fixed / memory_cap, fixed per_token / (M - fixed - per_pair a_i)), and the
    level is open to i when t_i fits memory_cap and its solo time at l is at most M. Arrays are
    (level slots) x (distinct samples), weighted by how many samples each row stands for;
    everything but M is computed once. With `capped` (and `below`) M caps each micro-batch's
    charge instead of its time: the solo and fixed times, the time share and the weightings are
    the charged ones (`_exposure_bound`)."""

    def __init__(self, tokens: np.ndarray, pairs: np.ndarray, weight: np.ndarray, cm: CostModel,
                 sizes: Sequence[int], below: bool = False, longest: float | None = None,
                 capped: bool = False) -> None:
        k = cm.model.num_layers
        levels = {p: size_levels(cm, p, below) for p in sizes}
        cands = {p: lv.candidates for p, lv in levels.items()}
        slots = sum(max(len(c) for c in cands[p]) for p in sizes)
        if slots * len(tokens) > knobs.BOUND_MAX_CELLS:
            tokens, pairs, weight = round_down(tokens, pairs, weight, max(1, knobs.BOUND_MAX_CELLS // slots))
        self.tokens, self.pairs, self.weight = tokens, pairs, weight
        self.memory_caps = {p: lv.memory_cap for p, lv in levels.items()}
        self.coefs = {p: (lv.fixed, lv.per_token, lv.per_pair) for p, lv in levels.items()}
        rows: list[tuple[int, np.ndarray, np.ndarray]] = []  # (p, level per sample, open by memory)
        for p in sizes:
            lv = levels[p]
            r0 = np.searchsorted(lv.memory_cap, tokens, side="left")  # K + 1: fits nowhere at p
            table = np.full((k + 2, max(len(c) for c in cands[p])), k + 1)
            for r, c in enumerate(cands[p]):
                table[r, :len(c)] = c
            for s in range(table.shape[1]):
                r = table[r0, s]
                rows.append((p, np.minimum(r, k), r <= k))
        gpus = np.array([p for p, _, _ in rows], dtype=np.float64)[:, None]
        fixed = np.stack([levels[p].fixed[r] for p, r, _ in rows])
        per_token = np.stack([levels[p].per_token[r] for p, r, _ in rows])
        per_pair = np.stack([levels[p].per_pair[r] for p, r, _ in rows])
        memory_share = np.stack([levels[p].memory_share[r] for p, r, _ in rows])
        charge = [fixed, per_token, per_pair]
        if below:
            charge = [np.stack([levels[p].charge_fixed[r] for p, r, _ in rows]),
                      np.stack([levels[p].charge_per_token[r] for p, r, _ in rows]),
                      np.stack([levels[p].charge_per_pair[r] for p, r, _ in rows])]
        fits = np.stack([ok for _, _, ok in rows])
        t, a = tokens[None, :], pairs[None, :]
        self.busy = fixed + per_pair * a  # what a micro-batch holding i runs besides its tokens
        self.solo = self.busy + per_token * t
        self.marginal = np.where(fits, gpus * (charge[1] * t + charge[2] * a), np.inf)
        self.gpu_tokens = gpus * t
        # Alone at its cheapest level where it fits: no plan runs shorter than any sample's best.
        # That is its fewest layers (every cost grows with r), priced exactly: with a ring the
        # exact time adds the transfers its attention does not hide, and adding samples to a
        # micro-batch only lengthens every ring step (CostModel.time_s).
        # `longest`, when given (a proven bound on the busy time), stands in for it. Only the
        # samples no other has as many tokens and pairs as (`_front`) are priced: that time
        # only grows with both, so the largest is among them (the others keep 0).
        solo = np.zeros(len(tokens))
        if longest is None and len(tokens):
            front = _front(tokens, pairs)
            least = np.full(len(front), math.inf)
            for p in sizes:
                r0 = np.searchsorted(levels[p].memory_cap, tokens[front], side="left")
                alone = exact_times(cm, p, tokens[front], pairs[front], np.minimum(r0, k))
                least = np.minimum(least, np.where(r0 <= k, alone, math.inf))
            solo[front] = least
        self.solo_best = solo
        """Per sample, its least time alone where it fits, on the (tokens, pairs) front; 0 off it
        (everywhere when `longest` is given)."""
        self.longest = longest if longest is not None else float(solo.max()) if len(solo) else 0.0
        self.memory_share = memory_share
        self.time_share = charge[0] * per_token  # over M - busy: fixed seconds per token when time caps it
        # For `weigh`: each row's size (rows of one size share a weighting) and its samples' fixed time.
        self.row_sizes = gpus[:, 0].astype(np.int64)
        self.fixed = fixed
        if capped:  # the makespan caps each micro-batch's charge, not its time (`_exposure_bound`)
            self.busy = charge[0] + charge[2] * a
            self.solo = self.busy + charge[1] * t
            self.time_share = charge[0] * charge[1]
            self.fixed = charge[0]
        self.weighting: np.ndarray | None = None
        """Per row, the fixed-cost weighting `weigh` chose (0: the token shares); None: all 0."""
        # The least time any micro-batch takes: the least fixed part at any allowed size and level.
        self.fixed_floor = max(0.0, min(float(lv.fixed.min()) for lv in levels.values())) if levels else 0.0

    def __call__(self, makespan: float) -> float:
        return float(self.costs(makespan) @ self.weight)

    def costs(self, makespan: float) -> np.ndarray:
        """Each distinct sample's least GPU-seconds in a plan of busy time `makespan`."""
        if not math.isfinite(makespan):
            cost = self.marginal + self.gpu_tokens * self.memory_share
        else:
            cost = self._charged(makespan)
        return cost.min(axis=0)

    def _charged(self, makespan: float) -> np.ndarray:
        """Per row and sample at a finite makespan: the marginal GPU-seconds plus the fixed cost's
        token share, or at the sizes `weigh` set, the weighting `_weigh` names."""
        open_ = self.solo <= makespan
        left = makespan - self.busy  # > 0 wherever open_ and per_token > 0
        timed = np.divide(self.time_share, left, out=np.zeros_like(left), where=left > 0)
        share = np.maximum(self.memory_share, timed)
        cost = np.where(open_, self.marginal + self.gpu_tokens * share, np.inf)
        if self.weighting is not None:
            for k in range(1, len(_WEIGHTINGS) + 1):
                rows = self.weighting == k
                if rows.any():
                    cost[rows] = self._weighed(k, makespan, rows, open_[rows])
        return cost

    def _weighed(self, k: int, makespan: float, rows: np.ndarray | slice, open_: np.ndarray) -> np.ndarray:
        """`rows`' costs at `makespan` with their fixed costs charged by weighting k (`_weigh`)."""
        fixed = self.fixed[rows]
        # Weighting 3 reads each sample's share of its micro-batch's memory, t / cap, which is
        # t * memory_share / fixed (where the fixed time is 0 its weight charges nothing).
        memory_used = None if k != 3 else np.divide(self.tokens * self.memory_share[rows], fixed,
                                                    out=np.zeros_like(fixed), where=fixed > 0)
        w = _weigh(k, self.solo[rows] - fixed, makespan - fixed, memory_used)
        return np.where(open_, self.marginal[rows] + self.row_sizes[rows, None] * fixed * w, np.inf)

    def weigh(self, makespan: float) -> dict[int, int]:
        """Charges each size's fixed costs by the weighting (`_weigh`; 0: the token shares) under
        which the work at `makespan` is largest, the other sizes' weightings as they stand, size
        after size, over the sizes again while one changes (at most `knobs.BOUND_WEIGH_PASSES` passes): a
        choice is taken only where it raises the work, so it never falls below the token shares'.
        Returns the sizes that took one (and which).

        Why any choice holds: a micro-batch B at level (p, r) in a plan of busy time at most M
        costs p (fixed + its samples' marginal times) GPU-seconds, so charging each of its samples
        its marginal GPU-seconds plus w_i p fixed undercharges it whenever the weights of B's
        samples sum to at most 1. The token shares do (`lower_bound`), and so does each
        weighting; each size may take its own, as a micro-batch is at one size. The choice only
        sets which valid bound is computed (each stays valid at every M, and falls as M grows)."""
        self.weighting = None
        cost = self._charged(makespan)
        rows = cost.shape[0]
        if rows < 2 or not math.isfinite(makespan):
            return {}
        open_ = np.isfinite(cost)
        sizes, row_size = np.unique(self.row_sizes, return_inverse=True)
        # Each weighting's costs on every row (0: the token shares).
        alts = [cost] + [self._weighed(k, makespan, slice(None), open_) for k in range(1, len(_WEIGHTINGS) + 1)]
        choice = np.zeros(len(sizes), dtype=np.int64)
        now = cost.copy()
        for _ in range(knobs.BOUND_WEIGH_PASSES):  # each size's best weighting, the others' as they stand
            changed = False
            for q in range(len(sizes)):
                mine = row_size == q
                others = now[~mine].min(axis=0) if not mine.all() else np.full(now.shape[1], np.inf)
                works = [float(np.minimum(others, alt[mine].min(axis=0)) @ self.weight) for alt in alts]
                k = int(np.argmax(works))
                if works[k] > works[choice[q]] * (1 + 1e-12):
                    choice[q], changed = k, True
                    now[mine] = alts[k][mine]
            if not changed:
                break
        if choice.any():
            self.weighting = choice[row_size]
        return {int(p): int(k) for p, k in zip(sizes, choice, strict=True) if k}
_WEIGHTINGS = ("time share", "over half the time", "over half the memory")
"""The fixed-cost weightings `_weigh` computes, numbered from 1 (0: the token shares)."""


def _weigh(k: int, var_s: np.ndarray, room_s: np.ndarray, memory_used: np.ndarray | None) -> np.ndarray:
    """Weighting k of `_WEIGHTINGS`: fixed-cost weights per (row, sample) whose sum over any
    micro-batch's samples is at most 1 in a plan of busy time M (`_Work.weigh`). A micro-batch
    runs its fixed time and its samples' marginal times within M, so their marginal time as a
    share x of `room_s` (M less the fixed time) sums to at most 1 over it; so does their share y
    of the memory; and so does any dual-feasible function of either (u(x) summed stays at most 1
    wherever x does). 1: x itself, which counts a long sample's attention in full (the token
    shares count only its tokens); 2: 1 where x > 1/2, else 0; 3: 1 where y > 1/2, else 0 (no
    two such samples share a micro-batch: a long sample alone in a large group pays all of it);
    `memory_used` (y) is read by 3 only."""
    if k == 3:
        assert memory_used is not None
        return np.where(memory_used > 0.5, 1.0, 0.0)
    x = np.minimum(np.divide(var_s, room_s, out=np.ones_like(var_s), where=room_s > 0), 1.0)
    return x if k == 1 else np.where(x > 0.5, 1.0, 0.0)
