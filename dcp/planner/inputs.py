"""What `solve` accepts, checked before any planning: one clear ValueError naming the culprit.

    batch = check_batch([512, 2048, 300], cost_model)   # token counts become Samples
    options = check_options("bucket-per-batch")          # a strategy name becomes its options

Never imports torch.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from operator import attrgetter
from typing import Any

import numpy as np

from dcp.costmodel import CostModel, attention_pairs
from dcp.planner.options import StrategyOptions, strategy_options
from dcp.planner.sample import Sample


def _whole(value: Any) -> bool:
    """An integer (Python or numpy), not a bool, not a float that happens to be whole."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _sample(item: Any, position: int, attention: str) -> Sample:
    if isinstance(item, Sample):
        return item
    if _whole(item):
        if attention == "spatial_temporal":
            raise ValueError(f"batch item {position} is a bare token count; a spatial_temporal model needs "
                             "Samples with their frames (dcp.planner.Sample(id, tokens, attn_pairs, frames))")
        tokens = int(item)
        if tokens < 1:
            raise ValueError(f"batch item {position}: {tokens} tokens; a sample needs at least 1")
        return Sample(position, tokens, attention_pairs(attention, tokens))
    raise ValueError(f"batch item {position} is a {type(item).__name__} ({item!r:.40}); expected a "
                     "dcp.planner.Sample or a token count")


def check_sample(s: Sample) -> None:
    """Raise ValueError if a sample cannot be planned: whole numbers, 1+ tokens in equal frames, and
    tokens <= pairs <= tokens * (tokens + 1): each token attends to itself at least, to its whole
    sample plus once more along its frame axis at most."""
    for name in ("id", "tokens", "attn_pairs", "frames"):
        value = getattr(s, name)
        if not _whole(value):
            raise ValueError(f"sample {s.id}: {name} {value!r} is not an integer")
    if s.tokens < 1:
        raise ValueError(f"sample {s.id}: {s.tokens} tokens; a sample needs at least 1")
    if s.frames < 1 or s.tokens % s.frames:
        raise ValueError(f"sample {s.id}: {s.tokens} tokens do not split into {s.frames} equal frames")
    most = s.tokens * (s.tokens + 1)
    if not s.tokens <= s.attn_pairs <= most:
        raise ValueError(f"sample {s.id}: attn_pairs {s.attn_pairs} is outside [tokens, tokens * (tokens + 1)] = "
                         f"[{s.tokens}, {most}] (dcp.costmodel.attention_pairs computes it)")


def check_batch(batch: Any, cost_model: CostModel) -> list[Sample]:
    """The batch as a list of valid Samples. Accepts Samples or token counts (a list or a 1-D
    numpy array; ids are then positions, attention pairs the model's); ids must be unique."""
    if isinstance(batch, (str, bytes)) or not isinstance(batch, Sequence) and not hasattr(batch, "__array__"):
        raise ValueError(f"batch must be a sequence of dcp.planner.Sample or token counts, got {type(batch).__name__}")
    items = list(batch.tolist() if hasattr(batch, "tolist") else batch)
    if not items:
        raise ValueError("cannot plan an empty batch")
    if all(type(item) is Sample for item in items):
        samples = items
    else:
        samples = [_sample(item, i, cost_model.model.attention) for i, item in enumerate(items)]
    if _all_valid(samples):
        return samples
    seen: set[int] = set()  # something is wrong: find the first culprit and name it
    for s in samples:
        check_sample(s)
        if s.id in seen:
            raise ValueError(f"batch lists sample {s.id} more than once")
        seen.add(s.id)
    return samples


_FIELDS = ("id", "tokens", "attn_pairs", "frames")
_FAST_MAX_TOKENS = 2**31
"""Below this, tokens * (tokens + 1) stays inside int64 (the array check's range)."""


def _all_valid(samples: list[Sample]) -> bool:
    """`check_sample` and unique ids as array operations (fast for the ILP's limit); False when a
    sample may break them (the per-sample checks then name it) or a field is not an int."""
    columns = {}
    for name in _FIELDS:
        values = list(map(attrgetter(name), samples))
        if set(map(type, values)) != {int}:
            return False
        try:
            columns[name] = np.fromiter(values, dtype=np.int64, count=len(values))
        except OverflowError:
            return False
    ids, tokens, pairs, frames = (columns[n] for n in _FIELDS)
    if not (tokens.min() >= 1 and frames.min() >= 1 and tokens.max() < _FAST_MAX_TOKENS):
        return False
    if (tokens % frames).any() or (pairs < tokens).any() or (pairs > tokens * (tokens + 1)).any():
        return False
    return len(np.unique(ids)) == len(ids)


def check_options(options: Any) -> StrategyOptions:
    """Strategy options from options or a strategy name (see `dcp.planner.STRATEGIES`)."""
    if isinstance(options, str):
        return strategy_options(options)
    if not isinstance(options, StrategyOptions):
        raise ValueError(f"options must be a strategy name or StrategyOptions, got {type(options).__name__}")
    return options
