"""Save and resume a training run through torch.distributed.checkpoint (DCP).

    ckpt = Checkpointer("ckpt/", keep=3, digest=run_digest(model=spec, hardware=profile,
                                                            zero_stage=2, recipe="fp32"))
    if ckpt.latest() is not None:
        resumed = ckpt.load(model, optimizer, sampler=sampler)   # step, refit, extra
    ...
    ckpt.save(step, model, optimizer, sampler_state=sampler.state_dict_after(batch))
    ckpt.close()                                                  # waits for an async save

A checkpoint holds, through DCP, the model and optimizer state as
`torch.distributed.checkpoint.state_dict.get_state_dict` returns them (for an FSDP2 model:
DTensors, each rank writing only its own shard; DCP reshards them on load to whatever world
size and sharding the loading model has), the run's replicated state (step, sampler position,
refit state, user extras, the digest of what plans depend on; JSON) and every rank's RNG states
(torch, CUDA, numpy, python). The commit protocol is in dcp.executor.run_checkpoint_files: a
checkpoint is visible only once every byte and the manifest are down.

`load` checks, on every rank and before anything is read into the model: that a committed
checkpoint exists (a directory with only a save killed halfway is named as such), that every
file is there with its size and sha256 (each rank hashes a share of the files), that the
digest matches part by part, that the sampler was built over the same data, and that the
model's and optimizer's tensors have the keys and global shapes the checkpoint has. Any
failure is one `CheckpointError` raised on every rank, naming what differs.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from dcp.executor.run_checkpoint_files import (
    CommittingWriter,
    committed_steps,
    partial_dir,
    partial_steps,
    read_manifest,
    step_dir,
    verify_files,
)
from dcp.executor.run_checkpoint_state import rng_state, seed_all, set_rng_state

log = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be resumed from, raised on every rank with the same message."""


@dataclass(frozen=True)
class Resumed:
    """What `Checkpointer.load` restored besides the model and optimizer."""

    step: int
    """The step the checkpoint was saved at (the number of optimizer steps trained)."""
    path: Path
    sampler_state: dict[str, Any] | None
    refit: Any
    """The online refit state given to `save` (JSON), or None."""
    extra: dict[str, Any]
    saved_world_size: int


def _tensor_shapes(model_sd: Mapping[str, Any], optim_sd: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """DCP's flattened key -> global shape of every tensor of the model's and optimizer's state
    dicts (DCP joins nested dict keys with dots)."""
    shapes = {f"model.{k}": tuple(v.shape) for k, v in model_sd.items() if torch.is_tensor(v)}
    for fqn, per_param in optim_sd.get("state", {}).items():
        for name, v in per_param.items():
            if torch.is_tensor(v):
                shapes[f"optim.state.{fqn}.{name}"] = tuple(v.shape)
    return shapes


def _differences(want: dict[str, tuple[int, ...]], saved: dict[str, tuple[int, ...]]) -> list[str]:
    missing = sorted(set(want) - set(saved))
    extra = sorted(k for k in set(saved) - set(want) if k.startswith(("model.", "optim.state.")))
    shapes = sorted(k for k in set(want) & set(saved) if want[k] != saved[k])
    out = []
    if missing:
        out.append(f"the checkpoint lacks {len(missing)} tensor(s) the model has: {', '.join(missing[:3])}")
    if extra:
        out.append(f"the checkpoint has {len(extra)} tensor(s) the model lacks: {', '.join(extra[:3])}")
    for k in shapes[:3]:
        out.append(f"{k} is {list(saved[k])} in the checkpoint, {list(want[k])} in the model")
    return out


class Checkpointer:
    """Sharded, committed, optionally asynchronous checkpoints of a training run in `directory`,
    the newest `keep` kept. Build it on every rank (it makes a gloo process group for async
    saves, a collective), and call save/load on every rank."""

    def __init__(self, directory: str | Path, *, keep: int = 3, digest: Mapping[str, str] | None = None,
                 async_save: bool = False, thread_count: int = 1) -> None:
        """digest: `run_digest(...)` of this run, saved and compared on load. async_save: `save`
        returns once the state is copied to host memory; the write (and the commit) runs in a
        background thread over a gloo group of its own. thread_count: writer threads per rank."""
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.root, self.keep, self.digest = Path(directory), keep, dict(digest or {})
        self.async_save, self.thread_count = async_save, thread_count
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world_size = dist.get_world_size() if dist.is_initialized() else 1
        # Background saves run collectives while training runs its own: never on the same group.
        self._pg = dist.new_group(backend="gloo") if async_save and dist.is_initialized() else None
        self._pending: Any = None
        self.last_writer: CommittingWriter | None = None
        """The writer of the latest save (its `bytes_written` is this rank's shard files)."""

    # -- saving --------------------------------------------------------------------------------
    def save(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, *,
             sampler_state: Mapping[str, Any] | None = None, refit: Any = None,
             extra: Mapping[str, Any] | None = None) -> Path:
        """Save the run as it stands after `step` optimizer steps; returns the directory the
        checkpoint will have once committed. Synchronous mode returns after the commit; async
        mode after the copy to host memory (a previous async save is waited for first).
        sampler_state: `GlobalBatchSampler.state_dict()` (or `state_dict_after(batch)`);
        refit, extra: JSON-serializable run state (e.g. a refitted profile's `to_dict()`)."""
        self.wait()
        final, partial = step_dir(self.root, step), partial_dir(self.root, step)
        if self.rank == 0:  # leftovers of saves killed halfway: never committed, never read
            self.root.mkdir(parents=True, exist_ok=True)
            for s in partial_steps(self.root):
                _rmtree(partial_dir(self.root, s))
            for p in self.root.glob(".deleting-step-*"):
                _rmtree(p)
        if dist.is_initialized():
            dist.barrier()
        model_sd, optim_sd = get_state_dict(model, optimizer)
        train = {"step": step, "world_size": self.world_size, "digest": self.digest,
                 "sampler": dict(sampler_state) if sampler_state is not None else None,
                 "refit": refit, "extra": dict(extra or {})}
        state = {"model": model_sd, "optim": optim_sd, "train": io.BytesIO(json.dumps(train).encode()),
                 f"rng.{self.rank}": io.BytesIO(rng_state())}
        writer = CommittingWriter(partial, final, keep=self.keep, thread_count=self.thread_count,
                                  manifest_fields={"step": step, "world_size": self.world_size})
        self.last_writer = writer
        if self.async_save:
            self._pending = dcp.async_save(state, storage_writer=writer, process_group=self._pg,
                                           no_dist=not dist.is_initialized())
        else:
            dcp.save(state, storage_writer=writer, no_dist=not dist.is_initialized())
        return final

    def wait(self) -> None:
        """Block until the pending async save (if any) is committed; re-raises its failure."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        """Wait for the pending save; the checkpointer can still be used afterwards."""
        self.wait()

    # -- finding -------------------------------------------------------------------------------
    def latest(self) -> int | None:
        """The newest committed step in the directory, or None."""
        steps = committed_steps(self.root)
        return steps[-1] if steps else None

    def steps(self) -> list[int]:
        """Every committed step, ascending."""
        return committed_steps(self.root)

    # -- loading -------------------------------------------------------------------------------
    def load(self, model: nn.Module, optimizer: torch.optim.Optimizer, *, step: int | None = None,
             sampler: Any = None, verify_hashes: bool = True) -> Resumed:
        """Restore the model, optimizer, this rank's RNG states and (given) the sampler from the
        checkpoint of `step` (default: the newest). On another world size the parameters and
        optimizer state reshard; ranks the checkpoint has no RNG state for are seeded from
        (step, rank). verify_hashes=False checks file sizes only (skips reading every file once)."""
        self.wait()
        path = self._agree(lambda: self._find(step))
        manifest = self._agree(lambda: read_manifest(path))
        names = sorted(manifest["files"])
        mine = names[self.rank::self.world_size]  # each rank hashes a share; the union is all
        self._agree(lambda: self._raise_if(verify_files(path, manifest, mine, hashes=verify_hashes), path))
        reader = FileSystemReader(path)
        train_buf = {"train": io.BytesIO()}
        dcp.load(train_buf, storage_reader=reader, no_dist=not dist.is_initialized())
        train = json.loads(train_buf["train"].getvalue())
        model_sd, optim_sd = get_state_dict(model, optimizer)
        saved = {k: tuple(m.size) for k, m in reader.read_metadata().state_dict_metadata.items()
                 if isinstance(m, TensorStorageMetadata)}
        self._agree(lambda: self._check_compatible(path, train, sampler, _tensor_shapes(model_sd, optim_sd), saved))
        rng_key = f"rng.{self.rank}"
        state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
        has_rng = rng_key in reader.read_metadata().state_dict_metadata
        if has_rng:
            state[rng_key] = io.BytesIO()
        dcp.load(state, storage_reader=FileSystemReader(path), no_dist=not dist.is_initialized())
        set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
        if has_rng and train["world_size"] == self.world_size:
            set_rng_state(state[rng_key].getvalue())
        else:
            seed_all(int.from_bytes(hashlib.sha256(f"{train['step']}/{self.rank}".encode()).digest()[:8], "little"))
        if sampler is not None and train["sampler"] is not None:
            sampler.load_state_dict(train["sampler"])
        return Resumed(int(train["step"]), path, train["sampler"], train["refit"], train["extra"],
                       int(train["world_size"]))

    def _find(self, step: int | None) -> Path:
        steps = committed_steps(self.root)
        if step is not None:
            if step not in steps:
                raise CheckpointError(f"{self.root}: no committed checkpoint of step {step} "
                                      f"(committed: {steps or 'none'})")
            return step_dir(self.root, step)
        if steps:
            return step_dir(self.root, steps[-1])
        partial = partial_steps(self.root)
        if partial:
            raise CheckpointError(f"{self.root} holds only an incomplete save ({partial_dir(self.root, partial[-1]).name}, "
                                  "killed before its commit): no checkpoint to resume from")
        raise CheckpointError(f"{self.root}: no checkpoint to resume from")

    @staticmethod
    def _raise_if(problems: list[str], path: Path) -> None:
        if problems:
            raise CheckpointError(f"checkpoint {path} is damaged: " + "; ".join(problems))

    def _check_compatible(self, path: Path, train: dict[str, Any], sampler: Any,
                          want: dict[str, tuple[int, ...]], saved: dict[str, tuple[int, ...]]) -> None:
        theirs = train.get("digest", {})
        differ = [f"{part}: checkpoint {theirs.get(part, 'not recorded')}, this run {ours}"
                  for part, ours in self.digest.items() if theirs.get(part) != ours]
        if differ:
            raise CheckpointError(f"checkpoint {path} was saved by another run setup: " + "; ".join(differ))
        if sampler is not None and train["sampler"] is not None:
            if train["sampler"].get("fingerprint") != sampler.fingerprint:
                raise CheckpointError(f"checkpoint {path}: the sampler was saved over other data or batching "
                                      f"(fingerprint {train['sampler'].get('fingerprint')} != {sampler.fingerprint})")
        problems = _differences(want, saved)
        if problems:
            raise CheckpointError(f"checkpoint {path} does not fit this model and optimizer: " + "; ".join(problems))

    def _agree(self, fn: Any) -> Any:
        """Run `fn` on every rank; if it raised anywhere, raise the first failing rank's message
        on every rank (so no rank goes on into a collective that the others left)."""
        try:
            value, error = fn(), None
        except (CheckpointError, ValueError, OSError) as e:
            value, error = None, str(e)
        if dist.is_initialized() and self.world_size > 1:
            errors: list[str | None] = [None] * self.world_size
            dist.all_gather_object(errors, error)
        else:
            errors = [error]
        first = next((e for e in errors if e), None)
        if first:
            raise CheckpointError(first)
        return value


def _rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)

