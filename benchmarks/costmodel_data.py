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
    sustained: bool = False
    """Measured at the clock a long run holds, not in a burst (compared with matmul_flops x
    sustained_clock)."""


GEMM = [
    Gemm("h100-sxm", "H100 SXM MAMF (6144x17920x2816)", 792.1, MAMF),
    Gemm("a100-80gb", "A100 SXM MAMF (6912x16384x2048)", 267.9, MAMF),
    Gemm("h200-sxm", "H200 MAMF, boost-clock burst", 828.0, MAMF_H200),
    Gemm("h200-sxm", "H200 MSMF, sustained at the saturated clock", 702.9, MAMF_H200, sustained=True),
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


# ---------------------------------------------------------------------------------------------
# Richer data for pricing whole published training runs as they were run (issue 54). Everything
# below is a published number with its source; "inferred" fields say how they were inferred.
# Nothing above is changed: GEMM, ATTENTION, COLLECTIVES, ALPHA_BETA, E2E and MPT_7B stay as the
# report reads them.
# ---------------------------------------------------------------------------------------------

TITAN = "pytorch/torchtitan"
FOUNDRY_README = "mosaicml/llm-foundry scripts/train/benchmarking/README.md"
FOUNDRY_CFG = ("llm-foundry b2a43a147 (PR #543, 2023-10-19, the commit that wrote these tables): "
               "scripts/train/benchmarking/{submit_benchmarks.py,sweep.sh}, scripts/train/yamls/pretrain/mpt-*.yaml")
FMS = "foundation-model-stack/fms-fsdp README.md (ed74fd5, 2024-05-09, 'update numbers with compile')"

MODELS: dict[str, dict] = {
    "mpt-7b-bench": {
        "name": "mpt-7b-bench", "num_layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 32,
        "ffn_hidden": 16384, "vocab": 50368, "mlp": "gelu", "tied_embeddings": True,
        "norm": "layernorm-lowp", "positions": "learned", "fused_qkv": True, "biases": True,
        "source": f"{FOUNDRY_CFG}: mpt-7b.yaml d_model 4096, 32 heads/layers, expansion 4, vocab_size 50368; "
                  "MPT defaults: learned position table (max_seq_len x d_model), biases on, LayerNorm with bias "
                  "(low_precision_layernorm), GELU MLP, tied embeddings. Checked: these give the README's NumParams "
                  "exactly (6,654,664,704 at 1K, 6,918,905,856 at 64K)."},
    "mpt-13b-bench": {
        "name": "mpt-13b-bench", "num_layers": 40, "hidden": 5120, "heads": 40, "kv_heads": 40,
        "ffn_hidden": 20480, "vocab": 50368, "mlp": "gelu", "tied_embeddings": True,
        "norm": "layernorm-lowp", "positions": "learned", "fused_qkv": True, "biases": True,
        "source": f"{FOUNDRY_CFG}: mpt-13b.yaml d_model 5120, 40 heads/layers, expansion 4, vocab 50368; same "
                  "MPT defaults; reproduces the README's NumParams 12,848,711,680 at 1K exactly."},
    "llama3-8b": {
        "name": "llama3-8b", "num_layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8,
        "ffn_hidden": 14336, "vocab": 128256, "mlp": "swiglu", "tied_embeddings": False,
        "source": f"{TITAN} torchtitan/models/llama/__init__.py '8B' (dim 4096, 32 layers, 32 heads, 8 kv heads, "
                  "ffn_dim_multiplier 1.3, multiple_of 1024 -> 14336), Llama-3 tokenizer 128,256; RoPE, RMSNorm, "
                  "no biases. 8.03e9 parameters reproduce the published MFU (see RUNS)."},
    "llama2-7b": {
        "name": "llama2-7b", "num_layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 32,
        "ffn_hidden": 11008, "vocab": 32000, "mlp": "swiglu", "tied_embeddings": False,
        "source": "Llama-2-7B shape (fms-fsdp model_variant '7b', vocab_size 32000 in fms_fsdp/config/training.py)"},
    "llama2-13b": {
        "name": "llama2-13b", "num_layers": 40, "hidden": 5120, "heads": 40, "kv_heads": 40,
        "ffn_hidden": 13824, "vocab": 32000, "mlp": "swiglu", "tied_embeddings": False,
        "source": "Llama-2-13B shape (fms-fsdp model_variant '13b'); reproduces fms-fsdp's MFU 0.61 at 2150 tok/s"},
    "gpt-7b-flexsp": {
        "name": "gpt-7b-flexsp", "num_layers": 32, "hidden": 4096, "heads": 64, "kv_heads": 64,
        "ffn_hidden": 16384, "vocab": 50257, "mlp": "gelu", "tied_embeddings": True,
        "norm": "layernorm", "positions": "learned", "fused_qkv": True, "biases": True,
        "source": "PKU-DAIR/Hetu-Galvatron branch flexsp, galvatron/models/gpt_hf/meta_configs/gpt-7b.json: "
                  "n_layer 32, n_embd 4096, n_head 64, head_dim 64 (not 128), vocab 50257; GPT2LMHeadModel "
                  "(HF GPT-2 layout: 4h GELU MLP, biases, LayerNorm, learned positions, tied LM head)."},
}
"""Model shapes as the runs used them, keyed as RUNS name them (keys fit dcp's ModelSpec). The
existing MPT_7B above says vocab 50432 (the HF MPT-7B vocabulary); llm-foundry's benchmark yaml
used 50368, and neither position table nor biases are in ModelSpec."""


@dataclass(frozen=True, kw_only=True)
class GpuVariant:
    """One GPU SKU as a published run used it. None: not published (never filled in by guess)."""

    name: str
    memory_gb: float
    memory_type: str
    memory_tb_s: float
    power_w: float | None
    bf16_dense_tflops: float | None
    sm_clock_mhz: float | None
    mamf_tflops: float | None
    """Best bf16 matmul measured over a shape search (stas00 MAMF), None where none is published."""
    source: str


STAS = "stas00/ml-engineering compute/accelerator/README.md"
GPU_VARIANTS = {
    "h100-sxm5-80gb-700w": GpuVariant(
        name="H100 SXM5 80GB HBM3, 700 W", memory_gb=80, memory_type="HBM3", memory_tb_s=3.35, power_w=700,
        bf16_dense_tflops=989, sm_clock_mhz=1830, mamf_tflops=794.5,
        source=f"{STAS}: memory table (80 GB HBM3, 3.35 TBps), TFLOPS table (989 dense bf16, 1830 MHz reproduces "
               "it), MAMF table (794.5 at 2048x2048x13312, torch 2.7.0); 700 W: nvidia-smi cap of 'NVIDIA H100 80GB "
               "HBM3' in NVIDIA/nccl issue 1264 and the '700W TDP' in torchtitan's benchmark note"),
    "h100-sxm5-96gb-500w": GpuVariant(
        name="H100 SXM 96GB HBM2e at the 500 W default limit (Meta Grand Teton)", memory_gb=96,
        memory_type="HBM2e", memory_tb_s=2.4, power_w=500, bf16_dense_tflops=None, sm_clock_mhz=None,
        mamf_tflops=None,
        source=f"{TITAN} benchmarks/llama3_h100_202412_torchtitan.md 'Hardware' (96GB HBM2e, 2.4 TB/sec, default "
               "500W power limit, 400 Gb/s RDMA per GPU) and its footnote 2: 'the actual peak TFLOPs number is "
               "between SXM and NVL, and we don't know its exact value'. docs/performance.md at 3faaa1a0d calls "
               "the same part 'HBM2e based lower TDP SXM H100(95GB)'. Clock and achievable matmul rate: not published."),
    "h100-pcie-80gb": GpuVariant(
        name="H100 PCIe 80GB", memory_gb=80, memory_type="HBM3 (per the table)", memory_tb_s=2.0, power_w=None,
        bf16_dense_tflops=756, sm_clock_mhz=None, mamf_tflops=None,
        source=f"{STAS}: TFLOPS table (756 bf16) and memory table (80, 2.00 TBps); bracket only, no run used it"),
    "a100-sxm4-80gb": GpuVariant(
        name="A100 SXM4 80GB", memory_gb=80, memory_type="HBM2e", memory_tb_s=2.0, power_w=None,
        bf16_dense_tflops=312, sm_clock_mhz=1410, mamf_tflops=271.2,
        source=f"{STAS}: memory table (80 GB HBM2e, 2.00 TBps), TFLOPS table (312, 1410 MHz), MAMF 271.2 "
               "(1024x10240x5120, torch 2.6.0; the GEMM list above keeps an older snapshot's 267.9)"),
    "h200-sxm-141gb": GpuVariant(
        name="H200 SXM 141GB HBM3e", memory_gb=141, memory_type="HBM3e", memory_tb_s=4.8, power_w=None,
        bf16_dense_tflops=989, sm_clock_mhz=1830, mamf_tflops=None,
        source=f"{STAS}: memory table (141, HBM3e, 4.80 TBps), note 12 (1830 MHz for H200 and H100); MAMF row "
               "says 'H200 is the same' as H100 SXM"),
}
"""GPU variants of the published runs. The torchtitan H100s are not the 700 W HBM3 part."""


@dataclass(frozen=True, kw_only=True)
class Run:
    """One published training measurement with the configuration that produced it."""

    source_id: str
    """Independence group: rows with the same id share software and cluster (hold out by id)."""
    model: str
    """Key in MODELS."""
    gpu: str
    """Key in GPU_VARIANTS."""
    num_gpus: int
    gpus_per_node: int
    fabric: str
    """Inter-node network as the source states it; '' where the run is one node."""
    sharding: str
    """The framework's own words for the data-parallel sharding."""
    zero_stage: int
    """3: parameters gathered per layer (FSDP FULL_SHARD / HYBRID_SHARD, FSDP2); 0: replicated."""
    shard_group: int | None = None
    """Ranks one shard spans (HSDP); None: all data-parallel ranks."""
    tp: int = 1
    sp: int = 1
    cp: int = 1
    pp: int = 1
    seq_len: int
    micro_batch: int
    grad_accum: int
    checkpointing: str
    """none, full (every block recomputed), selective-op (torchtitan op policy: per block, every
    second mm recomputed, the other mm and SDPA outputs saved), selective-layer (every Nth block),
    mlp (FlexSP: the MLP of some blocks)."""
    checkpoint_detail: str = ""
    compiled: bool
    compile_detail: str = ""
    attention: str
    """Kernel: triton-fa (llm-foundry's Triton FlashAttention, FA1 era), flash-attn-2 (Dao-AILab),
    sdpa-flash (PyTorch SDPA's built-in FlashAttention-2 backend), cudnn, fa3."""
    precision: str
    optimizer: str
    loss: str
    norm: str
    tokens_per_gpu_s: float
    """Training tokens per second per GPU (padding-free fixed-length samples in every run here)."""
    mfu_reported: float | None = None
    """The source's own MFU in percent (its own convention, see metric_note), None if none."""
    metric_note: str
    inferred: tuple[str, ...] = ()
    """'field: why' for every configuration field the source does not state."""
    software: str = ""
    source: str

    @property
    def tokens_per_gpu_per_step(self) -> int:
        """micro_batch samples per data-parallel rank, each spread over sp x cp GPUs."""
        return self.micro_batch * self.grad_accum * self.seq_len // (self.sp * self.cp)

    @property
    def step_s(self) -> float:
        """Step time implied by the throughput (tokens per GPU per step / tokens per GPU-second)."""
        return self.tokens_per_gpu_per_step / self.tokens_per_gpu_s


_FOUNDRY_COMMON = dict(
    source_id="llm-foundry", sharding="Composer FSDP (torch FSDP1) FULL_SHARD, limit_all_gathers", zero_stage=3,
    compiled=False, attention="triton-fa",
    precision="amp_bf16 (autocast bf16, fp32 master weights), FSDP mixed_precision DEFAULT",
    optimizer="Composer decoupled_adamw", loss="fused_crossentropy (flash-attn xentropy CUDA kernel)",
    norm="low_precision_layernorm (LayerNorm in bf16)",
    metric_note="README column 'Throughput (T/s/GPU)'; MFU column = (6N + 12*L*d*s) tokens/s / peak, peak "
                "989 TF for h100 (collect_results.py maps h100 -> 'h100-sxm') and 312 TF for a100; checked "
                "against the 7B rows to 0.1%",
    software="mosaicml/pytorch:2.1.0_cu121 image (sweep.sh IMAGE), flash-attn 1.0.9 + triton-pre-mlir (setup.py "
             "extras 'gpu'); runs are 12 steps on train_small",
)
_FOUNDRY_INFERRED = (
    "attention: the README does not say; sweep.sh passes no --attn_impl, submit_benchmarks.py defaulted to "
    "'triton' at b2a43a147 (it became 'flash' in 495218376, 2024-04, after the tables) and mpt-*.yaml say triton",
    "precision reduce dtype: Composer's FSDP 'DEFAULT' mixed precision, not spelled out in the README",
    "checkpointing: 'True' in the README is Composer activation_checkpointing of every MPT block (non-reentrant)",
)


def _foundry(gpu: str, model: str, table: str, rows, num_gpus: int = 8, fabric: str = "") -> list[Run]:
    out = []
    for seq, mb, ga, ckpt, tps, mfu in rows:
        out.append(Run(
            **_FOUNDRY_COMMON, model=model, gpu=gpu, num_gpus=num_gpus, gpus_per_node=8, fabric=fabric,
            seq_len=seq, micro_batch=mb, grad_accum=ga, checkpointing="full" if ckpt else "none",
            tokens_per_gpu_s=tps, mfu_reported=mfu,
            inferred=_FOUNDRY_INFERRED + (
                ("gpu: README says h100_80gb; its MFU script assumes SXM (989 TF), variant not stated",)
                if gpu.startswith("h100") else ()) + (
                ("fabric: the H100 cluster's network is not stated",) if num_gpus > 8 and gpu.startswith("h100")
                else ()),
            source=f"{FOUNDRY_README}, table '{table}', row {model.split('-')[1]} {seq} x {num_gpus} GPUs; {FOUNDRY_CFG}"))
    return out


_H = "H100 80GB BF16"
_HL = "H100 80GB BF16 (Large Scale, >= 128 GPUs)"
_A = "A100 80GB with 1600 Gbps node-node interconnect (RoCE)"
RUNS: list[Run] = (
    _foundry("h100-sxm5-80gb-700w", "mpt-7b-bench", _H, [
        (1024, 64, 2, True, 10203, 42.83), (2048, 6, 1, False, 10643, 46.44), (4096, 16, 2, True, 8611, 40.42),
        (8192, 8, 2, True, 6935, 37.14), (32768, 2, 2, True, 3318, 30.94), (65536, 1, 2, True, 1956, 28.59)])
    + _foundry("a100-sxm4-80gb", "mpt-7b-bench", _A, [
        (1024, 64, 2, True, 4357, 58.01), (2048, 6, 2, False, 4641, 64.23), (4096, 16, 2, True, 3684, 54.84),
        (8192, 8, 2, True, 3206, 54.47), (16384, 4, 2, True, 2453, 51.96), (32768, 2, 2, True, 1672, 49.46),
        (65536, 1, 2, True, 1013, 46.97)])
    + _foundry("h100-sxm5-80gb-700w", "mpt-13b-bench", _H, [
        (1024, 40, 3, True, 5502, 44.27), (2048, 2, 1, False, 4792, 39.79), (4096, 10, 3, True, 4717, 41.6),
        (16384, 3, 3, True, 2985, 35.55), (32768, 1, 3, True, 1976, 31.68)])
    + _foundry("a100-sxm4-80gb", "mpt-13b-bench", _A, [
        (1024, 40, 3, True, 2330, 59.48), (2048, 2, 3, False, 2262, 59.57), (4096, 10, 3, True, 2060, 57.62),
        (8192, 5, 3, True, 1795, 56.07), (16384, 3, 3, True, 1431, 54.07), (32768, 1, 3, True, 1016, 51.69)])
    + [r for n, tps, mfu in ((16, 4767, 39.58), (32, 4811, 39.95), (64, 4800, 39.86))
       for r in _foundry("h100-sxm5-80gb-700w", "mpt-13b-bench", _H, [(2048, 2, 1, False, tps, mfu)], n, "not stated")]
    + [r for n, tps, mfu in ((128, 10475, 45.71), (256, 10119, 44.15), (512, 9670, 42.2))
       for r in _foundry("h100-sxm5-80gb-700w", "mpt-7b-bench", _HL, [(2048, 6, 1, False, tps, mfu)], n, "not stated")]
)

_TT_DEC = "9dec370ad26b (2024-12-26)"
_TITAN_H100 = dict(
    source_id="torchtitan", model="llama3-8b", gpu="h100-sxm5-96gb-500w", gpus_per_node=8,
    sharding="FSDP2 fully_shard per TransformerBlock, reshard_after_forward except the last block",
    zero_stage=3, seq_len=8192, micro_batch=2, grad_accum=1, checkpointing="selective-op",
    checkpoint_detail="per block: save outputs of mm (except every second mm), SDPA flash/efficient, "
                      "reduce_scatter, abs, max; recompute the rest (parallelize_llama.py _save_list)",
    attention="sdpa-flash",
    precision="FSDP2 MixedPrecisionPolicy param bf16, reduce fp32 (config defaults); fp32 sharded master weights",
    optimizer="torch AdamW foreach (optimizer.fused defaults to off)",
    loss="F.cross_entropy on logits.float() (fp32 upcast), never compiled (train.py loss_fn)",
    norm="rmsnorm (plain torch RMSNorm; config norm_type); RoPE via complex fp32 (view_as_complex)",
    metric_note="TPS/GPU read at iteration 90 (average over 10 iterations, tokens on the rank / time); "
                "MFU check: tps x (6 x 7.50e9 non-embedding params + 12 x 32 x 4096 x 8192) / 989e12 gives 33.7% "
                "eager and 39.0% compiled; the note's '33% to 39% (with or without torch.compile, respectively)' "
                "has the order reversed",
    software=f"torch 1963fc8 (2024-12-23), torchao eab345c, torchtitan {_TT_DEC}",
)
_TITAN_H100_INFERRED = (
    "seq_len: not in the table; train_configs/llama3_8b.toml at 9dec370 says 8192 and only 8192 reproduces the "
    "33%/39% MFU",
    "checkpointing mode: the table says 'Selective'; the toml's selective_ac_option is 'op'",
    "attention: torchtitan calls F.scaled_dot_product_attention(is_causal=True); torch had made cuDNN attention "
    "opt-in (pytorch/pytorch PR 138522, Oct 2024) and issue 142132 (nightly 2024-12-04) confirms SDPA did not pick "
    "cuDNN on H100, so the FLASH_ATTENTION backend (FA2) ran",
)
_TITAN_TABLE = f"{TITAN} benchmarks/llama3_h100_202412_torchtitan.md"
_TITAN_A100 = dict(
    source_id="torchtitan-a100", model="llama3-8b", gpu="a100-sxm4-80gb", gpus_per_node=8,
    sharding="FSDP2 fully_shard per TransformerBlock, reshard_after_forward except the last block",
    zero_stage=3, seq_len=8192, micro_batch=1, grad_accum=1, compiled=False, attention="sdpa-flash",
    precision="FSDP2 MixedPrecisionPolicy param bf16, reduce fp32", optimizer="torch AdamW foreach=True",
    loss="F.cross_entropy (train.py at the time)",
)
RUNS += [
    Run(**_TITAN_H100, num_gpus=8, fabric="", compiled=False, tokens_per_gpu_s=5762, mfu_reported=None,
        inferred=_TITAN_H100_INFERRED, source=f"{_TITAN_TABLE}, Table 1 'FSDP' (8 GPUs, local batch 2, global 16)"),
    Run(**_TITAN_H100, num_gpus=8, fabric="", compiled=True,
        compile_detail="torch.compile(fullgraph=True) per TransformerBlock after AC wrapping; loss not compiled",
        tokens_per_gpu_s=6667, mfu_reported=None, inferred=_TITAN_H100_INFERRED,
        source=f"{_TITAN_TABLE}, Table 1 'FSDP + torch.compile'"),
    Run(**_TITAN_H100, num_gpus=128, fabric="RDMA backend network, 400 Gb/s per GPU (Grand Teton)", compiled=False,
        tokens_per_gpu_s=5605, mfu_reported=None, inferred=_TITAN_H100_INFERRED,
        source=f"{_TITAN_TABLE}, Table 3 'FSDP' (128 GPUs, local batch 2, global 256)"),
    Run(**_TITAN_H100, num_gpus=128, fabric="RDMA backend network, 400 Gb/s per GPU (Grand Teton)", compiled=True,
        compile_detail="torch.compile(fullgraph=True) per TransformerBlock after AC wrapping; loss not compiled",
        tokens_per_gpu_s=6514, mfu_reported=None, inferred=_TITAN_H100_INFERRED,
        source=f"{_TITAN_TABLE}, Table 3 'FSDP + torch.compile'"),
    Run(**_TITAN_A100, num_gpus=64, fabric="not stated", checkpointing="selective-layer",
        checkpoint_detail="every Nth TransformerBlock fully recomputed; N not stated",
        norm="fused_rmsnorm (Triton kernel; config norm_type)", tokens_per_gpu_s=2904, mfu_reported=56.8,
        metric_note="'WPS' = tokens on the rank / time (train.py); MFU = wps x (6 x 8.03e9 all params + 12 x 32 x "
                    "4096 x 8192) / 312e12, reproduces 56.8%",
        inferred=("seq_len, batch, norm, compile: train_configs/llama3_8b.toml at 157a12c56 (seq 8192, bs 1, "
                  "fused_rmsnorm, compile false); MFU check confirms 8192",
                  "checkpoint every Nth layer: not stated; config_manager's default selective_ac_option is '2'",
                  "attention: SDPA on A100 picks FLASH_ATTENTION (cuDNN attention did not exist in torch then)"),
        software="torchtitan 157a12c56 (2024-04-24), torch nightly of the time (not stated)",
        source=f"{TITAN} docs/performance.md at 157a12c56, 'Llama 3 performance numbers' (64 A100 80GB, FSDP2), "
               "row 8B / 1 / selective layer"),
    Run(**_TITAN_A100, num_gpus=64, fabric="not stated", checkpointing="selective-op",
        checkpoint_detail="per block: save mm outputs except every second mm, SDPA flash/efficient, reduce_scatter",
        norm="fused_rmsnorm (Triton kernel)", tokens_per_gpu_s=2973, mfu_reported=58.2,
        metric_note="as the selective-layer row; MFU reproduces 58.2%",
        inferred=("seq_len, batch, norm, compile: train_configs/llama3_8b.toml at 157a12c56",
                  "attention: SDPA FLASH_ATTENTION backend on A100"),
        software="torchtitan 157a12c56 (2024-04-24)",
        source=f"{TITAN} docs/performance.md at 157a12c56, 'Llama 3 performance numbers', row 8B / 1 / selective op"),
    Run(**_TITAN_A100, num_gpus=8, fabric="", checkpointing="selective-op",
        checkpoint_detail="torchtitan op policy (see the 64-GPU row)", norm="rmsnorm (toml at a1f9edb, 2024-06-04)",
        tokens_per_gpu_s=2630, mfu_reported=48.8,
        metric_note="steady 'wps' of steps 920-940 in the PR's log (2,632 / 2,628 / 2,631; step 910's 2,217 includes a "
                    "profiler trace dump); MFU there excludes embedding params (6 x 7.50e9 + attention) / 312e12. "
                    "With fused=True the PR reports 'wps + ~100, mfu + 1.5-2%' (no exact figure)",
        inferred=("gpu: 'A100 DevGPU'; 80 GB inferred from the log's 'memory: 59.48GiB(75.15%)' = 79.1 GiB capacity",
                  "config: 'default llama_8b.toml' of 2024-06 (seq 8192, bs 1, selective op, compile false, rmsnorm)",
                  "attention: SDPA FLASH_ATTENTION backend on A100"),
        software="torchtitan around 2024-06-05 (PR 355), torch nightly with fused AdamW for DTensor",
        source="pytorch/torchtitan PR 355 '[torchtitan][optim] Add fused as an option in train config', "
               "description logs, 'Fused = False' (8 A100, 1000 steps, 1D DP)"),
]

_FMS_COMMON = dict(
    source_id="fms-fsdp", seq_len=4096, micro_batch=2, grad_accum=1, compiled=True,
    compile_detail="torch.compile(model) on the FSDP-wrapped model", attention="sdpa-flash",
    precision="FSDP1 MixedPrecision bfSixteen: param, reduce and buffer dtype bf16 (fp32 sharded params)",
    optimizer="torch.optim.AdamW (default implementation: foreach on CUDA)", loss="not stated",
    norm="fms LLaMA RMSNorm, compiled", software="'latest PyTorch nightlies' (2024-05), ibm-fms",
    metric_note="README 'Training Throughput tokens/sec/GPU'; MFU per nanoGPT/PaLM: tps x (6N + 12 x L x H x Q x T)"
                " / peak (312 A100, 989 H100) reproduces the MFU table (0.68 / 0.46 for 7B, 0.61 / 0.43 for 13B)",
)
_FMS_INFERRED = ("seq_len: fms_fsdp/config/training.py default 4096 (README: '4k context length'); MFU table "
                 "reproduces only with 4096",
                 "attention: README says 'SDPA implementation of Flash attention v2'",)
RUNS += [
    Run(**_FMS_COMMON, model="llama2-7b", gpu="a100-sxm4-80gb", num_gpus=128, gpus_per_node=8,
        fabric="'400Gbps' (README column header; per node or per GPU not stated)",
        sharding="FSDP1 HYBRID_SHARD (HSDP)", zero_stage=3, shard_group=8, checkpointing="none",
        tokens_per_gpu_s=4550, mfu_reported=68.0,
        inferred=_FMS_INFERRED + ("shard_group: torch FSDP1 HYBRID_SHARD default shards within a node",),
        source=f"{FMS}, 'Training throughput benchmarks', row 7b HSDP / Y / No AC / 2, A100 column"),
    Run(**_FMS_COMMON, model="llama2-7b", gpu="h100-sxm5-80gb-700w", num_gpus=96, gpus_per_node=8,
        fabric="'800 Gbps' (README column header)", sharding="FSDP1 HYBRID_SHARD (HSDP)", zero_stage=3,
        shard_group=8, checkpointing="none", tokens_per_gpu_s=9600, mfu_reported=46.0,
        inferred=_FMS_INFERRED + ("shard_group: HYBRID_SHARD default, one node",
                                  "gpu: 'H100 80G' in the MFU table; SXM/700 W not stated"),
        source=f"{FMS}, row 7b, H100 column"),
    Run(**_FMS_COMMON, model="llama2-13b", gpu="a100-sxm4-80gb", num_gpus=128, gpus_per_node=8,
        fabric="'400Gbps'", sharding="FSDP1 FULL_SHARD", zero_stage=3, checkpointing="selective-layer",
        checkpoint_detail="'Selective AC': fraction p of blocks (ac_handler.py) not stated", tokens_per_gpu_s=2150,
        mfu_reported=61.0, inferred=_FMS_INFERRED, source=f"{FMS}, row 13b FSDP / Y / Selective AC / 2, A100"),
    Run(**_FMS_COMMON, model="llama2-13b", gpu="h100-sxm5-80gb-700w", num_gpus=96, gpus_per_node=8,
        fabric="'800 Gbps'", sharding="FSDP1 FULL_SHARD", zero_stage=3, checkpointing="selective-layer",
        checkpoint_detail="fraction of blocks not stated", tokens_per_gpu_s=4850, mfu_reported=43.0,
        inferred=_FMS_INFERRED + ("gpu: 'H100 80G'; SXM/700 W not stated",),
        source=f"{FMS}, row 13b, H100 column"),
]
"""Whole training runs, bf16 only (every Float8 row of these sources is left out). Sources are
independent by source_id: llm-foundry (Composer, Triton attention), torchtitan (H100 Grand Teton),
torchtitan-a100 (same framework, other cluster, 2024-04/06), fms-fsdp (IBM, compiled FSDP1), and
FlexSP's fit (FLEXSP below, not a Run: it publishes a cost fit, not a throughput table)."""


@dataclass(frozen=True, kw_only=True)
class FlexSPFit:
    """FlexSP's published per-sample cost fit for one model: a sequence of L tokens on an SP group of
    d GPUs costs (a1 L^2 + a2 L) / d ms of compute, plus beta ms per group and step, plus its
    all-to-all volume 4 x 2 x layers x hidden x L x 2 bytes / d over the measured bandwidth."""

    model: str
    a1_ms_per_token2: float
    a2_ms_per_token: float
    beta_ms: float
    act_mb_per_token: float
    alltoall_gb_s: dict[int, float]
    """SP size -> all-to-all bandwidth the solver uses (GB/s, as the code names it)."""
    source: str

    def compute_ms(self, length: int, sp: int = 1) -> float:
        return (self.a1_ms_per_token2 * length**2 + self.a2_ms_per_token * length) / sp


_FLEXSP = ("PKU-DAIR/Hetu-Galvatron branch flexsp (b466689, 2025-03-28), galvatron/flexsp_solver/solver.py "
           "optimizer_param_dict and __main__ (the same constants in galvatron/models/gpt_hf/train_dist.py)")
FLEXSP = {
    "gpt-7b-flexsp": FlexSPFit(
        model="gpt-7b-flexsp", a1_ms_per_token2=5.128e-6, a2_ms_per_token=183.9576e-3, beta_ms=629.3563,
        act_mb_per_token=4.480441895,
        alltoall_gb_s={2: 119.54, 4: 104.07, 8: 96.5, 16: 10.33, 32: 5.94, 64: 4.87},
        source=f"{_FLEXSP}; bandwidths from the line commented '# 4k seq, 2 IB' (the one in use); earlier lines: "
               "'# 4k seq' {16: 20.01, 32: 10.53, 64: 7.77}, '# 2k seq' {2: 105.24, 4: 94.05, 8: 86.34, 16: 19.12, "
               "32: 11.01}. The all-to-all test script sets NCCL_IB_HCA=mlx5_2,mlx5_5: two IB NICs per 8-GPU node"),
    "gpt-13b": FlexSPFit(
        model="gpt-13b (hidden 5120, 40 layers)", a1_ms_per_token2=9.2852e-6, a2_ms_per_token=306.0189e-3,
        beta_ms=1132.5632, act_mb_per_token=4.220439453,
        alltoall_gb_s={2: 119.54, 4: 104.07, 8: 96.5, 16: 10.33, 32: 5.94, 64: 4.87}, source=_FLEXSP),
    "gpt-30b": FlexSPFit(
        model="gpt-30b (hidden 6656, 60 layers)", a1_ms_per_token2=15.4262e-6, a2_ms_per_token=803.5742e-3,
        beta_ms=2789.3644, act_mb_per_token=3.417381836,
        alltoall_gb_s={2: 119.54, 4: 104.07, 8: 96.5, 16: 10.33, 32: 5.94, 64: 4.87}, source=_FLEXSP),
}
FLEXSP_RUN_CONFIG = {
    "framework": "Galvatron (HF GPT2LMHeadModel), Ulysses SP with packing, per-step FlexSP plans",
    "sharding": "ZeRO-3 for the solver (sdp=1 -> zero_stage 3 in train_dist.py); launch scripts pass "
                "--default_dp_type zero2 --sdp 1",
    "checkpointing": "MLP only (GPTMLP_tp wrapped): gpt-7b 12 of 32 layers at >= 32 GPUs, all 32 at 16 GPUs",
    "attention": "flash-attn (pip 'flash-attn' at install time: FA2 varlen), head dim 64",
    "precision": "--mixed_precision bf16", "dropout": "0.1 (--dropout_prob 0.1 in both launch scripts)",
    "software": "torch 2.4.1+cu118, transformers 4.45.2 (requirements.txt)",
    "cluster": "8 nodes x 8 GPUs (64-GPU script); solver memory_limit_gb = 28",
    "gpu": "A100 per the FlexSP paper (arXiv 2412.01523); 40 GB or 80 GB NOT confirmed from any text read here",
    "not_published_here": "which configuration (GPUs, checkpointing) the a1/a2/beta fit was profiled on, and the "
                          "per-sample times it was fitted to",
}
"""How FlexSP ran (launch scripts galvatron/models/gpt_hf/scripts/train_dist_{16,64}gpus_7B_*.sh and
train_dist.py on the flexsp branch)."""


@dataclass(frozen=True)
class GemmPoint:
    hardware: str
    m: int
    n: int
    k: int
    tflops: float
    source: str


_XLA = ("tensorflow/tensorflow third_party/xla/xla/service/gpu/model/matmul_interpolator_data.h at 372d578b, "
        "kDefaultMatmulPTable key 'sm_90' (XLA-compiled dot, autotuned cuBLAS/Triton), b=1, bf16xbf16->bf16; "
        "GPU SKU not named in the file (XLA's hlo_op_profiles for sm_90 name 'NVIDIA H100 80GB HBM3')")
_SM90 = {  # (m, n, k): TFLOP/s, every b=1 entry read from the table, rounded to 0.1
    (256, 256, 256): 6.5, (256, 256, 512): 11.5, (256, 256, 1024): 19.5, (256, 256, 2048): 31.1,
    (256, 256, 4096): 84.3, (256, 512, 256): 11.5, (256, 512, 512): 22.0, (256, 512, 1024): 39.1,
    (256, 512, 2048): 62.4, (256, 512, 4096): 91.7, (256, 1024, 256): 22.7, (256, 1024, 512): 41.8,
    (256, 1024, 1024): 72.5, (256, 1024, 2048): 119.0, (256, 1024, 4096): 172.3, (256, 2048, 256): 41.8,
    (256, 2048, 512): 78.2, (256, 2048, 1024): 138.1, (256, 2048, 2048): 215.8, (256, 2048, 4096): 285.9,
    (256, 4096, 256): 78.0, (256, 4096, 512): 138.1, (256, 4096, 1024): 225.2, (256, 4096, 2048): 324.6,
    (256, 4096, 4096): 412.0,
    (512, 256, 256): 11.5, (512, 256, 512): 21.8, (512, 256, 1024): 39.3, (512, 256, 2048): 60.1,
    (512, 256, 4096): 91.1, (512, 512, 256): 21.6, (512, 512, 512): 40.7, (512, 512, 1024): 71.2,
    (512, 512, 2048): 114.7, (512, 512, 4096): 174.5, (512, 1024, 256): 43.5, (512, 1024, 512): 80.5,
    (512, 1024, 1024): 138.7, (512, 1024, 2048): 216.5, (512, 1024, 4096): 309.6, (512, 2048, 256): 79.3,
    (512, 2048, 512): 143.4, (512, 2048, 1024): 232.6, (512, 2048, 2048): 342.4, (512, 2048, 4096): 430.5,
    (512, 4096, 256): 134.2, (512, 4096, 512): 236.3, (512, 4096, 1024): 373.3, (512, 4096, 2048): 522.2,
    (512, 4096, 4096): 644.1,
    (1024, 256, 256): 22.0, (1024, 256, 512): 40.9, (1024, 256, 1024): 68.3, (1024, 256, 2048): 113.2,
    (1024, 256, 4096): 169.7, (1024, 512, 256): 42.9, (1024, 512, 512): 82.2, (1024, 512, 1024): 141.3,
    (1024, 512, 2048): 220.0, (1024, 512, 4096): 298.9, (1024, 1024, 256): 82.0, (1024, 1024, 512): 145.6,
    (1024, 1024, 1024): 236.3, (1024, 1024, 2048): 350.0, (1024, 1024, 4096): 470.1, (1024, 2048, 256): 139.5,
    (1024, 2048, 512): 237.6, (1024, 2048, 1024): 373.3, (1024, 2048, 2048): 524.3, (1024, 2048, 4096): 653.5,
    (1024, 4096, 256): 209.7, (1024, 4096, 512): 338.9, (1024, 4096, 1024): 490.3, (1024, 4096, 2048): 634.2,
    (1024, 4096, 4096): 738.5,
    (2048, 256, 256): 43.6, (2048, 256, 512): 77.3, (2048, 256, 1024): 135.8, (2048, 256, 2048): 216.1,
    (2048, 256, 4096): 307.5, (2048, 512, 256): 83.9, (2048, 512, 512): 142.8, (2048, 512, 1024): 235.9,
    (2048, 512, 2048): 347.7, (2048, 512, 4096): 451.2, (2048, 1024, 256): 141.6, (2048, 1024, 512): 238.4,
    (2048, 1024, 1024): 373.3, (2048, 1024, 2048): 523.3, (2048, 1024, 4096): 653.1, (2048, 2048, 256): 213.0,
    (2048, 2048, 512): 345.5, (2048, 2048, 1024): 493.9, (2048, 2048, 2048): 632.0, (2048, 2048, 4096): 738.0,
    (2048, 4096, 256): 299.3, (2048, 4096, 512): 450.4, (2048, 4096, 1024): 594.2, (2048, 4096, 2048): 715.4,
    (2048, 4096, 4096): 753.6,
    (4096, 256, 256): 82.2, (4096, 256, 512): 137.2, (4096, 256, 1024): 217.2, (4096, 256, 2048): 304.7,
    (4096, 256, 4096): 376.2, (4096, 512, 256): 142.5, (4096, 512, 512): 238.8, (4096, 512, 1024): 370.8,
    (4096, 512, 2048): 521.7, (4096, 512, 4096): 650.0, (4096, 1024, 256): 216.5, (4096, 1024, 512): 343.7,
    (4096, 1024, 1024): 488.1, (4096, 1024, 2048): 632.0, (4096, 1024, 4096): 738.5, (4096, 2048, 256): 304.0,
    (4096, 2048, 512): 447.0, (4096, 2048, 1024): 593.2, (4096, 2048, 2048): 716.1, (4096, 2048, 4096): 758.4,
    (4096, 4096, 256): 392.2, (4096, 4096, 512): 543.1, (4096, 4096, 1024): 677.4, (4096, 4096, 2048): 738.7,
    (4096, 4096, 4096): 783.3,
}
GEMM_BY_SHAPE = [GemmPoint("h100-sm90 (variant not stated)", m, n, k, v, _XLA) for (m, n, k), v in _SM90.items()]
"""bf16 GEMM rate by shape, M = rows of the activation (tokens), up to 4096 in every dimension.
The same table at larger b (2, 4: batched) is in the file and not copied. No A100 (sm_80) or
500 W H100 table was found; none for N or K = 14336."""


@dataclass(frozen=True)
class AttentionCurve:
    """Attention forward + backward TFLOP/s by length, counted as the FlashAttention-2 benchmark
    counts: forward 4 x s^2 x heads x head_dim per sample (halved when causal), backward 2.5 x the
    forward, combined 3.5 x; batch x s = 16K tokens, hidden 2048 (heads = 2048 / head_dim)."""

    hardware: str
    kernel: str
    causal: bool
    head_dim: int
    length: int
    tflops_fwd_bwd: float
    source: str


_FA2_A100 = ("Dao-AILab/flash-attention assets/flash2_a100_fwd_bwd_benchmark.png (FlashAttention-2 release "
             "4f285b35, 2023-07-17; the FA2 paper's A100 figure), A100 80GB SXM4")
_FA2_H100 = "Dao-AILab/flash-attention assets/flash2_h100_fwd_bwd_benchmark.png (same release), H100 80GB SXM5"
_LENS = (512, 1024, 2048, 4096, 8192, 16384)


def _curves(hw: str, src: str, panel: str, causal: bool, hd: int, by_kernel: dict) -> list[AttentionCurve]:
    return [AttentionCurve(hw, kernel, causal, hd, n, v, f"{src}, panel {panel}")
            for kernel, values in by_kernel.items() for n, v in zip(_LENS, values, strict=True) if v is not None]


ATTENTION_FWD_BWD = (
    _curves("a100-sxm4-80gb", _FA2_A100, "(d) causal, head dim 128", True, 128, {
        "flash-attn-2": [99, 133, 155, 173, 182, 189], "flash-attn-1": [55, 62, 69, 76, 80, 83],
        "xformers": [58, 72, 82, 87, 91, 92], "triton-fa": [50, 61, 68, 74, 78, 80],
        "pytorch": [23, 28, 32, 32, 34, None]})
    + _curves("a100-sxm4-80gb", _FA2_A100, "(b) no mask, head dim 128", False, 128, {
        "flash-attn-2": [None, 173, 187, 196, 201, 203], "flash-attn-1": [76, 72, 76, 80, 82, 83],
        "xformers": [83, 91, 95, 96, 97, 98], "triton-fa": [78, 85, 90, 93, 95, 95],
        "pytorch": [53, 67, 76, 79, 86, None]})
    + _curves("a100-sxm4-80gb", _FA2_A100, "(c) causal, head dim 64", True, 64, {
        "flash-attn-2": [88, 119, 140, 156, 165, 171], "flash-attn-1": [58, 70, 77, 87, 92, 97],
        "xformers": [51, 60, 66, 68, 69, 67], "triton-fa": [59, 75, 79, 76, 79, 80],
        "pytorch": [15, 16, 17, 18, 18, None]})
    + _curves("a100-sxm4-80gb", _FA2_A100, "(a) no mask, head dim 64", False, 64, {
        "flash-attn-2": [132, 153, 162, 171, 175, 176], "flash-attn-1": [91, 92, 104, 108, 110, 110],
        "xformers": [68, 73, 76, 77, 75, 75], "triton-fa": [90, 102, 98, 98, 100, 100],
        "pytorch": [36, 40, 43, 45, 46, None]})
    + _curves("h100-sxm5-80gb-700w", _FA2_H100, "(d) causal, head dim 128", True, 128, {
        "flash-attn-2": [163, 221, 265, 294, 308, 328], "flash-attn-1": [98, 109, 108, 126, 135, 137],
        "pytorch": [40, 50, 57, 61, 63, None]})
    + _curves("h100-sxm5-80gb-700w", _FA2_H100, "(b) no mask, head dim 128", False, 128, {
        "flash-attn-2": [248, 294, 320, 326, 335, 338], "flash-attn-1": [127, 127, 128, 131, 137, 139],
        "pytorch": [93, 120, 145, 160, 167, None]})
)
"""Read off the bar labels. None: no label (the A100 no-mask 512 FA2 label is under the legend;
PyTorch is OOM at 16K). Three labels sit partly under the legend and were read as 173 (A100,
no mask, hd 128, 1K), 153 (A100, no mask, hd 64, 1K) and 294 (H100, no mask, hd 128, 1K). 'triton-fa' is the figure's
'FlashAttention Triton': the repo's benchmark script of 2023-07-28 (60499abc) times
triton.ops.flash_attention (OpenAI Triton's op) as 'Triton', so that is the kernel, inferred.
llm-foundry's attn_impl 'triton' is a different file (llmfoundry/models/layers/flash_attn_triton.py,
Tri Dao's port of the same Tillet kernel with bias support, on triton-pre-mlir); its docstring says
'Triton forward is generally faster than CUDA forward, while Triton backward is generally slower
... Overall Triton forward + backward is slightly slower than CUDA' (CUDA = FlashAttention 1).
No published H100 number for either Triton kernel was found; FA1's H100 curve is the nearest."""

A100_FABRIC = [
    Collective("a100-80gb", "all_reduce", 8, 2, 1 << 33, 91.0, False,
               "NVIDIA/nccl-tests issue 100: 2 HGX A100-SXM-80GB nodes, 4x ConnectX-6 200 Gb/s per node, "
               "all_reduce_perf -b 1G -e 8G: busbw 'can reach 91GB/s' (peak over 1-8 GiB)"),
    Collective("a100-80gb", "all_reduce", 8, 2, 1 << 32, 86.0, False,
               "NVIDIA/nccl-tests issue 175 (= NVIDIA/nccl issue 1048): 2 nodes of 8 A100, 4x 200 Gb dual-port "
               "NICs, -b 8 -e 4G: 86 GB/s between two nodes (theory 96-100 GB/s)"),
    Collective("a100-80gb", "all_reduce", 8, 1, 1 << 32, 232.54, False,
               "NVIDIA/nccl-tests issue 175: the same A100 node alone, all_reduce_perf -b 8 -e 4G -g 8: 232.54 GB/s"),
    Collective("a100-40gb", "all_reduce", 8, 3, 1 << 27, 96.0, False,
               "NVIDIA/nccl-tests issue 119: 3 nodes of 8 A100-SXM4-40GB, 4x HDR per node, -e 128M: peak about "
               "96 GB/s, average 84.8 GB/s (theory 100 = 4 x 200 Gb / 8)"),
]
"""A100 multi-node NCCL points found, all on 4 HDR NICs per 8-GPU node (100 Gb/s per GPU). No
published nccl-tests curve for 8x HDR (200 Gb/s per GPU, DGX A100 / llm-foundry's '1600 Gbps
RoCE') across 2-8 nodes was found. The maintainers' reading in these threads: all-reduce busbw
across nodes tops out at the node's summed NIC rate (4 x 25 GB/s = 100 here); by that rule an
8x HDR node would give about 200 GB/s (NIC line rate, derived, not measured), and NCCL reaches
46-48 GB/s of a 400 Gb/s NIC (NVIDIA/nccl-tests issue 290), i.e. 92-96% of line rate."""

OPTIMIZER_STEP = [
    ("torchtitan PR 881 (2025-02, 'use Fused AdamW as default'): fused vs foreach AdamW, Llama 3 8B: +2.24% "
     "throughput FSDP eager, +1.63% FSDP compiled, +3.62% TP (GPU not stated in the description)"),
    ("torchtitan PR 355 (2024-06): 8 A100, Llama 3 8B, FSDP, 8K x 1: fused AdamW 'wps + ~100, mfu + 1.5-2%' over "
     "foreach (about 2,630 wps foreach)"),
    ("pytorch/pytorch issue 134191: AdamW 2.5% of step time with FSDP1 vs 33% with FSDP2 on an image model with "
     "many small weights (CPU-bound foreach over DTensor); not an LLM figure"),
]
"""Published optimizer-step costs, as relative figures only: no source gives the step in ms for
a 7-8B model. torchtitan runs used foreach AdamW (fused off) in every RUNS row; llm-foundry used
Composer's DecoupledAdamW; fms-fsdp torch AdamW defaults."""
