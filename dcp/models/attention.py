"""Local varlen attention over a packed sequence: a fast path and a plain reference beside it.

Every attention function has the `AttentionFn` signature: q [N, H, D], k and v [N, Hkv, D]
(GQA: H a multiple of Hkv) over the whole packed sequence described by `seqs`, and returns
[N, H, D]. Samples never attend to each other (block-diagonal). Kinds:

- causal: each token sees itself and the earlier tokens of its sample;
- full: each token sees its whole sample;
- spatial: each token sees the tokens of its own frame (video, frame-major layout);
- temporal: each token sees the tokens at its position in every frame of its sample.

Layers call their attention through an attribute (`attn_fn`), so the executor can swap in
Ulysses attention, which all-to-alls q, k, v to head shards and then calls one of these.

The fast path (`varlen_attention`) runs one varlen kernel over the whole micro-batch on GPUs
(flash-attn's when installed, else torch's own `varlen_attn`), each checked once against SDPA
(`attention_backend`); elsewhere SDPA once per sample.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import math
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import torch
import torch.nn.functional as F

from dcp.models.packing import PackedSeqs

KINDS = ("causal", "full", "spatial", "temporal")

try:  # flash-attn is optional (GPU only); torch's own varlen kernel or SDPA cover the rest
    from flash_attn import flash_attn_varlen_func
except ImportError:  # pragma: no cover - depends on the machine
    flash_attn_varlen_func = None

try:  # torch >= 2.9: flash-attention's varlen kernel shipped with torch itself (CUDA)
    from torch.nn.attention.varlen import varlen_attn as torch_varlen_attn
except ImportError:  # pragma: no cover - depends on the torch version
    torch_varlen_attn = None

VarlenKernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, bool], torch.Tensor]
"""kernel(q [N, H, D], k, v [N, Hkv, D], cu_seqlens int32 [S + 1], longest, causal) -> [N, H, D]:
one launch over every segment of a packed sequence."""


class AttentionFn(Protocol):
    """Attention over the packed sequence `seqs` (q [N, H, D], k/v [N, Hkv, D]) -> [N, H, D]."""

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqs: PackedSeqs,
                 kind: str) -> torch.Tensor: ...


def _check(q: torch.Tensor, k: torch.Tensor, seqs: PackedSeqs, kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown attention kind {kind!r}; expected one of {KINDS}")
    if q.shape[0] != seqs.total or seqs.local != seqs.total:
        raise ValueError(
            f"local attention needs the whole packed sequence ({seqs.total} tokens) but got "
            f"{q.shape[0]} tokens of shard [{seqs.start}, {seqs.end}); under sequence parallelism "
            "the executor must install Ulysses attention (dcp.executor.Executor does)")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"{q.shape[1]} query heads are not a multiple of {k.shape[1]} KV heads")


def _blocks(x: torch.Tensor, frames: int, kind: str) -> torch.Tensor:
    """One segment [n, h, d] -> independent attention blocks [B, h, L, d] for SDPA."""
    n = x.shape[0]
    if kind == "spatial":  # B = frames, L = tokens per frame
        x = x.view(frames, n // frames, *x.shape[1:])
    elif kind == "temporal":  # B = positions, L = frames
        x = x.view(frames, n // frames, *x.shape[1:]).transpose(0, 1)
    else:
        x = x.unsqueeze(0)
    return x.transpose(1, 2)


def _unblocks(o: torch.Tensor, frames: int, kind: str) -> torch.Tensor:
    """Inverse of `_blocks`: [B, h, L, d] -> [n, h, d]."""
    o = o.transpose(1, 2)
    if kind == "temporal":
        o = o.transpose(0, 1)
    return o.reshape(-1, *o.shape[2:])


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqs: PackedSeqs,
                   kind: str) -> torch.Tensor:
    """One `scaled_dot_product_attention` call per sample; frames batch as independent blocks."""
    _check(q, k, seqs, kind)
    rep = q.shape[1] // k.shape[1]
    if rep > 1:  # GQA: each KV head serves `rep` consecutive query heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    out = []
    sizes = list(seqs.lengths)
    # split, not q[a:b]: a slice's backward zero-fills a full-size gradient per sample, which made
    # backward grow with samples x tokens (the profiler saw 273 vs 109 ms for 128 short samples).
    parts = zip(q.split(sizes), k.split(sizes), v.split(sizes), seqs.frames, strict=True)
    for qi, ki, vi, frames in parts:
        o = F.scaled_dot_product_attention(
            _blocks(qi, frames, kind), _blocks(ki, frames, kind), _blocks(vi, frames, kind),
            is_causal=kind == "causal")
        out.append(_unblocks(o, frames, kind))
    return torch.cat(out)


def _flash_layout(seqs: PackedSeqs, kind: str, device: torch.device) -> tuple[torch.Tensor | None, list[int]]:
    """Token permutation and sub-sequence lengths that turn spatial/temporal attention into plain
    varlen attention: frames (spatial) or positions across frames (temporal) become the segments."""
    perm, lengths, offsets = [], [], seqs.offsets()
    for i, (n, f) in enumerate(zip(seqs.lengths, seqs.frames, strict=True)):
        s = n // f
        if kind == "temporal":
            idx = offsets[i] + (torch.arange(f) * s).unsqueeze(0) + torch.arange(s).unsqueeze(1)
            perm.append(idx.reshape(-1))
            lengths += [f] * s
        else:
            perm.append(torch.arange(offsets[i], offsets[i + 1]))
            lengths += [s] * f if kind == "spatial" else [n]
    return (torch.cat(perm).to(device) if kind == "temporal" else None), lengths


def kernel_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqs: PackedSeqs, kind: str,
                     kernel: VarlenKernel) -> torch.Tensor:
    """Attention through a varlen kernel: one launch for the whole micro-batch, whatever its number
    of samples (a per-sample loop launches kernels per sample, a cost no token count explains)."""
    _check(q, k, seqs, kind)
    perm, lengths = _flash_layout(seqs, kind, q.device)
    if perm is not None:
        q, k, v = q[perm], k[perm], v[perm]
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32, device=q.device)
    cu[1:] = torch.tensor(lengths, device=q.device).cumsum(0)
    o = kernel(q, k, v, cu, max(lengths), kind == "causal")
    if perm is not None:
        o = torch.empty_like(o).index_copy_(0, perm, o)
    return o


def flash_attn_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, longest: int,
                      causal: bool) -> torch.Tensor:
    """flash-attn's varlen kernel (CUDA, fp16/bf16); GQA handled by the kernel."""
    return flash_attn_varlen_func(q, k, v, cu, cu, longest, longest, causal=causal)


def torch_varlen_kernel(varlen_attn: Callable[..., torch.Tensor]) -> VarlenKernel:
    """torch's `varlen_attn` as a `VarlenKernel`. Its keywords moved between releases: torch 2.9
    and 2.10 take `is_causal`, later ones `window_size` ((-1, 0) is causal) and `enable_gqa`;
    without `enable_gqa` KV heads are repeated here."""
    params = inspect.signature(varlen_attn).parameters

    def kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, longest: int,
               causal: bool) -> torch.Tensor:
        kw: dict[str, object] = {}
        if "window_size" in params:
            kw["window_size"] = (-1, 0) if causal else (-1, -1)
        else:
            kw["is_causal"] = causal
        if q.shape[1] != k.shape[1]:
            if "enable_gqa" in params:
                kw["enable_gqa"] = True
            else:
                rep = q.shape[1] // k.shape[1]
                k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        q, k, v = (t if t.is_contiguous() else t.contiguous() for t in (q, k, v))
        return varlen_attn(q, k, v, cu, cu, longest, longest, **kw)

    return kernel


_KERNELS: dict[tuple[str, torch.dtype], tuple[str, VarlenKernel | None]] = {}

PRICED_AS = {"flash-attn varlen": "fa2", "torch varlen_attn": "fa2", "sdpa per sample": "sdpa"}
"""The cost model's name (`HardwareProfile.attention_kernels`, `TrainingSetup.attention`) of each
fast-path kernel: flash-attn's package and torch's own varlen kernel are FlashAttention-2."""

_RAN: set[str] = set()
"""The fast-path kernels run in this process since `kernels_run` last emptied it."""


def kernels_run() -> tuple[str, ...]:
    """The names of the kernels the fast path ran since the last call (sorted), and start anew:
    the executor reads it after each step, so a run reports which kernel its plans' attention
    actually used beside the one the cost model priced."""
    ran = tuple(sorted(_RAN))
    _RAN.clear()
    return ran


def attention_backend(device: torch.device, dtype: torch.dtype) -> tuple[str, VarlenKernel | None]:
    """The fast path's kernel on (device, dtype) and its name: flash-attn when installed, else
    torch's varlen kernel, else SDPA once per sample (CPU, fp32, old torch). Each kernel is
    checked once against SDPA on a small packed batch, forward and backward; one that fails or
    disagrees is skipped with a warning (the profiler records the name in its profile)."""
    key = (str(device), dtype)
    if key not in _KERNELS:
        candidates: list[tuple[str, VarlenKernel]] = []
        if device.type == "cuda" and dtype in (torch.float16, torch.bfloat16):
            if flash_attn_varlen_func is not None:
                candidates.append(("flash-attn varlen", flash_attn_kernel))
            if torch_varlen_attn is not None:
                candidates.append(("torch varlen_attn", torch_varlen_kernel(torch_varlen_attn)))
        _KERNELS[key] = first_working_kernel(candidates, device, dtype)
    return _KERNELS[key]


def first_working_kernel(candidates: list[tuple[str, VarlenKernel]], device: torch.device, dtype: torch.dtype
                         ) -> tuple[str, VarlenKernel | None]:
    """The first candidate that passes the self-check (a warning for each that does not), else SDPA."""
    for name, kernel in candidates:
        problem = _self_check(kernel, device, dtype)
        if problem is None:
            return name, kernel
        warnings.warn(f"attention: {name} skipped on {device} {dtype}: {problem}", stacklevel=3)
    return "sdpa per sample", None


def _self_check(kernel: VarlenKernel, device: torch.device, dtype: torch.dtype) -> str | None:
    """None if `kernel` matches SDPA (output and input gradients) on a small GQA batch of three
    causal samples, else what went wrong. Runs in a thread of its own: the first call may come
    from inside a forward under no_grad, autocast or a checkpoint's saved-tensor hooks, all of
    them thread-local state that a fresh thread does not inherit."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(_compare_with_sdpa, kernel, device, dtype).result()


def _compare_with_sdpa(kernel: VarlenKernel, device: torch.device, dtype: torch.dtype) -> str | None:
    gen = torch.Generator(device="cpu").manual_seed(0)
    seqs = PackedSeqs.pack([40, 7, 81], device=device)
    q, k, v = (torch.randn(seqs.total, h, 64, generator=gen).to(device, dtype).requires_grad_()
               for h in (4, 2, 2))
    # A new thread starts on GPU 0, whatever device the caller's rank set.
    on_device = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    try:
        with on_device:
            got = kernel_attention(q, k, v, seqs, "causal", kernel)
            got_grads = torch.autograd.grad(got.float().square().sum(), (q, k, v))
            want = sdpa_attention(q, k, v, seqs, "causal")
            want_grads = torch.autograd.grad(want.float().square().sum(), (q, k, v))
    except Exception as e:  # noqa: BLE001 - any failure means: do not use this kernel
        return f"{type(e).__name__}: {e}"
    for what, a, b in zip(("output", "dq", "dk", "dv"), (got, *got_grads), (want, *want_grads), strict=True):
        err = (a.float() - b.float()).abs().max().item() / max(b.float().abs().max().item(), 1e-6)
        if not err < 0.05:  # bf16 keeps ~3 significant digits; a wrong mask is off by O(1)
            return f"{what} differs from SDPA by {err:.3g} (relative to its largest entry)"
    return None


DenseKernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""dense(q [..., H, L, D], k, v [..., H, C, D]) -> [..., H, L, D]: full attention, as
`F.scaled_dot_product_attention` without a mask (the caption cross-attention's)."""

_FORCED: contextvars.ContextVar[tuple[VarlenKernel, DenseKernel] | None] = contextvars.ContextVar(
    "dcp_forced_kernels", default=None)


@contextlib.contextmanager
def forced_kernels(varlen: VarlenKernel, dense: DenseKernel) -> Iterator[None]:
    """Inside the block self-attention's fast path runs `varlen` and cross-attention `dense`,
    whatever the device: the memory profiler counts what the GPU's flash kernels save by running
    a stand-in for them on fake tensors (dcp.profiler.memory)."""
    token = _FORCED.set((varlen, dense))
    try:
        yield
    finally:
        _FORCED.reset(token)


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqs: PackedSeqs,
                     kind: str) -> torch.Tensor:
    """The fast path: a varlen kernel where one works (`attention_backend`), else SDPA.

    Under autocast q, k and v run in its dtype, as autocast runs SDPA (a model may hand over
    q and k in fp32, e.g. Hugging Face Llama's RoPE on a fp32 residual stream, and v in bf16)."""
    device_type = q.device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    forced = _FORCED.get()
    if forced is not None:
        return kernel_attention(q, k, v, seqs, kind, forced[0])
    name, kernel = attention_backend(q.device, q.dtype)
    _RAN.add(name)
    if kernel is not None:
        return kernel_attention(q, k, v, seqs, kind, kernel)
    return sdpa_attention(q, k, v, seqs, kind)


def attention_mask(seqs: PackedSeqs, kind: str) -> torch.Tensor:
    """[N, N] bool, True where query i may attend to key j (the definition the fast paths follow)."""
    every = torch.arange(seqs.total, device=seqs.device)
    return pair_mask(seqs, kind, every, every)


def pair_mask(seqs: PackedSeqs, kind: str, rows_q: torch.Tensor, rows_k: torch.Tensor) -> torch.Tensor:
    """[len(rows_q), len(rows_k)] bool: may the query at packed position rows_q[i] attend to the key
    at rows_k[j] (`attention_mask` restricted to those rows and columns; ring attention's blocks)."""
    seg, pos = seqs.segment_ids_full(), seqs.positions_full()
    per_frame = (torch.tensor(seqs.lengths) // torch.tensor(seqs.frames)).to(seg.device)[seg]
    sq, sk, pq, pk = seg[rows_q], seg[rows_k], pos[rows_q], pos[rows_k]
    allow = sq.unsqueeze(1) == sk.unsqueeze(0)
    if kind == "causal":
        allow &= pq.unsqueeze(1) >= pk.unsqueeze(0)
    elif kind == "spatial":
        fq, fk = pq // per_frame[rows_q], pk // per_frame[rows_k]
        allow &= fq.unsqueeze(1) == fk.unsqueeze(0)
    elif kind == "temporal":
        wq, wk = pq % per_frame[rows_q], pk % per_frame[rows_k]
        allow &= wq.unsqueeze(1) == wk.unsqueeze(0)
    return allow


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqs: PackedSeqs,
                        kind: str) -> torch.Tensor:
    """Plain softmax(q k^T / sqrt(d) + mask) v over the whole sequence: slow, obviously right."""
    _check(q, k, seqs, kind)
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scores = torch.einsum("nhd,mhd->hnm", q, k) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~attention_mask(seqs, kind), float("-inf"))
    return torch.einsum("hnm,mhd->nhd", scores.softmax(dim=-1), v)


def cross_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqs: PackedSeqs) -> torch.Tensor:
    """Each local token [N_local, H, D] attends to its own sample's conditioning tokens
    (k, v [C, H, D], samples' conditions concatenated). Pads get zeros. Needs no communication:
    the conditioning is short and every rank of a group holds all of it."""
    if seqs.cond_lengths is None:
        raise ValueError("cross-attention needs conditioning lengths in PackedSeqs (cond_lengths)")
    forced = _FORCED.get()
    sdpa = F.scaled_dot_product_attention if forced is None else forced[1]
    out = torch.zeros_like(q)
    if seqs.ring == 1:  # the shard is contiguous: each sample's rows are one slice
        offsets = seqs.offsets()
        rows = [slice(max(offsets[i], seqs.start) - seqs.start, max(min(offsets[i + 1], seqs.end) - seqs.start, 0))
                for i in range(seqs.num_real)]
    else:  # ring order: a sample's rows are wherever its segment id is
        seg = seqs.segment_ids()
        rows = [torch.nonzero(seg == i).flatten() for i in range(seqs.num_real)]
    c0 = 0
    for i, where in enumerate(rows):
        c1 = c0 + seqs.cond_lengths[i]
        if q[where].shape[0] and c1 > c0:
            o = sdpa(q[where].transpose(0, 1), k[c0:c1].transpose(0, 1), v[c0:c1].transpose(0, 1))
            out[where] = o.transpose(0, 1)
        c0 = c1
    return out
