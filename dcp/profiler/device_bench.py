"""Device microbenchmarks: the numbers a hardware profile uses for models it has no fit for.

`CostModel._derive_fit` prices a model without measured coefficients from FLOPs and bytes:
matmul FLOP/s for the projections and MLP, attention-kernel FLOP/s for the score/value
products, memory bandwidth for elementwise work. Measuring them here replaces the preset's
datasheet values for this machine, so even an unprofiled model is priced from measurements.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dcp.profiler.timing import median_time


@dataclass(frozen=True)
class DeviceNumbers:
    """Measured device throughput and what each was measured with."""

    matmul_flops: float
    attention_flops: float
    memory_bw_bytes_per_s: float
    memory_bytes: float | None
    """CUDA: total device memory minus the reserve; None on CPU (the preset's value stays)."""
    notes: dict[str, str]


MEMORY_RESERVE = 0.10
"""Fraction of device memory kept back for the CUDA context, allocator fragmentation and
NCCL buffers (the same convention as the shipped presets)."""


def measure_device(device: torch.device, dtype: torch.dtype, *, quick: bool) -> DeviceNumbers:
    """Matmul and attention FLOP/s and copy bandwidth at the training precision."""
    cuda = device.type == "cuda"
    reps = dict(warmup=2, repeats=3 if quick else 5)
    # Sizes large enough to reach steady-state throughput, small enough to take well under a
    # second: 8192^3 is where an H200 reaches its ~790 TFLOP/s bf16 (measured on
    # the H200 this project borrows; datasheet dense bf16 989 TFLOP/s).
    n = 8192 if cuda else (512 if quick else 1024)
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    mm_s = median_time(lambda: a @ b, device, **reps)
    matmul = 2.0 * n**3 / mm_s

    heads, seq, hd = (32, 8192, 128) if cuda else (8, 512 if quick else 1024, 64)
    q = torch.randn(1, heads, seq, hd, device=device, dtype=dtype)
    attn_s = median_time(lambda: F.scaled_dot_product_attention(q, q, q), device, **reps)
    # Full (non-causal) attention: QK^T and PV, 2 * seq^2 * hd FLOPs each per head.
    attention = 4.0 * heads * seq * seq * hd / attn_s

    elems = (1 << 28) if cuda else (1 << 23)
    src = torch.empty(elems, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    copy_s = median_time(lambda: dst.copy_(src), device, **reps)
    bw = 2.0 * src.nelement() * 4 / copy_s  # a copy reads and writes every byte

    memory = None
    if cuda:
        memory = torch.cuda.get_device_properties(device).total_memory * (1 - MEMORY_RESERVE)
    name = str(dtype).replace("torch.", "")
    notes = {
        "matmul_flops": f"torch.matmul {n}^3 {name}: {matmul / 1e12:.3g} TFLOP/s",
        "attention_flops": f"scaled_dot_product_attention {seq} tokens, {heads} heads x {hd}, {name}: "
                           f"{attention / 1e12:.3g} TFLOP/s",
        "memory_bw_bytes_per_s": f"{src.nelement() * 4 >> 20} MiB fp32 copy_: {bw / 1e9:.3g} GB/s (read + write)",
    }
    if memory is not None:
        notes["memory_bytes"] = (f"device total {torch.cuda.get_device_properties(device).total_memory / 2**30:.1f} GiB "
                                 f"minus {MEMORY_RESERVE:.0%} reserved (context, fragmentation, NCCL)")
    return DeviceNumbers(matmul, attention, bw, memory, notes)
