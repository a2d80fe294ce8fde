"""The per-token elementwise traffic (dcp.costmodel.elementwise) against a second instrument: the
bytes every aten op of dcp.models' Llama layer reads and writes, counted under a torch dispatch
mode on a CPU, matmuls and the attention kernel left out (the cost model prices them apart).
Per token: the difference of two token counts, so the per-tensor weight work (autocast's weight
casts, fixed per micro-batch) drops out."""

from __future__ import annotations

import functools
from collections import defaultdict

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from dcp.costmodel import ModelSpec, get_recipe
from dcp.costmodel.elementwise import elementwise_bytes, loss_bytes_per_token
from dcp.models.layers import apply_rope  # noqa: F401  (the layer's RoPE is what is counted)
from dcp.models.llama import LlamaLayer
from dcp.models.losses import lm_loss
from dcp.models.packing import PackedSeqs

NOT_ELEMENTWISE = {"mm", "addmm", "bmm"}
"""Matmuls: priced by FLOPs."""
VIEWS = {"t", "view", "_unsafe_view", "transpose", "unsqueeze", "expand", "slice", "split", "split_with_sizes",
         "detach", "alias", "select", "permute", "squeeze", "as_strided", "_reshape_alias", "reshape", "unbind"}
"""Ops that return a view of their input: no bytes move."""
GATHERS = {"nll_loss_forward", "nll_loss_backward"}


class ByteCount(TorchDispatchMode):
    """Bytes of every input and output tensor of every op that moves memory, by op."""

    def __init__(self) -> None:
        super().__init__()
        self.paused = False
        self.bytes: dict[str, float] = defaultdict(float)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        name = func.__name__.split(".")[0]
        if self.paused or name in NOT_ELEMENTWISE or name in VIEWS:
            return out
        # nll_loss gathers (forward) or scatters (backward) one value per row: it does not stream
        # the [T, V] tensor it is handed, only what it writes.
        moved = out if name in GATHERS else (args, kwargs, out)
        tensors = [t for t in tree_leaves(moved) if isinstance(t, torch.Tensor)]
        self.bytes[name] += sum(t.numel() * t.element_size() for t in tensors)
        return out


def _opaque_attention(mode: ByteCount):  # noqa: ANN202
    """An attention stand-in whose forward and backward the count does not see (the cost model
    prices the kernel by its pairs)."""

    class Opaque(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):  # noqa: ANN001, ANN205
            mode.paused = True
            ctx.shapes = (k.shape, v.shape)
            out = torch.zeros_like(q)
            mode.paused = False
            return out

        @staticmethod
        def backward(ctx, grad):  # noqa: ANN001, ANN205
            mode.paused = True
            grads = torch.zeros_like(grad), grad.new_zeros(ctx.shapes[0]), grad.new_zeros(ctx.shapes[1])
            mode.paused = False
            return grads

    return lambda q, k, v, seqs, kind: Opaque.apply(q, k, v)


def _count(spec: ModelSpec, recipe: str, tokens: int) -> tuple[float, float]:
    """(forward, backward) bytes one layer's elementwise ops move on `tokens` tokens: dcp.models'
    Llama layer, or `_GptBlock` for a model with LayerNorm and learned positions."""
    autocast = recipe == "autocast-bf16"
    dtype = torch.float32 if autocast or recipe == "fp32" else torch.bfloat16
    torch.manual_seed(0)
    mode = ByteCount()
    if spec.positions == "rope":
        layer = LlamaLayer(spec).to(dtype)
        layer.attn.attn_fn = _opaque_attention(mode)
        seqs = PackedSeqs.pack([tokens])
        seqs.positions()  # the micro-batch's positions, computed once for all its layers
        run = functools.partial(layer, seqs=seqs)
    else:
        run = _GptBlock(spec).to(dtype)
        run.attn_fn = _opaque_attention(mode)
    x = torch.randn(tokens, spec.hidden, dtype=dtype, requires_grad=True)
    grad = torch.randn(tokens, spec.hidden, dtype=dtype)
    with mode:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y = run(x)
        fwd = sum(mode.bytes.values())
        mode.bytes.clear()
        y.backward(grad)
        bwd = sum(mode.bytes.values())
    return fwd, bwd


@pytest.mark.parametrize("recipe", ["bf16", "autocast-bf16", "fp32"])
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_eager_count_is_what_the_layer_moves(recipe: str, kv_heads: int) -> None:
    spec = ModelSpec(name="t", num_layers=1, hidden=64, heads=4, kv_heads=kv_heads, ffn_hidden=176)
    (f1, b1), (f2, b2) = _count(spec, recipe, 64), _count(spec, recipe, 192)
    per_token = ((f2 - f1) / 128, (b2 - b1) / 128)
    derived = elementwise_bytes(spec, get_recipe(recipe), "eager")
    assert derived.fwd == pytest.approx(per_token[0], rel=1e-9)
    assert derived.bwd == pytest.approx(per_token[1], rel=1e-9)


def test_compiled_moves_less_than_eager_and_bf16_less_than_autocast() -> None:
    spec = ModelSpec(name="t", num_layers=1, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336)
    for recipe in ("bf16", "autocast-bf16"):
        eager, compiled = (elementwise_bytes(spec, get_recipe(recipe), k) for k in ("eager", "compiled"))
        assert compiled.fwd < eager.fwd / 2 and compiled.bwd < eager.bwd / 2
    bf16, ac = (elementwise_bytes(spec, get_recipe(r), "eager") for r in ("bf16", "autocast-bf16"))
    assert bf16.fwd < ac.fwd and bf16.bwd < ac.bwd


def test_compiled_forward_by_hand() -> None:
    """bf16, h = 8, q = k = 8, f = 16 (SwiGLU): two fused add+norm kernels of (2*2 + 2*2) h = 64
    bytes, RoPE 2*2*(8 + 8) = 64 and 16 bytes of positions, silu*up 3*2*16 = 96: 304 bytes."""
    spec = ModelSpec(name="t", num_layers=1, hidden=8, heads=2, kv_heads=2, ffn_hidden=16)
    assert elementwise_bytes(spec, get_recipe("bf16"), "compiled").fwd == 304


@pytest.mark.parametrize("recipe", ["bf16", "fp32"])
def test_loss_count_is_what_cross_entropy_moves(recipe: str) -> None:
    """The loss's upcast, log-softmax and their backward over [T, V] logits, counted the same way."""
    spec = ModelSpec(name="t", num_layers=1, hidden=8, heads=2, kv_heads=2, ffn_hidden=16, vocab=96)
    dtype = torch.bfloat16 if recipe == "bf16" else torch.float32
    counts = []
    for tokens in (32, 96):
        logits = torch.randn(tokens, spec.vocab, dtype=dtype, requires_grad=True)
        labels = torch.randint(0, spec.vocab, (tokens,))
        mode = ByteCount()
        with mode:
            loss, _ = lm_loss(logits, labels)
            loss.backward()
        counts.append(sum(b for name, b in mode.bytes.items() if name not in ("ones_like", "sum", "ne")))
    per_token = (counts[1] - counts[0]) / 64
    assert loss_bytes_per_token(spec, get_recipe(recipe)) == pytest.approx(per_token, rel=0.02)


class _GptBlock(torch.nn.Module):
    """A pre-norm GELU block with learned positions (none in the block), as MPT and GPT-2 run it:
    torch's LayerNorm or MPT's low-precision one, q/k/v from one projection or three."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h, f = spec.hidden, spec.ffn_hidden
        self.lowp = spec.norm == "layernorm-lowp"
        self.norm_1, self.norm_2 = torch.nn.LayerNorm(h), torch.nn.LayerNorm(h)
        b = spec.biases
        self.qkv = torch.nn.ModuleList([torch.nn.Linear(h, 3 * h, bias=b)] if spec.fused_qkv else
                                       [torch.nn.Linear(h, h, bias=b) for _ in range(3)])
        self.out, self.up, self.down = (torch.nn.Linear(h, h, bias=b), torch.nn.Linear(h, f, bias=b),
                                        torch.nn.Linear(f, h, bias=b))
        self.attn_fn = None

    def _norm(self, norm: torch.nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
        if not self.lowp or not torch.is_autocast_enabled("cpu"):
            return norm(x)
        # MPT's low_precision_layernorm: input and parameters cast to autocast's dtype, then the
        # kernel with autocast off.
        dt = torch.get_autocast_dtype("cpu")
        with torch.autocast("cpu", enabled=False):
            return torch.nn.functional.layer_norm(x.to(dt), norm.normalized_shape, norm.weight.to(dt),
                                                  norm.bias.to(dt), norm.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self._norm(self.norm_1, x)
        q, k, v = self.qkv[0](a).chunk(3, dim=-1) if len(self.qkv) == 1 else (p(a) for p in self.qkv)
        x = x + self.out(self.attn_fn(q, k, v, None, None))
        return x + self.down(torch.nn.functional.gelu(self.up(self._norm(self.norm_2, x))))


@pytest.mark.parametrize("recipe", ["bf16", "autocast-bf16", "fp32"])
@pytest.mark.parametrize("norm", ["layernorm", "layernorm-lowp"])
@pytest.mark.parametrize(("fused_qkv", "biases"), [(True, True), (False, False)])
def test_eager_count_of_a_layernorm_gelu_block(recipe: str, norm: str, fused_qkv: bool, biases: bool) -> None:
    """MPT's and GPT-2's layer structure (LayerNorm, learned positions, GELU, fused q/k/v)
    against the bytes its ops move, counted the same way."""
    spec = ModelSpec(name="t", num_layers=1, hidden=64, heads=4, kv_heads=4, ffn_hidden=256, mlp="gelu",
                     norm=norm, positions="learned", fused_qkv=fused_qkv, biases=biases)
    (f1, b1), (f2, b2) = _count(spec, recipe, 64), _count(spec, recipe, 192)
    derived = elementwise_bytes(spec, get_recipe(recipe), "eager")
    assert derived.fwd == pytest.approx((f2 - f1) / 128, rel=1e-9)
    assert derived.bwd == pytest.approx((b2 - b1) / 128, rel=1e-9)
