"""The executor's parameter units: flat buffers, one per transformer layer and one for the rest.

Unit l holds the trainable parameters of layer l (those no other layer shares); the root, last,
holds every other trainable parameter (embeddings, final norm, LM head, anything shared). Each
unit is one flat buffer padded to a multiple of the world size N, so rank r owns the chunk
[r*c, (r+1)*c) of it, c = s/N: the layout `dcp.costmodel.zero` prices. Parameters become views
of their unit's buffer, values unchanged.

At stage 3 a rank keeps only its chunk (`shard`); the unit's buffer (`full`) keeps its storage
object but is resized to zero bytes while the unit is not gathered, so the parameters, and the
tensors autograd saved of them, see the values again whenever it is gathered back (the storage
trick of torch FSDP: `untyped_storage().resize_`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class Unit:
    """One flat buffer of parameters, and where this rank's chunk of it lies."""

    def __init__(self, index: int, params: Sequence[nn.Parameter], world: int, rank: int,
                 device: torch.device) -> None:
        self.index = index
        self.params = list(params)
        self.sizes = [p.numel() for p in self.params]
        self.numel = sum(self.sizes)
        self.starts = [sum(self.sizes[:j]) for j in range(len(self.sizes))]
        self.chunk = -(-self.numel // world)
        """Elements of the unit each rank owns: c = ceil(n / N)."""
        self.padded = self.chunk * world
        self.lo, self.hi = rank * self.chunk, (rank + 1) * self.chunk
        dtype = self.params[0].dtype if self.params else torch.float32
        device = self.params[0].device if self.params else device
        self.full = torch.zeros(self.padded, dtype=dtype, device=device)
        """The whole unit (padded); at stage 3 only while gathered."""
        offset = 0
        with torch.no_grad():
            for p, n in zip(self.params, self.sizes, strict=True):
                self.full[offset:offset + n].copy_(p.reshape(-1))
                p.data = self.full[offset:offset + n].view_as(p)
                offset += n
        self.shard: torch.Tensor | None = None
        """Stage 3: this rank's chunk of the parameters, the only copy kept between uses."""
        self.full_bytes = self.full.untyped_storage().nbytes()

    def slices(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Views of a buffer laid out like this unit, one per parameter, shaped like it."""
        out, offset = [], 0
        for p, n in zip(self.params, self.sizes, strict=True):
            out.append(flat[offset:offset + n].view_as(p))
            offset += n
        return out

    def piece(self, flat: torch.Tensor, j: int) -> torch.Tensor:
        """Parameter j's part of a buffer laid out like this unit, flat."""
        return flat[self.starts[j]:self.starts[j] + self.sizes[j]]

    def own(self, flat: torch.Tensor) -> torch.Tensor:
        """This rank's chunk of a whole-unit buffer."""
        return flat[self.lo:self.hi]

    # -- stage 3: the parameters kept as a chunk, gathered into `full` only while used -------
    def keep_shard(self) -> None:
        """Keep only this rank's chunk (a copy) and release the whole buffer."""
        self.shard = self.own(self.full).clone()
        self.release()

    def allocate(self) -> None:
        """Give the whole buffer its storage back (its values are whatever the gather writes)."""
        storage = self.full.untyped_storage()
        if storage.nbytes() == 0:
            storage.resize_(self.full_bytes)

    def release(self) -> None:
        """Drop the whole buffer's storage; parameters are unusable until the next gather."""
        self.full.untyped_storage().resize_(0)

    @property
    def gathered(self) -> bool:
        return self.full.untyped_storage().nbytes() > 0


def build_units(model: nn.Module, layers: Sequence[nn.Module], world: int, rank: int,
                device: torch.device) -> list[Unit]:
    """The units of `model`: one per layer, in order, then the root. A parameter two layers share
    goes to the root, which is gathered for the whole micro-batch."""
    owner: dict[int, int] = {}
    for li, layer in enumerate(layers):
        for p in layer.parameters():
            if p.requires_grad:
                owner[id(p)] = li if owner.get(id(p), li) == li else -1
    trainable = [p for p in model.parameters() if p.requires_grad]
    elsewhere = sorted({str(p.device) for p in trainable if p.device != device})
    if elsewhere:
        raise ValueError(f"the model's parameters are on {', '.join(elsewhere)}, this rank's device is {device}: "
                         "move the model there first (the ZeRO schedule's buffers and collectives live on it)")
    known = {id(p) for p in trainable}
    outside = [li for li, layer in enumerate(layers) if any(id(p) not in known for p in layer.parameters()
                                                             if p.requires_grad)]
    if outside:
        raise ValueError(f"layer {outside[0]} has parameters that are not the model's: pass the model's own layers")
    per_layer = [[p for p in trainable if owner.get(id(p)) == li] for li in range(len(layers))]
    root = [p for p in trainable if owner.get(id(p), -1) == -1]
    return [Unit(i, ps, world, rank, device) for i, ps in enumerate([*per_layer, root])]
