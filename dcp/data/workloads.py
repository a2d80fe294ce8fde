"""Where sample lengths come from: files, built-in workloads, and global batches over them.

Never imports torch: the planner and the CLI use this module on machines without it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from dcp.costmodel import attention_pairs
from dcp.data.lengths import WorkloadError, read_lengths
from dcp.planner.sample import Sample

__all__ = ["Workload", "WorkloadError", "cut_batches", "global_batches", "load_workload", "lognormal",
           "opensora", "read_lengths", "wikipedia"]


@dataclass(frozen=True)
class Workload:
    """A population of samples: token counts and, for video, frame counts (same length)."""

    name: str
    tokens: np.ndarray
    frames: np.ndarray
    source: str = ""

    def __post_init__(self) -> None:
        if len(self.tokens) == 0:
            raise WorkloadError(f"workload {self.name!r} has no samples")
        bad = np.flatnonzero(self.tokens <= 0)
        if len(bad):
            raise WorkloadError(
                f"workload {self.name!r}: sample {bad[0]} has non-positive length {int(self.tokens[bad[0]])}"
            )

    def __len__(self) -> int:
        return len(self.tokens)

    def samples(self, attention: str, ids: np.ndarray | None = None) -> list[Sample]:
        """Samples (with attention pairs for the model's attention kind) for the given ids."""
        ids = np.arange(len(self)) if ids is None else ids
        out = []
        for i in ids:
            t, f = int(self.tokens[i]), int(self.frames[i])
            out.append(Sample(int(i), t, attention_pairs(attention, t, f), f))
        return out


# --------------------------------------------------------------------------------------------
# Built-in workloads
# --------------------------------------------------------------------------------------------

MAX_GENERATED_SAMPLES = 10_000_000
"""Built-in workloads draw at most this many samples (100x the shipped Wikipedia sample; more
would take gigabytes, and a few global batches need only thousands)."""


def wikipedia() -> Workload:
    """100,000 lengths sampled (seed 20241202) from the 1,000,000 tokenized Wikipedia sample
    lengths published with FlexSP (arXiv 2412.01523; PKU-DAIR/Hetu-Galvatron, Apache-2.0)."""
    data = resources.files("dcp.data") / "wikipedia_lengths_100k.txt.gz"
    with resources.as_file(data) as path:
        tokens = read_lengths(path)
    return Workload("wikipedia", tokens, np.ones_like(tokens), source=wikipedia.__doc__ or "")


def lognormal(mean: float = 1024, sigma: float = 1.5, min_tokens: int = 128, max_tokens: int = 8192,
              scale: float = 1.0, size: int = 100_000, seed: int = 0) -> Workload:
    """Megatron-LM's dynamic-CP mock lengths: lognormal with median `mean` (mu = ln mean) and
    shape `sigma`, clipped to [min, max], all multiplied by `scale` (16 turns 8K into 128K)."""
    if size > MAX_GENERATED_SAMPLES:
        raise WorkloadError(f"lognormal size={size} is more than {MAX_GENERATED_SAMPLES:,} samples")
    if not (mean > 0 and sigma > 0 and 0 < min_tokens <= max_tokens and scale > 0 and size > 0):
        raise WorkloadError(
            f"lognormal needs mean, sigma, scale, size > 0 and 0 < min <= max; got mean={mean} "
            f"sigma={sigma} min={min_tokens} max={max_tokens} scale={scale} size={size}"
        )
    rng = np.random.default_rng(seed)
    raw = np.clip(rng.lognormal(math.log(mean), sigma, size), min_tokens, max_tokens)
    tokens = np.maximum(1, np.round(raw * scale)).astype(np.int64)
    src = f"lognormal(mean={mean}, sigma={sigma}, min={min_tokens}, max={max_tokens}) x {scale}"
    return Workload("lognormal", tokens, np.ones_like(tokens), source=src)


# The DCP paper's Open-Sora benchmark (VideoSys docs/dcp.md): resolutions (H, W) and frame counts.
OPENSORA_RESOLUTIONS = {"144p": (144, 256), "240p": (240, 426), "360p": (360, 640),
                        "480p": (480, 854), "720p": (720, 1280)}
OPENSORA_FRAMES = (1, 51, 102, 204, 408)
OPENSORA_VARIANTS = ("short", "balanced", "long")


def opensora_tokens(height: int, width: int, frames: int) -> tuple[int, int]:
    """(latent frames, tokens per latent frame) after Open-Sora's VAE and patchify.

    VAE: 8x spatial and 17 -> 5 temporal compression (an image stays one frame); patch 2x2.
    720p x 408 frames -> 120 frames of 45 x 80 = 432,000 tokens (the DCP paper's benchmark,
    NUS-HPC-AI-Lab/VideoSys docs/dcp.md)."""
    latent_frames = 1 if frames == 1 else frames * 5 // 17
    per_frame = math.ceil(math.ceil(height / 8) / 2) * math.ceil(math.ceil(width / 8) / 2)
    return latent_frames, per_frame


def opensora(variant: str = "balanced", offset: float = 5.0, alpha: float = 3.0,
             size: int = 100_000, seed: int = 0) -> Workload:
    """The DCP paper's video workload: half images, half videos; each half draws its
    (resolution, frames) bucket by Zipf(alpha) over buckets sorted by pixels x frames, rank
    shifted by `offset`. short: the smallest bucket is most frequent; long: the largest;
    balanced: the buckets nearest the middle."""
    if variant not in OPENSORA_VARIANTS:
        raise WorkloadError(f"unknown opensora variant {variant!r}; expected one of {OPENSORA_VARIANTS}")
    if size > MAX_GENERATED_SAMPLES:
        raise WorkloadError(f"opensora size={size} is more than {MAX_GENERATED_SAMPLES:,} samples")
    if size <= 0 or alpha <= 0 or offset < 0:
        raise WorkloadError(f"opensora needs size > 0, alpha > 0, offset >= 0; got {size}, {alpha}, {offset}")
    rng = np.random.default_rng(seed)

    def zipf_pick(buckets: list[tuple[int, int]], n: int) -> np.ndarray:
        order = sorted(range(len(buckets)), key=lambda i: buckets[i][0] * buckets[i][1])
        m = len(order)
        if variant == "short":
            rank = np.arange(m)
        elif variant == "long":
            rank = np.arange(m)[::-1]
        else:
            rank = np.abs(np.arange(m) - (m - 1) / 2)
        weight = 1.0 / (rank + 1 + offset) ** alpha
        chosen = rng.choice(m, size=n, p=weight / weight.sum())
        return np.asarray(order)[chosen]

    images = [opensora_tokens(h, w, 1) for h, w in OPENSORA_RESOLUTIONS.values()]
    videos = [opensora_tokens(h, w, f) for h, w in OPENSORA_RESOLUTIONS.values() for f in OPENSORA_FRAMES[1:]]
    n_img = size // 2
    pick = [images[i] for i in zipf_pick(images, n_img)] + [videos[i] for i in zipf_pick(videos, size - n_img)]
    frames = np.array([f for f, _ in pick], dtype=np.int64)
    tokens = np.array([f * s for f, s in pick], dtype=np.int64)
    perm = rng.permutation(size)
    src = f"DCP paper Open-Sora buckets, {variant}, Zipf alpha={alpha} offset={offset}"
    return Workload(f"opensora-{variant}", tokens[perm], frames[perm], source=src)


def _parse_params(text: str, spec: str) -> dict[str, float]:
    params = {}
    for item in filter(None, text.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise WorkloadError(f"workload {spec!r}: parameter {item!r} is not key=value")
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not math.isfinite(number):
            raise WorkloadError(f"workload {spec!r}: {key}={value!r} is not a finite number")
        params[key.strip()] = number
    return params


def load_workload(spec: str, seed: int = 0) -> Workload:
    """A workload by spec: `wikipedia`, `lognormal[:mean=1024,sigma=1.5,min=128,max=8192,scale=1]`,
    `opensora[:short|balanced|long]` (or `opensora-long`), or a lengths file path."""
    if not spec.strip():
        raise WorkloadError("empty workload: use wikipedia, lognormal[:k=v,...], opensora[:short|balanced|long] "
                            "or a lengths file")
    name, _, rest = spec.partition(":")
    if name == "wikipedia" and not rest:
        return wikipedia()
    if name == "lognormal":
        p = _parse_params(rest, spec)
        keys = {"mean": "mean", "sigma": "sigma", "min": "min_tokens", "max": "max_tokens", "scale": "scale", "size": "size"}
        unknown = set(p) - set(keys)
        if unknown:
            raise WorkloadError(f"workload {spec!r}: unknown parameter(s) {sorted(unknown)}; known: {sorted(keys)}")
        fractional = [k for k in ("min", "max", "size") if k in p and p[k] != int(p[k])]
        if fractional:
            raise WorkloadError(f"workload {spec!r}: {fractional[0]}={p[fractional[0]]:g} is not an integer")
        kw = {keys[k]: (int(v) if k in ("min", "max", "size") else v) for k, v in p.items()}
        return lognormal(seed=seed, **kw)
    if name.startswith("opensora"):
        variant = rest or name.removeprefix("opensora").lstrip("-") or "balanced"
        return opensora(variant, seed=seed)
    path = Path(spec)
    if path.exists() or any(spec.lower().endswith(e) for e in (".txt", ".gz", ".csv", ".parquet", ".jsonl")):
        tokens = read_lengths(path)
        return Workload(path.name, tokens, np.ones_like(tokens), source=str(path))
    raise WorkloadError(
        f"unknown workload {spec!r}: use wikipedia, lognormal[:k=v,...], opensora[:short|balanced|long] or a lengths file"
    )


def global_batches(workload: Workload, attention: str, *, batch_size: int | None = None,
                   token_budget: int | None = None, steps: int | None = None, seed: int = 0,
                   full_only: bool = False) -> list[list[Sample]]:
    """Seeded shuffle, then consecutive global batches of `batch_size` samples or of at most
    `token_budget` tokens (a longer sample gets a batch of its own), the first `steps` of them.
    The last batch may be partial, unless `full_only`: then a last batch cut short by the end of
    the workload is left out, and a workload without one full batch, or a planned sample longer
    than the token budget, is a WorkloadError (what `dcp plan` wants: every step a real batch)."""
    if (batch_size is None) == (token_budget is None):
        raise WorkloadError("give exactly one of a global batch size (samples) or a token budget")
    if batch_size is not None and batch_size <= 0:
        raise WorkloadError(f"global batch size must be positive, got {batch_size}")
    if token_budget is not None and token_budget <= 0:
        raise WorkloadError(f"global token budget must be positive, got {token_budget}")
    if steps is not None and steps <= 0:
        raise WorkloadError(f"steps must be positive, got {steps}")
    order = np.random.default_rng(seed).permutation(len(workload))
    batches = cut_batches(order, workload.tokens[order], batch_size=batch_size, token_budget=token_budget)
    if full_only:
        batches = _full_batches(workload, batches, batch_size, token_budget)[:steps]
        over = [ids[0] for ids in batches if token_budget is not None and _total(workload, ids) > token_budget]
        if over:
            raise WorkloadError(f"global token budget {token_budget:,} is less than sample {over[0]}'s "
                                f"{workload.tokens[over[0]]:,} tokens: a global batch must hold its longest sample")
    return [workload.samples(attention, ids) for ids in batches[:steps]]


def _total(workload: Workload, ids: np.ndarray | None = None) -> int:
    """Tokens of `ids` (default all) as a Python int: an int64 sum of long samples can wrap."""
    return sum((workload.tokens if ids is None else workload.tokens[ids]).tolist())


def _full_batches(workload: Workload, batches: list[np.ndarray], batch_size: int | None,
                  token_budget: int | None) -> list[np.ndarray]:
    """`batches` without a last one that the end of the workload cut short; error if none is left."""
    last = batches[-1]
    if len(last) < (batch_size or 0) or (token_budget is not None and _total(workload, last) < token_budget):
        batches = batches[:-1]
    if not batches:
        size = f"{batch_size:,} samples" if batch_size is not None else f"{token_budget:,} tokens"
        raise WorkloadError(f"workload {workload.name} holds {len(workload):,} sample{'s' * (len(workload) != 1)} of "
                            f"{_total(workload):,} tokens, less than one global batch of {size}")
    return batches


def cut_batches(order: np.ndarray, tokens: np.ndarray, *, batch_size: int | None = None,
                token_budget: int | None = None) -> list[np.ndarray]:
    """Consecutive global batches of `order` (sample ids; `tokens` their lengths, in that order):
    `batch_size` samples each, or at most `token_budget` tokens each (a longer sample gets a batch
    of its own). Nothing is dropped or repeated: the last batch may be partial."""
    if batch_size is not None:
        return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    assert token_budget is not None
    cuts, used = [], 0
    for i, t in enumerate(tokens.tolist()):
        if used and used + t > token_budget:
            cuts.append(i)
            used = 0
        used += t
    return [b for b in np.split(order, cuts) if len(b)]
