"""Counting memory without a device: tensors saved for backward, and live tensors over time.

Both work on real and on fake tensors (torch._subclasses.fake_tensor.FakeTensorMode), so a
llama-7b-wide model can be measured on a laptop without allocating a byte of it:

- `SavedBytes`: the bytes of the storages autograd saves for backward
  (`torch.autograd.graph.saved_tensors_hooks`), each storage once, parameters and weight copies
  apart, attributed to the layer whose forward saved them first.
- `LiveBytes`: a dispatch mode that follows every storage an op creates until it is freed, and
  keeps the peak of what is alive per phase of the step (forward, head, backward). Storages
  that autocast's casts of parameters create (`aten._to_copy` of a parameter) are weight copies,
  counted apart from activations.
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

CUDA_FP32_AUTOCAST_OPS = frozenset({
    "native_layer_norm", "native_group_norm", "_softmax", "_log_softmax", "pow", "exp", "expm1", "log", "log1p",
    "log2", "log10", "rsqrt", "reciprocal", "sum", "cumsum", "cumprod", "prod", "softplus", "nll_loss_forward",
    "mse_loss", "linalg_vector_norm", "norm", "acos", "asin", "cosh", "sinh", "tan", "erfinv", "logsumexp"})
"""aten ops CUDA autocast runs in fp32 (torch.amp docs, "CUDA Ops that can autocast to float32")
while CPU autocast leaves them in the input's dtype: fed bf16 under autocast, a CPU
measurement of them would not be what a GPU holds."""


def storage_key(t: torch.Tensor) -> int:
    """Identity of a tensor's storage while it lives (views of one storage share it)."""
    return id(t.untyped_storage())


class LiveBytes(TorchDispatchMode):
    """Bytes alive of the storages created inside the mode, split into weight copies and the rest.

    `phase` is set from outside (module and tensor hooks); `peak[phase]` is the most non-copy
    bytes alive during that phase and `start[phase]` what was alive when it began. `bucket` (the
    layer running its forward, None outside the layers) attributes weight copies to layers."""

    def __init__(self, params: list[torch.Tensor], resident: list[torch.Tensor] = ()) -> None:
        """`params`: whose casts are weight copies; `resident`: tensors that exist before the
        step (gradient buffers) and are not counted when ops write into them in place."""
        super().__init__()
        self.param_keys = {storage_key(p) for p in params}
        self.resident_keys = self.param_keys | {storage_key(t) for t in resident}
        self.copy_keys: set[int] = set()
        self.sizes: dict[int, tuple[int, bool]] = {}
        self.other = self.copies = 0
        self.copy_peak = 0
        self.phase = "forward"
        self.peak: dict[str, int] = {"forward": 0}
        self.start: dict[str, int] = {"forward": 0}
        self.bucket: int | None = None
        self.copies_by_bucket: dict[int | None, int] = defaultdict(int)
        self.autocast_mismatches: set[str] = set()
        """Ops of CUDA_FP32_AUTOCAST_OPS that got a 16-bit input in the forward under autocast."""

    def set_phase(self, phase: str) -> None:
        self.phase = phase
        self.start[phase] = self.other
        self.peak[phase] = max(self.peak.get(phase, 0), self.other)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in CUDA_FP32_AUTOCAST_OPS and self.phase != "backward" and torch.is_autocast_enabled("cpu") and any(
                isinstance(a, torch.Tensor) and a.dtype in (torch.bfloat16, torch.float16) for a in args):
            self.autocast_mismatches.add(name)
        cast = (func is torch.ops.aten._to_copy.default and isinstance(args[0], torch.Tensor)
                and storage_key(args[0]) in self.param_keys)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._add(t, cast)
        return out

    def _add(self, t: torch.Tensor, cast: bool) -> None:
        storage = t.untyped_storage()
        key = id(storage)
        if key in self.sizes or key in self.resident_keys:
            return
        n = storage.nbytes()
        self.sizes[key] = (n, cast)
        weakref.finalize(storage, self._free, key)
        if cast:
            self.copy_keys.add(key)
            self.copies += n
            self.copy_peak = max(self.copy_peak, self.copies)
            if self.phase != "backward":  # a recompute's casts are not the forward's copies
                self.copies_by_bucket[self.bucket] += n
        else:
            self.other += n
            self.peak[self.phase] = max(self.peak[self.phase], self.other)

    def _free(self, key: int) -> None:
        n, cast = self.sizes.pop(key)
        if cast:
            self.copy_keys.discard(key)
            self.copies -= n
        else:
            self.other -= n


class SavedBytes:
    """Bytes of the storages saved for backward, by the layer that saved them first (None:
    outside the layers). Parameters and the weight copies `live` knows of are not activations."""

    def __init__(self, params: list[torch.Tensor], live: LiveBytes | None = None) -> None:
        self.param_keys = {storage_key(p) for p in params}
        self.live = live
        self.seen: set[int] = set()
        self.by_bucket: dict[int | None, int] = defaultdict(int)
        self.bucket: int | None = None
        self.counting = True

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        if not self.counting:
            return t
        key = storage_key(t)
        copies = self.live.copy_keys if self.live is not None else ()
        if key not in self.param_keys and key not in copies and key not in self.seen:
            # Saved tensors live until backward, so no key seen here is reused before then.
            self.seen.add(key)
            self.by_bucket[self.bucket] += t.untyped_storage().nbytes()
        return t

    @property
    def layers_total(self) -> int:
        return sum(n for b, n in self.by_bucket.items() if b is not None)

    @contextmanager
    def hooks(self) -> Iterator[SavedBytes]:
        with torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t):
            yield self
