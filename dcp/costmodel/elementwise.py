"""Memory-bound work per token: the bytes one layer's elementwise ops read and write, and the
loss's vocabulary-sized upcast, counted op by op from dcp.models' layer.

Everything between two matmuls (or the attention kernel) is an elementwise op or a row
reduction: it streams its inputs and outputs through device memory once, so it costs its bytes
over the memory bandwidth, whatever its FLOPs. Per token and layer, with h the width, q and k
the query and key/value widths (heads x head dim), f the MLP width, D the head dim, s the bytes
of the residual stream (the parameters' dtype: 2 in bf16, 4 with fp32 parameters under
autocast) and c of the compute dtype:

eager (one kernel per op, as `dcp.models.LlamaLayer` runs them; `_eager_ops` lists each):
- RMSNorm, twice: upcast to fp32 (s<4), square, mean, x * rsqrt, downcast, x * weight:
  (8 + 4 + 8 + 2s)h, plus (s + 4)h twice when s < 4 (bf16: 36h);
- autocast's casts of the five projections' fp32 inputs (q, k, v, gate, up): (s + c)h each;
- RoPE on q and on k: a cos/sin table per call (16 + 34D bytes of fp32 angles, cos, sin and
  cat, and 2(4 + c)D to downcast it when c < 4) and x*cos + cat(-x2, x1)*sin on width w: 10cw + 2cD;
- two residual adds: (2s + c)h each; SwiGLU: silu and the gate product, 5cf (GELU: 2cf).
- backward: each op's autograd formula (norm: 96h whatever s; SwiGLU 9cf; RoPE 14cw + 2cD;
  the sums of the gradients where a tensor feeds several ops: the residual junctions, the
  q/k/v and gate/up inputs; autocast's casts back to fp32).

compiled (torch.compile / inductor, which fuses every chain of elementwise ops between two
matmuls into one kernel that reads its inputs and writes its outputs once):
- forward: residual add + the next RMSNorm as one kernel, twice a layer (reads the stream and
  the branch output, writes the new stream and the normed input in the compute dtype:
  (2s + 2c)h), RoPE on q and k (2c(q + k), the table computed in the kernel from positions),
  silu(gate) * up (3cf; GELU 2cf);
- backward: RMSNorm's backward with the junction's gradient sum (reads the branch gradients,
  the input and the residual gradient, writes the input's gradient) and its weight-gradient
  reduction (reads the branch gradients and the input again), RoPE's backward (2c(q + k)), the
  SwiGLU backward (reads the gradient, gate and up, writes two: 5cf; GELU 3cf).

`tests/test_elementwise.py` checks the eager count against the bytes every aten op of the
reference layer reads and writes under a torch dispatch mode (a second instrument).

The loss: logits [T, V] in the compute dtype, upcast to fp32 before cross-entropy
(`dcp.models.losses.lm_loss`): eager, upcast (c + 4)V, log-softmax 8V, and in backward the
nll gradient (4V written), log-softmax's backward (12V) and the downcast ((4 + c)V): (32 + 2c)V
per token; fused (one cross-entropy kernel, e.g. flash-attn's xentropy): read the logits forward,
read them and write their gradient backward, 3cV. torch.compile of the layers leaves the loss as
it is (torchtitan compiles per block), so this is its own switch (`TrainingSetup.loss`).

Never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dcp.costmodel.precision import PrecisionRecipe
from dcp.costmodel.spec import CostModelError, ModelSpec

Kernels = Literal["eager", "compiled"]
KERNELS: tuple[str, ...] = ("eager", "compiled")


@dataclass(frozen=True)
class ElementwiseBytes:
    """Bytes read plus written per token of one layer (all its blocks) by its elementwise ops."""

    fwd: float
    bwd: float


def _widths(spec: ModelSpec) -> tuple[int, int, int, int, int]:
    d = spec.head_dim
    return spec.hidden, spec.heads * d, spec.kv_heads * d, spec.ffn_hidden, d


def _stream_bytes(prec: PrecisionRecipe) -> int:
    return prec.param_bytes


def _norm_ops(spec: ModelSpec, s: int, c: int) -> tuple[list[tuple[str, float]], list[tuple[str, float]], int]:
    """(forward ops, backward ops, output bytes per element) of one eager norm of `spec.norm`
    over a stream of s-byte elements with c-byte compute."""
    h = spec.hidden
    if spec.norm == "rmsnorm":
        wide = max(4, s)
        up = (s + wide) * h if s < wide else 0.0  # x.float() / .to(x.dtype): a no-op when already wide
        fwd = [("norm upcast", up), ("norm square", 2 * wide * h), ("norm mean", wide * h + 4), ("norm eps", 8),
               ("norm rsqrt", 8), ("norm scale", 2 * wide * h + 4), ("norm downcast", up), ("norm weight", 2 * s * h)]
        bwd = [("norm weight grad", 4 * s * h), ("norm grad x weight", 2 * s * h), ("norm upcast", up),
               ("norm backward", 18 * wide * h + 36), ("norm downcast", up)]
        return fwd, bwd, s
    # One layer_norm op each way: the forward reads x, writes y and the mean and rstd; the
    # backward reads dy, x, mean and rstd and writes dx. It runs in w-byte elements:
    # fp32 under autocast (its fp32 list), the compute dtype for MPT's low-precision norm.
    w = c if spec.norm == "layernorm-lowp" else (4 if c != s else s)
    cast = (s + w) * h if w != s else 0.0
    fwd = [("norm input cast", cast), ("layer_norm", 2 * w * h + 2 * w)]
    bwd = [("layer_norm backward", 3 * w * h + 2 * w), ("norm input cast grad", cast)]
    return fwd, bwd, w


def _bias_grad_bytes(spec: ModelSpec, c: int) -> float:
    """Each projection bias's gradient sums its output's gradient (c-byte elements) over the
    tokens: one read of every projection's output width (q, k, v, out, the MLP's up and down)."""
    h, q, k, f, _ = _widths(spec)
    return c * (q + 2 * k + h + (2 if spec.mlp == "swiglu" else 1) * f + h)


def _eager_ops(spec: ModelSpec, prec: PrecisionRecipe) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """(name, bytes per token) of every elementwise op of one block's forward and backward, eager."""
    h, q, k, f, d = _widths(spec)
    s, c = _stream_bytes(prec), prec.compute_bytes
    norm, norm_b, o = _norm_ops(spec, s, c)
    casts = (o + c) * h if c != o else 0.0  # autocast casts the norm's output before each projection
    table = 16 + 34 * d + (2 * (4 + c) * d if c != 4 else 0)  # RoPE's cos/sin table, made in each call
    n_qkv, n_mlp = (1 if spec.fused_qkv else 3), (2 if spec.mlp == "swiglu" else 1)

    def rope(w: int) -> list[tuple[str, float]]:
        return [("rope table", table), ("rope apply", 10 * c * w + 2 * c * d)] if spec.positions == "rope" else []

    mlp = [("silu", 2 * c * f), ("gate product", 3 * c * f)] if spec.mlp == "swiglu" else [("gelu", 2 * c * f)]
    fwd = (norm + [("q/k/v input casts", n_qkv * casts)] + rope(q) + rope(k) + [("residual add", (2 * s + c) * h)]
           + norm + [("mlp input casts", n_mlp * casts)] + mlp + [("residual add", (2 * s + c) * h)])
    junction = 3 * s * h  # where the stream feeds the norm and the residual: their gradients summed

    def branch_sum(inputs: int) -> float:
        """Gradients of one normed input feeding `inputs` projections, summed (in the norm's
        output dtype after autocast's casts back, else in the compute dtype)."""
        if c != o:
            return inputs * (o + c) * h + (inputs - 1) * 3 * o * h
        return (inputs - 1) * 3 * c * h

    mlp_b = [("gate product grad", 6 * c * f), ("silu grad", 3 * c * f)] if spec.mlp == "swiglu" else [
        ("gelu grad", 3 * c * f)]
    rope_b = [("rope grad", 14 * c * w + 2 * c * d) for w in (q, k)] if spec.positions == "rope" else []
    # One projection's q, k, v gradients are concatenated into its output's gradient.
    qkv_cat = [("q/k/v grad concat", 2 * c * (q + 2 * k))] if spec.fused_qkv else []
    bias_b = [("bias grads", _bias_grad_bytes(spec, c))] if spec.biases else []
    bwd = ([("residual grad cast", (s + c) * h if c != s else 0.0)] + mlp_b
           + [("mlp input grads", branch_sum(n_mlp))] + norm_b
           + [("residual junction", junction), ("residual grad cast", (s + c) * h if c != s else 0.0)]
           + rope_b + qkv_cat + [("q/k/v input grads", branch_sum(n_qkv))] + norm_b + bias_b
           + [("residual junction", junction)])
    return fwd, bwd


def _compiled_bytes(spec: ModelSpec, prec: PrecisionRecipe) -> tuple[float, float]:
    h, q, k, f, _ = _widths(spec)
    s, c = _stream_bytes(prec), prec.compute_bytes
    gated = spec.mlp == "swiglu"
    rope = 2 * c * (q + k) + 8 * 2 if spec.positions == "rope" else 0
    fwd = 2 * (2 * s + 2 * c) * h + rope + (3 if gated else 2) * c * f
    # Norm backward + junction: reads n branch gradients, the input and the residual gradient,
    # writes the input's gradient; weight gradient: the branch gradients and the input again.
    n_attn, n_mlp = (1 if spec.fused_qkv else 3), (2 if gated else 1)
    norms = sum(n * c * h + 2 * s * h + s * h + n * c * h + s * h for n in (n_attn, n_mlp))
    bwd = norms + (2 * c * (q + k) if spec.positions == "rope" else 0) + (5 if gated else 3) * c * f
    if spec.biases:
        bwd += _bias_grad_bytes(spec, c)
    return fwd, bwd


def elementwise_bytes(spec: ModelSpec, prec: PrecisionRecipe, kernels: str = "eager") -> ElementwiseBytes:
    """Bytes per token of one layer's elementwise ops, forward and backward (see the module)."""
    if kernels not in KERNELS:
        raise CostModelError(f"kernels must be one of {', '.join(KERNELS)}, got {kernels!r}")
    if kernels == "eager":
        fwd_ops, bwd_ops = _eager_ops(spec, prec)
        fwd, bwd = sum(b for _, b in fwd_ops), sum(b for _, b in bwd_ops)
    else:
        fwd, bwd = _compiled_bytes(spec, prec)
    # A cross-attention block adds its own norm-free q projection input and output add; counted
    # as one more residual add each way (STDiT), and spatial-temporal layers run two blocks.
    if spec.cross_attention:
        s, c, h = _stream_bytes(prec), prec.compute_bytes, spec.hidden
        fwd += (2 * s + c) * h
        bwd += 3 * s * h
    return ElementwiseBytes(fwd * spec.blocks_per_layer, bwd * spec.blocks_per_layer)


def loss_bytes_per_token(spec: ModelSpec, prec: PrecisionRecipe, loss: str = "upcast") -> float:
    """Bytes per token the loss moves over the vocabulary-sized logits, forward and backward:
    `upcast` the logits to fp32 first (eager ops), or one `fused` cross-entropy kernel."""
    if loss not in ("upcast", "fused"):
        raise CostModelError(f"loss must be upcast or fused, got {loss!r}")
    c, v = prec.compute_bytes, spec.vocab
    if loss == "fused":
        return 3.0 * c * v
    wide = max(4, c)
    up = (c + wide) * v if c < wide else 0.0
    return up + 2 * wide * v + wide * v + 3 * wide * v + up
