"""Published measurements the cost model is checked against (benchmarks/costmodel.py), each with its
source. Nothing here is a dcp measurement; "fitted" marks the figures a shipped preset was fitted
on, so that the report can tell reproduction from prediction."""

from __future__ import annotations

from dataclasses import dataclass

MAMF = ("stas00/ml-engineering, compute/accelerator/README.md, Maximum Achievable Matmul FLOPS "
        "comparison table (bf16, best shape of a search)")
MAMF_H200 = ("stas00/ml-engineering, compute/accelerator/benchmarks/README.md, mamf-finder on one H200 alone "
             "(bf16, torch 2.14 nightly)")
FA3 = "FlashAttention-3 paper (arXiv 2407.08608), H100 SXM5, head dim 128, 16K tokens per batch, hidden 2048"
VP = "Voltage Park 32x H100 (4 nodes x 8, 8x400G InfiniBand, NCCL 2.24.3), github.com/aigatech/vpbenchmarking"
FOUNDRY = "mosaicml/llm-foundry, scripts/train/benchmarking/README.md (MPT-7B, FSDP FULL_SHARD, amp_bf16, 8 GPUs)"


@dataclass(frozen=True)
class Gemm:
    hardware: str
    what: str
    tflops: float
    source: str


GEMM = [
    Gemm("h100-sxm", "H100 SXM MAMF (6144x17920x2816)", 792.1, MAMF),
    Gemm("a100-80gb", "A100 SXM MAMF (6912x16384x2048)", 267.9, MAMF),
    Gemm("h200-sxm", "H200 MAMF, boost-clock burst", 828.0, MAMF_H200),
    Gemm("h200-sxm", "H200 MSMF, sustained at the saturated clock", 702.9, MAMF_H200),
]


@dataclass(frozen=True)
class Attention:
    kernel: str
    direction: str
    causal: bool
    length: int
    tflops: float
    source: str


def _attention(kernel: str, direction: str, causal: bool, values: list[float], figure: str) -> list[Attention]:
    lengths = [512, 1024, 2048, 4096, 8192, 16384]
    return [Attention(kernel, direction, causal, n, v, f"{FA3}, {figure}") for n, v in zip(lengths, values, strict=True)]


ATTENTION = (
    _attention("flash-attn-2", "fwd", True, [191, 260, 298, 319, 333, 335], "Fig. 5, causal")
    + _attention("flash-attn-2", "fwd", False, [309, 350, 362, 368, 370, 370], "Fig. 5, no causal mask")
    + _attention("flash-attn-2", "bwd", False, [214, 260, 291, 310, 318, 322], "Fig. 6")
    + _attention("flash-attn-3", "fwd", True, [292, 423, 521, 579, 602, 616], "Fig. 5, causal")
    + _attention("flash-attn-3", "bwd", False, [316, 424, 501, 542, 559, 561], "Fig. 6")
    + _attention("cudnn", "fwd", True, [315, 410, 484, 518, 529, 539], "Fig. 5, causal")
    + _attention("cudnn", "bwd", False, [305, 408, 465, 499, 518, 516], "Fig. 6")
)
"""The h200-sxm / h100-sxm presets were fitted on flash-attn-2's causal forward and its backward;
the other kernels' rows check that the same two-term form fits them (each with its own fit)."""


@dataclass(frozen=True)
class Collective:
    hardware: str
    op: str
    gpus_per_node: int
    nodes: int
    message_bytes: int
    bus_gbps: float
    fitted: bool
    source: str


_SIZES = [1 << 16, 1 << 20, 1 << 24, 1 << 28, 1 << 30, 1 << 33]
_VP_RUNS = {
    ("all_reduce", 1): ([3.41, 47.37, 233.25, 422.38, 468.53, 479.72], "results/nccl/nccl_allreduce_20260224_223444.txt"),
    ("all_reduce", 4): ([2.11, 21.97, 119.48, 239.78, 324.48, 330.93],
                        "results/nccl/nccl_multinode/nccl_allreduce_20260224_225706.txt"),
    ("all_gather", 4): ([1.07, 9.27, 69.74, 235.32, 320.55, 323.53],
                        "results/nccl/nccl_multinode/nccl_allgather_20260224_225706.txt"),
    ("broadcast", 4): ([2.23, 9.13, 63.53, 230.21, 239.23, 286.34],
                       "results/nccl_multinode/nccl_broadcast_20260224_225706.txt"),
}
COLLECTIVES = [
    Collective("h100-sxm", op, 8, nodes, m, bw, True, f"{VP}, {path}")
    for (op, nodes), (values, path) in _VP_RUNS.items() for m, bw in zip(_SIZES, values, strict=True)
] + [
    Collective("h200-sxm", "all_reduce", 8, 1, 1 << 32, 475.0, False,
               "8x H200 all_reduce_perf, peak busbw at 4 GiB (NVIDIA/nccl-tests issue 272)"),
    Collective("h100-sxm", "all_reduce", 8, 4, 1 << 33, 320.0, False,
               "4 nodes of 8 H100 with 8x400G RoCE, 4-8 GB: ~320 GB/s busbw (NVIDIA/nccl issue 1221)"),
    Collective("h100-sxm", "all_reduce", 8, 2, 1 << 33, 430.0, True,
               "2 nodes of 8 H100 with NVLink SHARP: ~430 GB/s busbw (NVIDIA/nccl issue 1221)"),
    Collective("h100-sxm", "all_to_all", 4, 1, 524_288_000, 334.9, True,
               "4x H100 alltoall_perf at 500 MB (NVIDIA/nccl issue 2169)"),
    Collective("h100-sxm", "all_to_all", 8, 1, 1 << 30, 370.0, True,
               "NCCL's effective NVLink 4 bus bandwidth for non-all-reduce collectives (NVIDIA/nccl-tests issue 212)"),
]
"""Bus bandwidth (GB/s) at a message size. `fitted`: a preset's curve holds this very point (the
row checks the lookup); the others are not in any preset."""

ALPHA_BETA = [c for c in COLLECTIVES if c.source.startswith(VP)]
"""The published curves the linear (latency + bytes / bandwidth) form is checked against."""


@dataclass(frozen=True)
class Throughput:
    hardware: str
    seq_len: int
    micro_batch: int
    grad_accum: int
    checkpointing: bool
    tokens_per_gpu_s: float
    source: str


E2E = [Throughput("h100-sxm", *row, f"{FOUNDRY}, H100 80GB BF16 table") for row in (
    (1024, 64, 2, True, 10203), (2048, 6, 1, False, 10643), (4096, 16, 2, True, 8611),
    (8192, 8, 2, True, 6935), (32768, 2, 2, True, 3318), (65536, 1, 2, True, 1956))] + [
    Throughput("a100-80gb", *row, f"{FOUNDRY}, A100 80GB table") for row in (
        (1024, 64, 2, True, 4357), (2048, 6, 2, False, 4641), (4096, 16, 2, True, 3684), (8192, 8, 2, True, 3206),
        (16384, 4, 2, True, 2453), (32768, 2, 2, True, 1672), (65536, 1, 2, True, 1013))]
"""Training tokens per second per GPU; none of these was used to fit anything."""

MPT_7B = {"name": "mpt-7b", "num_layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 32, "ffn_hidden": 16384,
          "vocab": 50432, "mlp": "gelu", "tied_embeddings": True,
          "source": "MPT-7B (mosaicml/llm-foundry): d_model 4096, 32 layers and heads, expansion 4, "
                    "vocabulary 50432, tied embeddings; its learned position table (seq_len x 4096) is left out"}
