"""Communication of the executor: Ulysses all-to-alls (differentiable), parameter broadcast.
Kept apart from the logic that decides when to call them (the ZeRO schedule's collectives are
in dcp.executor.sharding and dcp.executor.gathers)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist


def _all_to_all(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """all_to_all_single over dim 0: chunk j of x goes to group rank j; chunk j of the result came
    from group rank j."""
    # Both buffers contiguous: all_to_all_single splits memory, not a strided view (empty_like
    # would copy a transposed view's strides).
    x = x.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    dist.all_to_all_single(out, x, group=group)
    return out


def _seq_to_heads(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    p = dist.get_world_size(group)
    s, h, d = x.shape
    # [S/p, H, D] -> [p, S/p, H/p, D]: chunk j holds the heads rank j will own.
    send = x.view(s, p, h // p, d).transpose(0, 1)
    # Received chunk j is rank j's sequence shard of our heads: stacking them in rank order
    # rebuilds the whole sequence.
    return _all_to_all(send, group).reshape(p * s, h // p, d)


def _heads_to_seq(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    p = dist.get_world_size(group)
    s, h, d = x.shape
    # [S, H/p, D] -> [p, S/p, H/p, D]: chunk j is rank j's sequence shard of our heads.
    recv = _all_to_all(x.view(p, s // p, h, d), group)
    # Received chunk j holds head block j of our shard: put heads back in order.
    return recv.transpose(0, 1).reshape(s // p, p * h, d)


class SeqToHeads(torch.autograd.Function):
    """Sequence-sharded [S/p, H, D] -> head-sharded [S, H/p, D]; backward is the inverse."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:  # noqa: ANN001
        ctx.group = group
        return _seq_to_heads(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # noqa: ANN001
        return _heads_to_seq(grad, ctx.group), None


class HeadsToSeq(torch.autograd.Function):
    """Head-sharded [S, H/p, D] -> sequence-sharded [S/p, H, D]; backward is the inverse."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:  # noqa: ANN001
        ctx.group = group
        return _heads_to_seq(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # noqa: ANN001
        return _seq_to_heads(grad, ctx.group), None


def seq_to_heads(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    return SeqToHeads.apply(x, group)


def heads_to_seq(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    return HeadsToSeq.apply(x, group)


def broadcast_params(params: Sequence[torch.nn.Parameter], src: int = 0) -> None:
    """Make every rank's parameters equal to rank `src`'s (one flat broadcast)."""
    if dist.get_world_size() == 1 or not params:
        return
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    dist.broadcast(flat, src=src)
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
