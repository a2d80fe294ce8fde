"""Layouts of an SP group (Ulysses degree u x ring degree c) and the ring's share of a layer's time.

An SP group of p = u x c GPUs runs Ulysses over u consecutive GPUs (q, k, v all-to-all'd to head
shards) and ring attention over c (USP, arXiv 2405.07719): each GPU holds T/c tokens' queries for
H/u heads and the c key/value blocks of its ring pass it one by one (Liu et al., arXiv 2310.01889).
Per layer and direction the ring runs c steps of block attention; c - 1 of them overlap the
point-to-point transfer of the next block, so the ring costs, per layer,

    forward   x_f + (c - 1) max(x_f, y_f)
    backward  x_b + (c - 1) max(x_b, y_b) + z                 (z: the last gradient block's return)

x: one step's attention, (A/c + kappa T) pairs at the kernel's per-pair rate over p GPUs (zigzag
chunks make every step's causal work equal, `dcp.models.packing`), plus the online-softmax merge;
y: one block's transfer, latency + bytes / P2P bandwidth, forward K and V of T/c tokens in the
compute dtype, backward also their float32 gradient accumulators. Summed:

    ring(T, A) = c x + z  +  (c - 1) max(0, y - x)            per layer and direction
                 \\_________/    \\________________/
                  linear in T, A     exposed transfer: 0 where the ring is compute-bound

`linear_extra` is the first part (what the ring adds to Ulysses at SP p: c - 1 more kernel calls'
short-sequence cost and merges, and z); it is exact where every step is compute-bound (y <= x) and
a lower bound elsewhere. `exposed_s` is the rest. The planner's linear model uses the lower bound
(its coefficients must stay lower bounds, CostModel.linear_time); plans are priced exactly.

Pairs per step assume they spread evenly over steps: exact for one sample (zigzag), optimistic for
a packed micro-batch of samples shorter than a chunk, whose pairs mostly fall on the first step.

Never imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dcp.costmodel.spec import CostModelError, ModelSpec

RING_ATTENTION_KINDS = ("causal", "full")
"""Attention kinds the planner gives ring layouts: their pairs split evenly over zigzag chunks
(the executor runs every kind; spatial/temporal blocks would not balance)."""
MERGE_BYTES_PER_ELEMENT = 12
"""The online-softmax merge reads the running float32 output and the block's and writes the
running one back: 3 x 4 bytes per output element and step (backward: the same for dq)."""
KERNELS_PER_STEP = 4
"""Launches per ring step besides the attention's (merge, exchange): a dcp estimate."""


@dataclass(frozen=True)
class SPLayout:
    """How an SP group splits attention: Ulysses over `ulysses` ranks, ring over `ring`."""

    ulysses: int
    ring: int = 1

    def __post_init__(self) -> None:
        for name in ("ulysses", "ring"):
            n = getattr(self, name)
            if n < 1 or n & (n - 1):
                raise CostModelError(f"{name} degree {n} is not a power of two")

    @property
    def size(self) -> int:
        return self.ulysses * self.ring

    @property
    def label(self) -> str:
        """"8" (Ulysses only) or "8x4" (Ulysses x ring), as plans show it."""
        return str(self.ulysses) if self.ring == 1 else f"{self.ulysses}x{self.ring}"


def ulysses_ok(model: ModelSpec, u: int) -> bool:
    """Ulysses over u ranks shards whole heads: u divides the query heads, and the KV heads divide
    by u or u by them (each KV head is then replicated on u / kv_heads ranks)."""
    return model.heads % u == 0 and (model.kv_heads % u == 0 or u % model.kv_heads == 0)


def sp_layouts(model: ModelSpec, sp_size: int, gpus_per_node: int | None = None) -> tuple[SPLayout, ...]:
    """The layouts a group of `sp_size` ranks may use, in increasing Ulysses degree. Where Ulysses
    alone divides the heads and the KV heads (every SP size before rings existed) it is the only
    one: those groups price and plan exactly as before. Beyond, Ulysses over u ranks (replicating
    KV heads where u exceeds them) and a ring over the rest, u from the node's GPUs (Ulysses fills
    the node's fast links where the heads allow; the ring crosses nodes, USP's placement,
    arXiv 2405.07719) up to the most the heads allow."""
    if sp_size < 1 or sp_size & (sp_size - 1):
        raise CostModelError(f"SP size {sp_size} is not a power of two")
    if model.heads % sp_size == 0 and model.kv_heads % sp_size == 0:
        return (SPLayout(sp_size),)
    degrees = [u for u in (1 << i for i in range(sp_size.bit_length())) if ulysses_ok(model, u)]
    ring_ok = model.attention in RING_ATTENTION_KINDS and not model.cross_attention
    options = [SPLayout(u, sp_size // u) for u in degrees if u == sp_size or ring_ok]
    if not options:
        return ()
    floor = min(gpus_per_node or 1, options[-1].ulysses)
    return tuple(o for o in options if o.ulysses >= floor)


def shard_tokens(tokens: float, sp_size: int, ring: int = 1) -> int:
    """Tokens each GPU of an SP group holds: the micro-batch padded to a multiple of p (of 2p under
    a ring: its 2c zigzag chunks split over the u Ulysses ranks), split."""
    if ring > 1:
        return 2 * math.ceil(tokens / (2 * sp_size) - 1e-9)
    return math.ceil(tokens / sp_size - 1e-9)


def kv_width(model: ModelSpec, ulysses: int) -> int:
    """Elements of K (or V) per token a GPU's share of the sequence carries, summed over the u
    Ulysses ranks: kv_heads x head_dim, or u x head_dim when KV heads are replicated."""
    return max(model.kv_heads, ulysses) * model.head_dim


@dataclass(frozen=True)
class RingCoefficients:
    """The ring terms of one layout, per layer, per GPU, for a micro-batch of T tokens, A pairs
    (all times in seconds; 'per token' means per token of the micro-batch, T, not per GPU)."""

    steps: int
    """c: ring steps per layer and direction."""
    fwd_step_pair_s: float
    """x_f per pair of the micro-batch: per-pair rate / (p c)."""
    fwd_step_token_s: float
    """x_f per token: the step's short-sequence cost and its merge."""
    bwd_step_pair_s: float
    bwd_step_token_s: float
    step_latency_s: float
    """Latency of one block's transfer."""
    fwd_transfer_token_s: float
    """y_f per token: K and V of the token's share, over the P2P bandwidth."""
    bwd_transfer_token_s: float
    """y_b per token: K, V and their gradient accumulators."""
    grad_return_token_s: float
    """z per token: the last gradient accumulator's trip home (z = latency + this x T)."""
    fwd_extra_token_s: float
    """What the ring adds to the forward per token beyond Ulysses at SP p (c - 1 more calls' short-
    sequence cost and merges), the linear part."""
    bwd_extra_token_s: float
    """The same for the backward."""
    extra_fixed_s: float
    """Launches of the c - 1 extra steps, per layer and direction."""

    def exposed_s(self, tokens: float, pairs: float) -> tuple[float, float]:
        """(forward, backward) transfer time per layer not hidden behind the steps' attention:
        (c - 1) max(0, y - x)."""
        fwd, bwd = self.exposed(np.asarray(tokens, dtype=np.float64), np.asarray(pairs, dtype=np.float64))
        return float(fwd), float(bwd)

    def exposed(self, tokens: np.ndarray, pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`exposed_s` elementwise, for arrays of micro-batches."""
        if self.steps == 1:
            return np.zeros_like(tokens), np.zeros_like(tokens)
        x_f = self.fwd_step_pair_s * pairs + self.fwd_step_token_s * tokens
        x_b = self.bwd_step_pair_s * pairs + self.bwd_step_token_s * tokens
        y_f = self.step_latency_s + self.fwd_transfer_token_s * tokens
        y_b = self.step_latency_s + self.bwd_transfer_token_s * tokens
        return (self.steps - 1) * np.maximum(0.0, y_f - x_f), (self.steps - 1) * np.maximum(0.0, y_b - x_b)


def ring_coefficients(model: ModelSpec, layout: SPLayout, *, fwd_pair_s: float, bwd_pair_s: float,
                      fwd_kappa: float, bwd_kappa: float, memory_bw: float, launch_s: float,
                      p2p_latency_s: float, p2p_bw: float, acc_bytes: int) -> RingCoefficients:
    """The ring terms of `layout` from the layer's per-pair attention times at SP 1 (forward,
    backward), the kernel's short-sequence terms kappa (pairs per token, `HardwareProfile`), the
    device's memory bandwidth and launch cost, and the P2P link between ring neighbours."""
    c, p = layout.ring, layout.size
    if c == 1:
        return RingCoefficients(1, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    kvw, elem = kv_width(model, layout.ulysses), model.bytes_per_element
    # Per token of the micro-batch: a GPU holds T/p of them (T/c queries for H/u heads).
    fwd_merge = MERGE_BYTES_PER_ELEMENT * model.hidden / p / memory_bw
    bwd_merge = MERGE_BYTES_PER_ELEMENT * (model.hidden + 2 * kvw) / p / memory_bw  # dq, and dk/dv arriving
    fwd_call = fwd_pair_s * fwd_kappa / p  # one kernel call's short-sequence cost over T/c queries
    bwd_call = bwd_pair_s * bwd_kappa / p
    return RingCoefficients(
        steps=c,
        fwd_step_pair_s=fwd_pair_s / (p * c), fwd_step_token_s=fwd_call + fwd_merge,
        bwd_step_pair_s=bwd_pair_s / (p * c), bwd_step_token_s=bwd_call + bwd_merge,
        step_latency_s=p2p_latency_s,
        fwd_transfer_token_s=2 * kvw * elem / p / p2p_bw,
        bwd_transfer_token_s=2 * kvw * (elem + acc_bytes) / p / p2p_bw,
        grad_return_token_s=2 * kvw * acc_bytes / p / p2p_bw,
        # The fit prices one call per layer and direction (Ulysses); a ring makes c of them.
        fwd_extra_token_s=(c - 1) * (fwd_call + fwd_merge),
        bwd_extra_token_s=(c - 1) * (bwd_call + bwd_merge),
        extra_fixed_s=(c - 1) * (KERNELS_PER_STEP + 1) * launch_s,
    )


def layout_extra_bytes(model: ModelSpec, layout: SPLayout, compute_bytes: int) -> tuple[float, float]:
    """(saved per non-checkpointed layer, working set) bytes per GPU token that `layout` adds to the
    measured footprint (which counts Ulysses with whole KV heads):

    - KV heads replicated (u > kv_heads): each layer saves K and V of u heads' width instead of
      kv_heads' (flash attention keeps them for backward), and one layer's backward holds them;
    - a ring: while a layer's attention runs, the next key/value block arriving, in backward also the
      float32 gradient accumulators in flight (one sent, one arriving) and the block's own, and the
      running and the block's float32 dq (forward: output; the larger, backward, is counted)."""
    replicated = 2 * (kv_width(model, layout.ulysses) - model.kv_heads * model.head_dim) * compute_bytes
    if layout.ring == 1:
        return float(replicated), float(replicated)
    kvw, acc = kv_width(model, layout.ulysses), max(4, compute_bytes)
    ring = 2 * kvw * compute_bytes + 3 * 2 * kvw * acc + 2 * model.hidden * acc
    return float(replicated), float(replicated + ring)
