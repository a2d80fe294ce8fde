"""The work bound (`bounds.lower_bound`'s argument): work(M), the GPU-seconds a batch needs when
no group runs longer than M (`_Work`, on each size's `SizeLevels`), raised to the largest M where
it does not fit N GPUs (`_makespan_bound`); its variant against the gradient reductions
(`_exposure_bound`); samples rounded into classes (`round_down`). Proofs: docs/design.md."""

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
"""Each cost model's `SizeLevels` per (SP size, charged below), which every batch's bounds read."""


class SizeLevels:
    """One SP size's coefficients at r = 0..K and the tokens that fit memory (and the profile's
    priceable range) at each, with the validator's tolerance. `fixed`, `per_token`, `per_pair`:
    the micro-batch's time; the `charge_` ones: what the work bound charges, the same or, with
    `below`, the time less the backward below the top layer (`CostModel.linear_less_below`)."""

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
        # What fits: CostModel.max_tokens (each GPU holds ceil(T/p) tokens; least over layouts).
        memory = cm.cluster.memory_bytes * (1 + _MEMORY_RTOL)
        self.memory_cap = np.array([float(cm.max_tokens(p, r, memory)) if room > 0 else 0.0 for r in range(k + 1)])
        with np.errstate(divide="ignore", invalid="ignore"):
            self.memory_share = np.where(self.charge_fixed > 0, self.charge_fixed / self.memory_cap, 0.0)
        self.candidates = self._candidates()

    def _candidates(self) -> list[list[int]]:
        """For a sample whose fewest layers at p are r0: the levels r >= r0 where its cheapest
        cost can be, for any makespan M. r2 > r1 never beats r1 when the per-token price it adds
        is at least the memory share it saves, as every other term grows with r; when the
        coefficients do not grow with r every level stays a candidate."""
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


def makespan_floor(total: float | np.ndarray, machines: int, longest: float | np.ndarray) -> float | np.ndarray:
    """max(total / machines, longest), elementwise (a float for scalars): the classic makespan
    bound of unsplit jobs on identical machines; also dcp-greedy's and the heuristic's step
    estimate before LPT places their jobs (the largest over their classes of groups)."""
    out = np.maximum(total / machines, longest)
    return out if isinstance(out, np.ndarray) else float(out)


def _makespan_bound(work: _Work, n: int, start: float = 0.0, extra: float = 0.0) -> float:
    """The largest M proven below every plan's busy time: from max(longest sample, work(inf) / N,
    `start`), raised while work(M) + `extra` > N M (regula falsi on that decreasing function)."""

    def excess(m: float) -> float:
        return work(m) + extra - n * m

    lo = max(makespan_floor(work(math.inf) + extra, n, work.longest), start)
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
    """Stages 0-2: `start_s` (a proven step bound) raised by every rank's need to hide the
    reduction `chain` after its own last micro-batch, charging each micro-batch its time less its
    backward below the top layer (and, where the chain is over `knobs.BOUND_CAPPED_CHAIN_SHARE`
    of the step, capping each charge at S - chain[K-1]); skipped where it cannot raise `start_s`.
    Holds for multi-phase plans (proof: docs/design.md, Why each bound holds)."""
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
    # Each charge is also at most S - chain: on that cap, in charged seconds (`_Work.weigh` too).
    capped = _Work(tokens, pairs, weight, cm, sizes, below=True, longest=0.0, capped=True)
    release = _makespan_bound(capped, n, raised - last)
    if capped.weigh(release):
        release = _makespan_bound(capped, n, release)
    return max(raised, release + last)


def _front(tokens: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """The indices of the maximal samples (no other has as many tokens and pairs, more of one)."""
    order = np.lexsort((-pairs, -tokens))  # most tokens first, then most pairs
    t, a = tokens[order], pairs[order]
    first = np.concatenate([[True], t[1:] != t[:-1]])  # each token count's most pairs come first
    group = np.cumsum(first) - 1
    starts = np.flatnonzero(first)
    above = np.concatenate([[-math.inf], np.maximum.accumulate(a)[starts[1:] - 1]])  # most pairs with more tokens
    return order[(a == a[starts][group]) & (a > above[group])]


def _coarse(work: _Work) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`work`'s samples in at most `knobs.BOUND_COARSE` classes: the `knobs.BOUND_COARSE_EXACT`
    longest as they are (the group bound charges the longest), the rest rounded down."""
    order = np.argsort(work.tokens, kind="stable")
    rest, top = order[:-knobs.BOUND_COARSE_EXACT], order[-knobs.BOUND_COARSE_EXACT:]
    t, a, w = round_down(work.tokens[rest], work.pairs[rest], work.weight[rest], knobs.BOUND_COARSE - knobs.BOUND_COARSE_EXACT)
    return (np.concatenate([t, work.tokens[top]]), np.concatenate([a, work.pairs[top]]),
            np.concatenate([w, work.weight[top]]))


def round_down(tokens: np.ndarray, pairs: np.ndarray, weight: np.ndarray,
               most: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """At most about `most` classes of samples on a geometric grid of token counts, each at its
    members' least tokens and pairs: every cost grows with both, so the bound only falls."""
    spread = math.log(float(tokens.max()) / float(tokens.min())) if len(tokens) else 0.0
    step = max(spread / most, 1e-6)
    key = np.floor(np.log(tokens) / step).astype(np.int64)
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    starts = np.searchsorted(inverse[order], np.arange(len(first)))
    return (np.minimum.reduceat(tokens[order], starts), np.minimum.reduceat(pairs[order], starts),
            np.add.reduceat(weight[order], starts))


class _Work:
    """work(M): the GPU-seconds the batch needs if no group runs longer than M (`lower_bound`),
    each sample at its cheapest level (p, r) among `SizeLevels.candidates`, open where it fits
    and runs alone within M, charged p (per_token t + per_pair a) plus its share of the fixed
    cost (`_charged`); inf when a sample fits nowhere. Arrays are (level slots) x (distinct
    samples, weighted); all but M is computed once. `capped` (with `below`): M caps each
    micro-batch's charge instead of its time (`_exposure_bound`)."""

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
        # Each sample alone at its fewest layers, priced exactly (with rings the exact time adds
        # what attention does not hide): no plan runs shorter. Only the front (`_front`) is
        # priced, as that time grows with tokens and pairs; `longest`, when given, stands in.
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
        """Least time alone per sample on the tokens-pairs front; 0 off it or given `longest`."""
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
        # Weighting 3 reads the memory share t / cap = t * memory_share / fixed (0 where fixed is 0).
        memory_used = None if k != 3 else np.divide(self.tokens * self.memory_share[rows], fixed,
                                                    out=np.zeros_like(fixed), where=fixed > 0)
        w = _weigh(k, self.solo[rows] - fixed, makespan - fixed, memory_used)
        return np.where(open_, self.marginal[rows] + self.row_sizes[rows, None] * fixed * w, np.inf)

    def weigh(self, makespan: float) -> dict[int, int]:
        """Charge each size's fixed costs by the weighting (`_weigh`; 0: token shares) under
        which the work at `makespan` is largest, the other sizes' as they stand, size after size,
        again while one changes (at most `knobs.BOUND_WEIGH_PASSES` passes), only where it raises
        the work. Returns the sizes that took one, and which; each weighting is valid at every M."""
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
    """Weighting k of `_WEIGHTINGS`: fixed-cost weights per (row, sample) summing to at most 1
    over any micro-batch in a plan of busy time M (docs/design.md, Why each bound holds). 1: x,
    the marginal time `var_s` as a share of `room_s` (M less the fixed time); 2: 1 where x > 1/2;
    3: 1 where the memory share `memory_used` (read by 3 only) is over 1/2."""
    if k == 3:
        assert memory_used is not None
        return np.where(memory_used > 0.5, 1.0, 0.0)
    x = np.minimum(np.divide(var_s, room_s, out=np.ones_like(var_s), where=room_s > 0), 1.0)
    return x if k == 1 else np.where(x > 0.5, 1.0, 0.0)
