"""Where the samples of a packed (varlen) micro-batch begin and end, and which part a rank holds.

A micro-batch is one packed token sequence: sample after sample, then (under sequence
parallelism of size p) pad tokens up to a multiple of p. The pads form one extra segment of their
own, so they attend only to each other: no real token ever sees a pad, and no pad row is left
without keys (which would give NaN). Each rank of an SP group holds one contiguous shard of
the padded sequence; after Ulysses' all-to-all every rank sees the whole sequence for its heads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class PackedSeqs:
    """Segment layout of one packed micro-batch and the shard [start, end) a rank holds.

    Build with `PackedSeqs.pack(lengths, frames, sp_size, sp_rank)`."""

    lengths: tuple[int, ...]
    """Tokens per segment in the full padded sequence; the last one is the pad segment if num_pad > 0."""
    frames: tuple[int, ...]
    """Frames per segment (1 for text); a segment is frames x (length / frames) tokens, frame-major."""
    num_pad: int
    """Pad tokens at the end (the last segment when > 0)."""
    start: int
    """First token of this rank's shard in the full sequence."""
    end: int
    """One past the last token of this rank's shard."""
    cond_lengths: tuple[int, ...] | None = None
    """Conditioning tokens per real sample (cross-attention), None without conditioning."""
    device: torch.device = field(default=torch.device("cpu"), compare=False)
    _cache: dict[str, torch.Tensor] = field(default_factory=dict, init=False, repr=False, compare=False)
    """Per-token tensors, built once per micro-batch rather than in every layer (not copied by
    dataclasses.replace: init=False)."""

    @classmethod
    def pack(cls, lengths: Sequence[int], frames: Sequence[int] | None = None, sp_size: int = 1,
             sp_rank: int = 0, cond_lengths: Sequence[int] | None = None,
             device: torch.device | str = "cpu") -> PackedSeqs:
        """Layout for samples of `lengths` tokens packed in order, padded to a multiple of sp_size."""
        lengths = [int(n) for n in lengths]
        frames = [1] * len(lengths) if frames is None else [int(f) for f in frames]
        if not lengths or min(lengths) <= 0:
            raise ValueError(f"packed samples need positive lengths, got {lengths}")
        for n, f in zip(lengths, frames, strict=True):
            if f <= 0 or n % f:
                raise ValueError(f"a sample of {n} tokens cannot be {f} equal frames")
        if not 0 <= sp_rank < sp_size:
            raise ValueError(f"SP rank {sp_rank} outside a group of {sp_size}")
        total = sum(lengths)
        num_pad = -total % sp_size
        if num_pad:
            lengths, frames = lengths + [num_pad], frames + [1]
        shard = (total + num_pad) // sp_size
        cond = None if cond_lengths is None else tuple(int(c) for c in cond_lengths)
        return cls(tuple(lengths), tuple(frames), num_pad, sp_rank * shard, (sp_rank + 1) * shard,
                   cond, torch.device(device))

    # -- sizes ---------------------------------------------------------------------------------
    @property
    def total(self) -> int:
        """Tokens of the full padded sequence (all shards)."""
        return sum(self.lengths)

    @property
    def local(self) -> int:
        """Tokens of this rank's shard."""
        return self.end - self.start

    @property
    def num_real(self) -> int:
        """Real (non-pad) segments, i.e. samples."""
        return len(self.lengths) - (1 if self.num_pad else 0)

    def offsets(self) -> list[int]:
        """Start of each segment in the full sequence, plus the total at the end."""
        out = [0]
        for n in self.lengths:
            out.append(out[-1] + n)
        return out

    # -- per-token tensors of the local shard ----------------------------------------------------
    def positions(self) -> torch.Tensor:
        """Position of every local token inside its sample (RoPE needs the global position)."""
        if "positions" not in self._cache:
            starts = torch.tensor(self.offsets()[:-1], device=self.device)
            full = torch.arange(self.total, device=self.device) - starts[self.segment_ids_full()]
            self._cache["positions"] = full[self.start:self.end]
        return self._cache["positions"]

    def segment_ids_full(self) -> torch.Tensor:
        """Segment index of every token of the full sequence."""
        if "segments" not in self._cache:
            counts = torch.tensor(self.lengths, device=self.device)
            ids = torch.arange(len(self.lengths), device=self.device)
            self._cache["segments"] = torch.repeat_interleave(ids, counts)
        return self._cache["segments"]

    def valid(self) -> torch.Tensor:
        """True for the local tokens that are real, False for pads."""
        return torch.arange(self.start, self.end, device=self.device) < self.total - self.num_pad

    def cu_seqlens(self) -> torch.Tensor:
        """int32 segment boundaries of the full sequence (flash-attn's varlen convention)."""
        return torch.tensor(self.offsets(), dtype=torch.int32, device=self.device)

    def full(self) -> PackedSeqs:
        """The same layout seen as one shard holding the whole sequence (after the all-to-all)."""
        return PackedSeqs(self.lengths, self.frames, self.num_pad, 0, self.total, self.cond_lengths,
                          self.device)
