"""Communication of the executor: Ulysses all-to-alls (differentiable), gradient all-reduce,
parameter broadcast. Kept apart from the logic that decides when to call them."""

from __future__ import annotations

from collections.abc import Callable, Sequence

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


class GradBuffer:
    """One flat buffer for every parameter's gradient, in the precision recipe's gradient dtype,
    plus two scalars (loss sum, loss-token count), reduced by the step's one SUM all-reduce.

    Allocated once and zeroed in place every step. A parameter held in the buffer's dtype gets
    `.grad` as a view into it before backward (as DDP's gradient_as_bucket_view): autograd
    accumulates in place and nothing is copied. A parameter in another dtype (bf16 under the bf16
    recipe, whose gradients accumulate in fp32) adds each backward's gradient into its slice of
    the buffer and drops it (a post-accumulate-grad hook), as Megatron-LM's main_grad does."""

    def __init__(self, params: Sequence[torch.nn.Parameter], device: torch.device,
                 dtype: torch.dtype = torch.float32) -> None:
        self.params = list(params)
        self.dtype = dtype
        self.sizes = [p.numel() for p in self.params]
        self.numel = sum(self.sizes)
        self.device = device
        self.flat: torch.Tensor | None = None
        self.views: list[torch.Tensor] = []
        self.as_views = [p.dtype == dtype for p in self.params]
        self.param_grads = True
        """After reduce, give parameters held in another dtype a `.grad` in their own dtype (a
        copy); an optimizer that reads the buffer itself (dcp.executor.optim) turns it off."""
        self._hooks = [p.register_post_accumulate_grad_hook(self._accumulate(i))
                       for i, (p, v) in enumerate(zip(self.params, self.as_views, strict=True)) if not v]

    def _accumulate(self, i: int) -> Callable[[torch.Tensor], None]:
        def hook(param: torch.Tensor) -> None:
            self.views[i].add_(param.grad)
            param.grad = None
        return hook

    def attach(self) -> None:
        """Zero the gradients for a new step (views into the buffer where the dtype allows)."""
        if self.flat is None:
            self.flat = torch.zeros(self.numel + 2, dtype=self.dtype, device=self.device)
            self.views = self._views()
        else:
            self.flat.zero_()
        for p, view, as_view in zip(self.params, self.views, self.as_views, strict=True):
            p.grad = view if as_view else None

    def _views(self) -> list[torch.Tensor]:
        assert self.flat is not None
        out, offset = [], 0
        for p, n in zip(self.params, self.sizes, strict=True):
            out.append(self.flat[offset:offset + n].view_as(p))
            offset += n
        return out

    @property
    def grads(self) -> torch.Tensor:
        """The flat gradients (without the two scalars), after `reduce` reduced and normalized."""
        assert self.flat is not None, "attach() before backward"
        return self.flat[:-2]

    def reduce(self, loss_sum: torch.Tensor, loss_tokens: torch.Tensor) -> tuple[float, float]:
        """All-reduce gradients, loss sum and count; divide gradients by the global count.

        Ranks back-propagated un-normalized loss sums: dividing the reduced sum by the global
        loss-token count afterwards equals normalizing each rank's loss by it beforehand, without
        a collective before the first backward."""
        assert self.flat is not None, "attach() before backward"
        views = self.views
        for p, view, as_view in zip(self.params, views, self.as_views, strict=True):
            # A view parameter whose .grad was replaced (or set to None) by someone else: copy it in.
            if as_view and p.grad is not view:
                if p.grad is None:
                    view.zero_()
                else:
                    view.copy_(p.grad)
        self.flat[-2] = loss_sum
        self.flat[-1] = loss_tokens
        if dist.get_world_size() > 1:
            dist.all_reduce(self.flat, op=dist.ReduceOp.SUM)
        total_loss, total_tokens = self.flat[-2].item(), self.flat[-1].item()
        if total_tokens <= 0:
            raise ValueError("the global batch has no loss tokens: nothing to normalize the gradient by")
        self.flat[:-2].div_(total_tokens)
        for p, view, as_view in zip(self.params, views, self.as_views, strict=True):
            if as_view:
                p.grad = view
            elif self.param_grads:
                p.grad = view.to(p.dtype)
        return total_loss, total_tokens


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
