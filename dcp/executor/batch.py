"""Packing one micro-batch's samples into the shard a rank runs.

Per-token tensors (first dimension = the sample's tokens) are concatenated in plan order, padded
to a multiple of the SP size and cut to the rank's shard (contiguous, or its zigzag chunks under a
ring: `PackedSeqs.take`). Per-sample tensors (e.g.
STDiT's caption tokens, `cond`) are concatenated whole on every rank of the group: they are
short, and every query shard needs its sample's full conditioning.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from dcp.models.packing import PackedSeqs
from dcp.planner.sample import Sample

SampleTensors = Mapping[str, torch.Tensor]


@dataclass
class PackedBatch:
    """A rank's shard of one micro-batch: tensors by name, and the layout (`seqs`)."""

    tensors: dict[str, torch.Tensor]
    seqs: PackedSeqs

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.tensors[key]

    def __contains__(self, key: str) -> bool:
        return key in self.tensors

    @property
    def valid(self) -> torch.Tensor:
        """True for the shard's real tokens, False for pads."""
        return self.seqs.valid()


def check_sample_tensors(ids: Sequence[int], specs: Mapping[int, Sample], samples: Mapping[int, SampleTensors],
                         per_sample_keys: Sequence[str]) -> str | None:
    """A message naming the first sample that is missing or malformed, or None if all are fine."""
    for i in ids:
        if i not in samples:
            return f"sample {i} is in the plan but missing from `samples`"
        if not samples[i]:
            return f"sample {i} has no tensors"
        for key, t in samples[i].items():
            if key not in per_sample_keys and t.shape[0] != specs[i].tokens:
                return (f"sample {i}: tensor {key!r} has {t.shape[0]} rows but the plan says the sample "
                        f"has {specs[i].tokens} tokens")
    return None


def pack_microbatch(ids: Sequence[int], specs: Mapping[int, Sample], samples: Mapping[int, SampleTensors], *,
                    sp_size: int, sp_rank: int, device: torch.device,
                    per_sample_keys: Sequence[str] = ("cond",),
                    pad_values: Mapping[str, float] | None = None, ring: int = 1) -> PackedBatch:
    """This rank's shard of the micro-batch `ids` (plan order) for an SP group of `sp_size`
    (of which `ring` is the ring degree)."""
    pad_values = pad_values or {}
    first = samples[ids[0]]
    cond_key = next((k for k in per_sample_keys if k in first), None)
    seqs = PackedSeqs.pack(
        [specs[i].tokens for i in ids], [specs[i].frames for i in ids], sp_size, sp_rank,
        cond_lengths=None if cond_key is None else [samples[i][cond_key].shape[0] for i in ids],
        device=device, ring=ring)
    tensors = {}
    for key in first:
        parts = [samples[i][key] for i in ids]
        if key in per_sample_keys:
            tensors[key] = torch.cat(parts).to(device)
            continue
        if seqs.num_pad:
            pad = parts[0].new_full((seqs.num_pad, *parts[0].shape[1:]), pad_values.get(key, 0))
            parts.append(pad)
        # Only the shard's rows are copied to the device.
        tensors[key] = seqs.take(torch.cat(parts)).to(device, non_blocking=True)
    return PackedBatch(tensors, seqs)


SampleTemplate = tuple[tuple[str, torch.dtype, tuple[int, ...]], ...]
"""(name, dtype, shape past the first dimension) of each tensor of a sample."""


def sample_template(samples: Mapping[int, SampleTensors]) -> SampleTemplate | None:
    """The tensor names, dtypes and trailing shapes of a sample (any one: they all share them)."""
    for tensors in samples.values():
        return tuple((k, t.dtype, tuple(t.shape[1:])) for k, t in tensors.items())
    return None


def one_token_sample(template: SampleTemplate, pad_values: Mapping[str, float]) -> dict[str, torch.Tensor]:
    """A sample of one token (and one row of each per-sample tensor) filled with each tensor's pad
    value: the input of an empty pass, whose loss the executor multiplies by zero."""
    return {k: torch.full((1, *shape), pad_values.get(k, 0), dtype=dtype) for k, dtype, shape in template}
