"""Communication of ring attention: point-to-point exchange with the ring's neighbours.

A ring of c ranks (global ranks `peers`, in ring order) passes blocks one step forward: every rank
sends to the next and receives from the previous at once, asynchronously, so the transfer overlaps
the attention of the block it already holds (Liu et al., arXiv 2310.01889). The sends go over the
world process group by global rank: the ring of a u x c group is strided (every u-th rank of the
block) and so is none of the aligned blocks whose groups exist; `ParallelState.create` exchanges a
tiny tensor along every ring a plan can use, so connections are made at start, not mid-step.

Every rank of a ring issues the same exchanges in the same order (same layers, same checkpointing),
which is what matches sends with receives: gloo by (peer, tag), NCCL by order. Blocks of keys and
values and blocks of their gradients use different tags.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

KV_TAG = 17
"""Tag of key/value blocks."""
GRAD_TAG = 18
"""Tag of key/value gradient accumulators (backward)."""


@dataclass(frozen=True)
class RingPeers:
    """This rank's place in its ring."""

    peers: tuple[int, ...]
    """Global ranks of the ring, in ring order."""
    index: int
    """This rank's position in `peers`."""

    def __post_init__(self) -> None:
        if not 0 <= self.index < len(self.peers) or len(set(self.peers)) != len(self.peers):
            raise ValueError(f"ring position {self.index} in peers {self.peers} is not valid")

    @property
    def size(self) -> int:
        return len(self.peers)

    @property
    def next(self) -> int:
        return self.peers[(self.index + 1) % self.size]

    @property
    def prev(self) -> int:
        return self.peers[(self.index - 1) % self.size]

    def source(self, step: int) -> int:
        """Ring position whose block this rank holds after `step` steps forward."""
        return (self.index - step) % self.size


class Exchange:
    """One step forward around the ring: `send` goes to the next rank while a block of the same
    shape arrives from the previous one; `wait()` returns it."""

    def __init__(self, send: torch.Tensor, ring: RingPeers, tag: int) -> None:
        self.recv = torch.empty_like(send)
        self._send = send.contiguous()  # kept alive until the transfer completes
        ops = [dist.P2POp(dist.isend, self._send, ring.next, tag=tag),
               dist.P2POp(dist.irecv, self.recv, ring.prev, tag=tag)]
        self._works = dist.batch_isend_irecv(ops)

    def wait(self) -> torch.Tensor:
        for w in self._works:
            w.wait()
        self._works = []
        return self.recv


def ring_peers(start: int, ulysses: int, ring: int, sp_rank: int) -> RingPeers:
    """The ring of SP rank `sp_rank` in the group of `ulysses` x `ring` ranks starting at global rank
    `start`: Ulysses over consecutive ranks (a node's fast links), ring over every `ulysses`-th."""
    offset, index = sp_rank % ulysses, sp_rank // ulysses
    return RingPeers(tuple(start + offset + j * ulysses for j in range(ring)), index)


def warm_rings(world_size: int, rank: int, device: torch.device) -> int:
    """Exchange a tiny tensor along every ring any u x c layout of an aligned block can form (ring
    degree c >= 2, u = size / c), so that every pair of neighbours is connected before the first
    step. Every rank calls this with the same world; returns the number of exchanges made."""
    done, size = 0, 2
    while size <= world_size:
        start = rank // size * size
        ring = 2 if start + size <= world_size else size + 1  # a block past the world's end has no rings
        while ring <= size:
            peers = ring_peers(start, size // ring, ring, rank - start)
            Exchange(torch.ones(1, device=device), peers, KV_TAG).wait()
            done += 1
            ring *= 2
        size *= 2
    return done
