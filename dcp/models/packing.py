"""Where the samples of a packed (varlen) micro-batch begin and end, and which part a rank holds.

A micro-batch is one packed token sequence: sample after sample, then (under sequence
parallelism of size p) pad tokens up to a multiple of p. The pads form one extra segment of their
own, so they attend only to each other: no real token ever sees a pad, and no pad row is left
without keys (which would give NaN). Each rank of an SP group holds one contiguous shard of
the padded sequence; after Ulysses' all-to-all every rank sees the whole sequence for its heads.

Under hybrid Ulysses x ring parallelism (p = u x c, `ring` = c > 1) the padded sequence (a
multiple of 2p) is cut into 2c equal chunks and ring rank j holds chunks j and 2c-1-j (zigzag,
Liu et al., arXiv 2310.01889; the causal work of every ring step is then equal); the u ranks of
ring rank j split that pair of chunks contiguously. Read in *ring order* (the ring ranks' chunk
pairs one after another), every rank's shard is again contiguous: `start` and `end` index ring
order, and `order()` maps it back to positions in the packed sequence.
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
    ring: int = 1
    """Ring degree c of the SP group (1: plain contiguous shards); `start` and `end` index ring order."""
    device: torch.device = field(default=torch.device("cpu"), compare=False)
    _cache: dict[str, torch.Tensor] = field(default_factory=dict, init=False, repr=False, compare=False)
    """Per-token tensors, built once per micro-batch rather than in every layer (not copied by
    dataclasses.replace: init=False)."""

    @classmethod
    def pack(cls, lengths: Sequence[int], frames: Sequence[int] | None = None, sp_size: int = 1,
             sp_rank: int = 0, cond_lengths: Sequence[int] | None = None,
             device: torch.device | str = "cpu", ring: int = 1) -> PackedSeqs:
        """Layout for samples of `lengths` tokens packed in order, padded to a multiple of sp_size
        (of 2 sp_size under a ring of `ring` > 1 ranks, whose 2 `ring` chunks each split over the
        sp_size / ring Ulysses ranks)."""
        lengths = [int(n) for n in lengths]
        frames = [1] * len(lengths) if frames is None else [int(f) for f in frames]
        if not lengths or min(lengths) <= 0:
            raise ValueError(f"packed samples need positive lengths, got {lengths}")
        for n, f in zip(lengths, frames, strict=True):
            if f <= 0 or n % f:
                raise ValueError(f"a sample of {n} tokens cannot be {f} equal frames")
        if not 0 <= sp_rank < sp_size:
            raise ValueError(f"SP rank {sp_rank} outside a group of {sp_size}")
        if ring < 1 or sp_size % ring:
            raise ValueError(f"ring degree {ring} does not divide the SP size {sp_size}")
        total = sum(lengths)
        num_pad = -total % (sp_size * (2 if ring > 1 else 1))
        if num_pad:
            lengths, frames = lengths + [num_pad], frames + [1]
        shard = (total + num_pad) // sp_size
        cond = None if cond_lengths is None else tuple(int(c) for c in cond_lengths)
        return cls(tuple(lengths), tuple(frames), num_pad, sp_rank * shard, (sp_rank + 1) * shard,
                   cond, ring, torch.device(device))

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

    # -- ring order ----------------------------------------------------------------------------
    def order(self, device: torch.device | None = None) -> torch.Tensor | None:
        """Position in the packed sequence of each token in ring order (None without a ring):
        ring rank j's chunks j and 2c-1-j, for j = 0..c-1 (on `device`, default the layout's)."""
        if self.ring == 1:
            return None
        device = torch.device(device or self.device)
        key = f"order@{device}"
        if key not in self._cache:
            chunk = self.total // (2 * self.ring)
            chunks = [a for j in range(self.ring) for a in (j, 2 * self.ring - 1 - j)]
            self._cache[key] = torch.cat([torch.arange(a * chunk, (a + 1) * chunk, device=device) for a in chunks])
        return self._cache[key]

    def take(self, x: torch.Tensor) -> torch.Tensor:
        """The rows of `x` (a tensor over the whole packed sequence, first dimension) that this
        rank's shard holds, in shard order."""
        if self.ring == 1:
            return x[self.start:self.end]
        order = self.order(x.device)
        assert order is not None
        return x[order[self.start:self.end]]

    def ring_view(self) -> PackedSeqs:
        """The same layout seen by the shard of this rank's ring rank: what a rank holds after the
        Ulysses all-to-all among its u ranks (the whole sequence without a ring, as `full`)."""
        if self.ring == 1:
            return self.full()
        shard = self.total // self.ring
        j = self.start // shard
        return PackedSeqs(self.lengths, self.frames, self.num_pad, j * shard, (j + 1) * shard, self.cond_lengths,
                          self.ring, self.device)

    # -- per-token tensors of the local shard ----------------------------------------------------
    def positions_full(self) -> torch.Tensor:
        """Position of every token of the packed sequence inside its sample."""
        if "positions_full" not in self._cache:
            starts = torch.tensor(self.offsets()[:-1], device=self.device)
            self._cache["positions_full"] = torch.arange(self.total, device=self.device) - starts[self.segment_ids_full()]
        return self._cache["positions_full"]

    def positions(self) -> torch.Tensor:
        """Position of every local token inside its sample (RoPE needs the global position)."""
        if "positions" not in self._cache:
            self._cache["positions"] = self.take(self.positions_full())
        return self._cache["positions"]

    def segment_ids(self) -> torch.Tensor:
        """Segment index of every local token."""
        if "segments_local" not in self._cache:
            self._cache["segments_local"] = self.take(self.segment_ids_full())
        return self._cache["segments_local"]

    def segment_ids_full(self) -> torch.Tensor:
        """Segment index of every token of the full sequence."""
        if "segments" not in self._cache:
            counts = torch.tensor(self.lengths, device=self.device)
            ids = torch.arange(len(self.lengths), device=self.device)
            self._cache["segments"] = torch.repeat_interleave(ids, counts)
        return self._cache["segments"]

    def valid(self) -> torch.Tensor:
        """True for the local tokens that are real, False for pads."""
        return self.take(torch.arange(self.total, device=self.device)) < self.total - self.num_pad

    def cu_seqlens(self) -> torch.Tensor:
        """int32 segment boundaries of the full sequence (flash-attn's varlen convention)."""
        return torch.tensor(self.offsets(), dtype=torch.int32, device=self.device)

    def full(self) -> PackedSeqs:
        """The same layout seen as one shard holding the whole sequence, in its own order (after
        the all-to-all of Ulysses without a ring)."""
        return PackedSeqs(self.lengths, self.frames, self.num_pad, 0, self.total, self.cond_lengths,
                          device=self.device)
