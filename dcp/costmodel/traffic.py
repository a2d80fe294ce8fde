"""What a micro-batch costs whatever its size: the work on every weight tensor that each forward,
recompute and backward repeats.

Under autocast (parameters stored wider than the compute dtype, e.g. fp32 weights and bf16 matmuls,
as `examples/train_*.py` train) each matmul weight is cast in every forward: the stored copy read
(param bytes) and a compute-dtype copy written (compute bytes). A checkpointed layer's recompute
casts again: it runs in backward, outside the forward's autocast cache. In backward each weight's
gradient arrives in the compute dtype and is cast back to the parameter dtype (compute + param
bytes), converted again where the gradient buffer has another dtype (bf16 parameters, fp32
gradients: param + grad bytes), then accumulated into the flat gradient buffer: old value and new
read, sum written, 3 x grad bytes. Without autocast and conversion only the accumulation is left. The optimizer runs once per step,
not per micro-batch: `optimizer_step_s` prices it for the step.

Each of these is one elementwise kernel over one tensor: its bytes over the device memory
bandwidth (read plus written), but never less than one kernel launch (a norm weight of 4096
values costs its launch, not its bytes). Summed over the model's tensors this is 20-45 ms for a
7B model on an H200 in the fp32 + autocast recipe: far from free for a plan of hundreds of tiny
micro-batches.
"""

from __future__ import annotations

from dataclasses import dataclass

from dcp.costmodel.precision import DTYPE_BYTES, PrecisionRecipe
from dcp.costmodel.spec import CostModelError, ModelSpec


def layer_tensors(spec: ModelSpec) -> tuple[list[int], list[int]]:
    """Element counts of one layer's weights: (matmul weights, the rest: norm weights)."""
    h, kv = spec.hidden, spec.kv_heads * spec.head_dim
    block = [h * h, h * kv, h * kv, h * h] + [h * spec.ffn_hidden] * (3 if spec.mlp == "swiglu" else 2)
    if spec.cross_attention:
        block += [h * h] * 4
    return block * spec.blocks_per_layer, [h] * (2 * spec.blocks_per_layer)


def model_tensors(spec: ModelSpec) -> list[int]:
    """Element counts of every parameter tensor of the model (layers, embedding, head, final norm)."""
    matmul, other = layer_tensors(spec)
    tables = [spec.vocab * spec.hidden] * ((1 if spec.tied_embeddings else 2) if spec.vocab else 0)
    return (matmul + other) * spec.num_layers + tables + [spec.hidden]


@dataclass(frozen=True)
class WeightTraffic:
    """Seconds of the per-tensor weight work, by where it happens."""

    fwd_layer_s: float
    """One layer's forward: its weights cast."""
    bwd_layer_s: float
    """One layer's backward: gradients cast back and accumulated."""
    rec_layer_s: float
    """One checkpointed layer's recompute: its weights cast again."""
    head_s: float
    """Embedding, LM head and final norm, forward and backward, once per micro-batch."""
    bytes_per_microbatch: float
    """Bytes moved by a micro-batch without recompute (each recomputed layer adds its cast)."""


def weight_traffic(spec: ModelSpec, prec: PrecisionRecipe, memory_bw_bytes_per_s: float,
                   launch_s: float) -> WeightTraffic:
    """The weight work of `spec` in the recipe `prec` on a device of this bandwidth and launch cost."""
    cast = prec.param_bytes + prec.compute_bytes if prec.autocast else 0
    convert = prec.param_bytes + prec.grad_bytes if prec.grad_bytes != prec.param_bytes else 0
    accumulate = 3 * prec.grad_bytes

    def op(elements: int, bytes_per_element: int) -> tuple[float, float]:
        moved = elements * bytes_per_element
        return (max(launch_s, moved / memory_bw_bytes_per_s), moved) if bytes_per_element else (0.0, 0.0)

    def total(ops: list[tuple[float, float]]) -> tuple[float, float]:
        return sum(s for s, _ in ops), sum(b for _, b in ops)

    matmul, other = layer_tensors(spec)
    fwd_s, fwd_b = total([op(n, cast) for n in matmul])
    bwd_s, bwd_b = total([op(n, cast) for n in matmul] + [op(n, b) for n in matmul + other for b in (convert, accumulate)])
    table = spec.vocab * spec.hidden
    head_ops = [op(spec.hidden, convert), op(spec.hidden, accumulate)]  # the final norm
    if table:
        # The embedding's gradient is a dense table written, then accumulated; the LM head is a matmul
        # weight (cast, cast back, accumulated), the same table again when the two are tied.
        head_ops += [op(table, prec.grad_bytes), op(table, accumulate)]
        head_ops += [op(table, cast), op(table, cast), op(table, convert), op(table, accumulate)]
    head_s, head_b = total(head_ops)
    layers = spec.num_layers
    return WeightTraffic(fwd_layer_s=fwd_s, bwd_layer_s=bwd_s, rec_layer_s=fwd_s, head_s=head_s,
                         bytes_per_microbatch=layers * (fwd_b + bwd_b) + head_b)


def optimizer_bytes_per_param(prec: PrecisionRecipe, implementation: str = "foreach") -> float:
    """Bytes AdamW reads and writes per parameter of the local shard in one step.

    fused (one kernel, torch's fused=True): read the weights it steps (the fp32 master copy when
    the recipe keeps one), the gradient and the two moments; write the weights and the moments;
    with master weights also write the low-precision parameter copy. foreach (torch's default on
    GPUs): the same update as eight passes over the shard, each reading and writing its tensors:
    decoupled weight decay (weights read, written), m.lerp_(g) (m, g read, m written),
    v.mul_ and v.addcmul_(g, g) (v twice, g once read; v twice written), sqrt(v), its division
    by the bias correction and + eps (a temporary read and written thrice), and
    w.addcdiv_(m, sqrt) (w, m, temporary read, w written)."""
    w = 4 if prec.master_weights else prec.param_bytes
    s = DTYPE_BYTES[prec.optimizer_state_dtype]
    g = prec.grad_bytes
    copy = prec.param_bytes if prec.master_weights else 0
    if implementation == "fused":
        return w + g + 2 * s + w + 2 * s + copy
    if implementation != "foreach":
        raise CostModelError(f"optimizer must be foreach or fused, got {implementation!r}")
    return 2 * w + (2 * s + g) + (2 * s) + (2 * s + g) + 2 * s + 2 * s + 2 * s + (2 * w + s + s) + copy


def optimizer_step_s(prec: PrecisionRecipe, local_params: float, memory_bw_bytes_per_s: float,
                     implementation: str = "foreach") -> float:
    """Seconds of the optimizer step over `local_params` parameters (the rank's shard): its
    bytes over the device memory bandwidth, once per step."""
    return local_params * optimizer_bytes_per_param(prec, implementation) / memory_bw_bytes_per_s
