"""Attention kernel speed against sequence length, kept linear in tokens and pairs.

A fused attention kernel (FlashAttention-2/3, cuDNN, torch's varlen kernel) over T tokens in
samples with A query-key pairs in all is priced

    seconds = (A + kappa * T) * flops_per_pair / rate

`rate` is its long-sequence FLOP/s and kappa a short-sequence cost per token (loading q, writing
the output, the softmax rescaling, tile edges), in pairs. One causal sample of L tokens has about
L^2/2 pairs, so its achieved rate is rate * L / (L + 2 kappa): the fall-off below ~2K tokens that
the FlashAttention-3 paper (arXiv 2407.08608, Figs. 5-6) measures, while the planner's model stays
linear in (T, A). Rates follow FlashAttention's FLOP count: forward 4 h FLOPs per pair, causal
counted as half of full, backward 2.5x the forward.

Pure Python: the profiler fits measurements with it, the benchmarks check presets against the
published curves with it.
"""

from __future__ import annotations

from collections.abc import Sequence

from dcp.costmodel.spec import CostModelError


def _pairs_per_sample(length: int, causal: bool) -> float:
    """Pairs the cost model counts (`attention_pairs`) and FLOPs FlashAttention counts, per L^2."""
    return length * (length + 1) / 2 if causal else float(length * length)


def achieved_flops(length: int, causal: bool, rate: float, pairs_per_token: float) -> float:
    """FLOP/s (FlashAttention's count) the model predicts for samples of `length` tokens."""
    counted = length * length / (2 if causal else 1)
    return rate * counted / (_pairs_per_sample(length, causal) + pairs_per_token * length)


def fit_attention_rate(points: Sequence[tuple[int, bool, float]]) -> tuple[float, float]:
    """(rate, pairs_per_token) from (length, causal, achieved FLOP/s) points, least squares in
    relative error, pairs_per_token >= 0. Needs two lengths at least."""
    if len({(n, c) for n, c, _ in points}) < 2:
        raise CostModelError("an attention fit needs points at two sequence lengths at least")
    rows = []
    for length, causal, achieved in points:
        counted = length * length / (2 if causal else 1)
        # 1 / achieved = (pairs / counted) / rate + (length / counted) * kappa / rate: linear in
        # (1/rate, kappa/rate); weighting each row by `achieved` makes the error relative.
        rows.append((_pairs_per_sample(length, causal) / counted * achieved, length / counted * achieved))
    s11 = sum(a * a for a, _ in rows)
    s12 = sum(a * b for a, b in rows)
    s22 = sum(b * b for _, b in rows)
    s1 = sum(a for a, _ in rows)
    s2 = sum(b for _, b in rows)
    det = s11 * s22 - s12 * s12
    if det > 0:
        inv_rate = (s22 * s1 - s12 * s2) / det
        slope = (s11 * s2 - s12 * s1) / det
        if inv_rate > 0 and slope >= 0:
            return 1.0 / inv_rate, slope / inv_rate
    return s11 / s1, 0.0  # no short-sequence term: the least-squares rate alone
