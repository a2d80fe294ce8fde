"""Device microbenchmarks: the numbers a hardware profile uses for models it has no fit for.

`CostModel._derive_fit` prices a model without measured coefficients from FLOPs and bytes:
matmul FLOP/s for the projections and MLP, the attention kernel's forward and backward rates
with their short-sequence terms for the score/value products, memory bandwidth for elementwise
work and the per-tensor weight traffic, and the launch cost that floors each small kernel.
Measuring them here replaces the preset's datasheet values for this machine, so even an
unprofiled model is priced from measurements.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dcp.costmodel.attention import fit_attention_rate
from dcp.models.attention import attention_backend, varlen_attention
from dcp.models.packing import PackedSeqs
from dcp.profiler.timing import Stopwatch, compute_clock, min_time, synchronize


@dataclass(frozen=True)
class DeviceNumbers:
    """Measured device throughput and what each was measured with."""

    matmul_flops: float
    attention_fwd_flops: float
    attention_bwd_flops: float
    attention_fwd_pairs_per_token: float
    attention_bwd_pairs_per_token: float
    attention_backend: str
    memory_bw_bytes_per_s: float
    kernel_launch_s: float
    memory_capacity_bytes: float | None
    """CUDA: the device's total memory (the profile keeps its base's reserve); None on CPU (the
    preset's value stays)."""
    notes: dict[str, str]
    attention_points: list[dict[str, float]] = field(default_factory=list)
    """(direction, length, achieved FLOP/s) of the attention sweep, for the profile's meta."""


def attention_sweep(device: torch.device, dtype: torch.dtype, *, quick: bool,
                    reps: dict[str, int]) -> tuple[list[tuple[str, int, float]], str]:
    """Achieved FLOP/s (FlashAttention's count) of the models' own attention path, forward and
    backward, on causal samples of several lengths at a fixed token count (the FlashAttention-3
    paper's protocol, arXiv 2407.08608: 16K tokens, 2048 wide, head dim 128), and its backend."""
    cuda = device.type == "cuda"
    heads, hd = (16, 128) if cuda else (8, 64)
    total = 16384 if cuda else (2048 if quick else 4096)
    lengths = [512, 1024, 2048, 4096, 8192, 16384] if cuda else ([128, 512] if quick else [128, 256, 512, 1024])
    points = []
    for length in lengths:
        fwd_s, bwd_s = _attention_times(length, total, heads, hd, device, dtype, reps)
        counted = 4.0 * (total // length) * length**2 * heads * hd / 2  # causal: half of full
        points += [("fwd", length, counted / fwd_s), ("bwd", length, 2.5 * counted / bwd_s)]
    return points, attention_backend(device, dtype)[0]


def _attention_times(length: int, total: int, heads: int, hd: int, device: torch.device, dtype: torch.dtype,
                     reps: dict[str, int]) -> tuple[float, float]:
    """Forward and backward seconds of causal attention over total / length samples of `length`."""
    seqs = PackedSeqs.pack([length] * (total // length), device=device)
    q, k, v = (torch.randn(seqs.total, heads, hd, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    grad = torch.randn(seqs.total, heads, hd, device=device, dtype=dtype)
    fwd_s = min_time(lambda: varlen_attention(q, k, v, seqs, "causal"), device, **reps).seconds
    out = varlen_attention(q, k, v, seqs, "causal")
    bwd_s = min_time(lambda: torch.autograd.backward(out, grad, retain_graph=True), device, **reps).seconds
    return fwd_s, bwd_s


def kernel_launch_s(device: torch.device, launches: int = 2000) -> float:
    """Seconds per launch of a one-element in-place add, back to back (launch-bound)."""
    x = torch.zeros(1, device=device)
    watch = Stopwatch(device, compute_clock())
    times = []
    for _ in range(3):
        synchronize(device)
        watch.start()
        for _ in range(launches):
            x.add_(1)
        watch.stop()
        times.append(watch.seconds() / launches)
    return sorted(times)[1]


def measure_device(device: torch.device, dtype: torch.dtype, *, quick: bool) -> DeviceNumbers:
    """Matmul FLOP/s, attention rates per direction, copy bandwidth and launch cost."""
    cuda = device.type == "cuda"
    reps = dict(warmup=2, repeats=3 if quick else 5)
    # Sizes large enough to reach steady-state throughput, small enough to take well under a
    # second: 8192^3 is where an H200 reaches its ~790 TFLOP/s bf16.
    n = 8192 if cuda else (512 if quick else 1024)
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    mm_s = min_time(lambda: a @ b, device, **reps).seconds
    matmul = 2.0 * n**3 / mm_s

    points, backend = attention_sweep(device, dtype, quick=quick, reps=reps)
    fwd_rate, fwd_kappa = fit_attention_rate([(n_, True, f) for d, n_, f in points if d == "fwd"])
    bwd_rate, bwd_kappa = fit_attention_rate([(n_, True, f) for d, n_, f in points if d == "bwd"])

    elems = (1 << 28) if cuda else (1 << 23)
    src = torch.empty(elems, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    copy_s = min_time(lambda: dst.copy_(src), device, **reps).seconds
    bw = 2.0 * src.nelement() * 4 / copy_s  # a copy reads and writes every byte
    launch = kernel_launch_s(device)

    memory = float(torch.cuda.get_device_properties(device).total_memory) if cuda else None
    name = str(dtype).replace("torch.", "")
    lengths = sorted({n_ for _, n_, _ in points})
    sweep = f"causal {backend}, samples of {lengths[0]}..{lengths[-1]} tokens, {name}"
    notes = {
        "matmul_flops": f"torch.matmul {n}^3 {name}: {matmul / 1e12:.3g} TFLOP/s",
        "attention_fwd_flops": f"fit of (A + kappa T) pairs to the forward of {sweep}: {fwd_rate / 1e12:.3g} TFLOP/s",
        "attention_fwd_pairs_per_token": f"the same fit: kappa {fwd_kappa:.3g} pairs per token",
        "attention_bwd_flops": f"the same fit to the backward: {bwd_rate / 1e12:.3g} TFLOP/s (2.5x forward FLOPs)",
        "attention_bwd_pairs_per_token": f"the same fit: kappa {bwd_kappa:.3g} pairs per token",
        "attention_backend": f"dcp.models.attention's fast path on {device.type} {name}",
        "memory_bw_bytes_per_s": f"{src.nelement() * 4 >> 20} MiB fp32 copy_: {bw / 1e9:.3g} GB/s (read + write)",
        "kernel_launch_s": f"one-element add_ launched back to back: {launch * 1e6:.3g} us each",
    }
    if memory is not None:
        notes["memory_capacity_bytes"] = f"torch.cuda.get_device_properties().total_memory: {memory / 2**30:.2f} GiB"
    return DeviceNumbers(matmul, fwd_rate, bwd_rate, fwd_kappa, bwd_kappa, backend, bw, launch, memory, notes,
                         [{"direction": d, "tokens": n_, "flops": f} for d, n_, f in points])
