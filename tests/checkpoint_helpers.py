"""A small data-parallel training loop over an FSDP2 (`fully_shard`) reference model, for the
checkpoint tests: every rank draws the same planned global batches from a GlobalBatchSampler
built for its world size and trains its share of each batch's samples (ids[rank::world]);
FSDP2 averages the gradients, the loss is scaled so the step equals single-process training on
the whole batch with a per-token mean loss. `train` runs on one rank (under run_ranks) and
returns what the tests compare: the sample ids of every trained step, and rank 0's gathered
parameters and optimizer state (float64, on the CPU)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

from dcp.costmodel import Cluster, CostModel, TrainingSetup, load_hardware, load_model
from dcp.data import GlobalBatchSampler
from dcp.executor.run_checkpoint import Checkpointer
from dcp.executor.run_checkpoint_state import run_digest
from dcp.models import build_model, lm_loss, sample_tensors
from dcp.models.packing import PackedSeqs
from dcp.planner import Sample

DIGEST_PARTS = {"model": load_model("tiny-llama"), "zero_stage": 3, "recipe": "fp32"}
LENGTHS = [5, 9, 3, 12, 7, 4, 11, 6, 8, 10, 2, 13, 5, 7, 9, 3, 6, 8, 4, 10, 12, 5, 7, 11]
"""24 samples: 6 global batches of 4 per epoch."""
BATCH = 4


def make_sampler(world: int, zero_stage: int = 0) -> GlobalBatchSampler:
    spec = load_model("tiny-llama")
    hw = load_hardware("cpu")
    cm = CostModel(spec, hw, Cluster(num_gpus=world, gpus_per_node=world, memory_bytes=hw.memory_bytes),
                   TrainingSetup(precision="fp32", zero_stage=zero_stage))
    return GlobalBatchSampler(np.array(LENGTHS), cm, batch_size=BATCH, seed=3, workers=0)


def make_model(reshard_after_forward: bool = True, seed: int = 0, num_layers: int | None = None) -> torch.nn.Module:
    """tiny-llama in float64 (initial weights identical on every rank), each layer then the
    root `fully_shard`ed over the world."""
    import dataclasses

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    spec = load_model("tiny-llama")
    if num_layers is not None:
        spec = dataclasses.replace(spec, num_layers=num_layers)
    model = build_model(spec, dtype=torch.float64, seed=seed)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return model


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, ids: list[int], rank: int, world: int,
               die: bool = False) -> None:
    spec = load_model("tiny-llama")
    mine = ids[rank::world]
    total = sum(LENGTHS[i] - 1 for i in ids)  # loss tokens of the whole batch (the last token has none)
    if mine:
        tensors = [sample_tensors(spec, Sample(i, LENGTHS[i], 0, 1)) for i in mine]
        inputs = torch.cat([t["inputs"] for t in tensors])
        labels = torch.cat([t["labels"] for t in tensors])
        logits = model(inputs, PackedSeqs.pack([LENGTHS[i] for i in mine]))
        loss, _ = lm_loss(logits, labels)
    else:  # an idle rank still joins FSDP2's collectives with a zero-loss pass
        logits = model(torch.zeros(1, dtype=torch.long), PackedSeqs.pack([1]))
        loss = logits.sum() * 0.0
    if die:  # SIGKILL in the middle of the step: after the forward, before the gradient sync
        os.kill(os.getpid(), signal.SIGKILL)
    (loss * world / total).backward()  # FSDP2 averages over the world: sum / total tokens
    opt.step()
    opt.zero_grad(set_to_none=True)


def full_state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """Rank 0's whole (gathered) model and optimizer state dicts as numpy arrays."""
    msd, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    # numpy: tensors sent through a multiprocessing queue would need the sender alive
    return {"model": {k: v.numpy().copy() for k, v in msd.items()},
            "optim": {fqn: {k: v.numpy().copy() for k, v in s.items()} for fqn, s in osd.get("state", {}).items()}}


def train(rank: int, world: int, ckdir: str, steps: int, *, save_every: int = 0, resume: bool = False,
          die_after_step: int | None = None, reshard_after_forward: bool = True, async_save: bool = False,
          keep: int = 3, kill_mid_step: tuple[int, int] | None = None,
          kill_in_save: tuple[str, int, int] | None = None) -> dict[str, Any]:
    """Train to `steps` (optimizer steps, counted over epochs), saving every `save_every` steps,
    resuming first from the newest checkpoint when `resume`. `die_after_step`: every rank
    SIGKILLs itself right after that step's save (the job crashing), returning nothing.
    kill_mid_step (rank, step): that rank SIGKILLs itself in the middle of that step (1-based);
    kill_in_save (where, rank, step): that rank SIGKILLs itself inside the save of that step,
    where "write" (after writing its shard files) or "commit" (the coordinator, after .metadata
    and before the rename)."""
    if kill_in_save is not None:
        _kill_inside_save(*kill_in_save, rank)
    torch.manual_seed(1234 + rank)  # any per-rank RNG state the run draws from, to be restored
    model = make_model(reshard_after_forward)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    sampler = make_sampler(world)
    ckpt = Checkpointer(ckdir, keep=keep, async_save=async_save, digest=run_digest(**DIGEST_PARTS))
    step, trained = 0, []
    if resume:
        step = ckpt.load(model, opt, sampler=sampler).step
    rng_draws = []
    while step < steps:
        for batch in sampler:
            die = kill_mid_step == (rank, step + 1)
            train_step(model, opt, batch.sample_ids, rank, world, die=die)
            trained.append((batch.epoch, batch.step, batch.sample_ids, batch.plan.num_gpus))
            rng_draws.append(torch.rand(()).item())  # the per-rank RNG stream goes on across a resume
            step += 1
            if save_every and step % save_every == 0:
                ckpt.save(step, model, opt, sampler_state=sampler.state_dict_after(batch))
            if die_after_step == step:
                ckpt.wait()
                dist.barrier()
                os.kill(os.getpid(), signal.SIGKILL)
            if step == steps:
                break
    ckpt.close()
    state = full_state(model, opt)
    return {"trained": trained, "state": state if rank == 0 else None, "rng": rng_draws,
            "steps": ckpt.steps(), "dir": sorted(p.name for p in Path(ckdir).glob("*"))}


def _kill_inside_save(where: str, kill_rank: int, kill_step: int, rank: int) -> None:
    from dcp.executor import run_checkpoint_files as files

    if rank != kill_rank:
        return
    cls = files.CommittingWriter
    original = cls.write_data if where == "write" else cls.finish

    def dying(self, *args: Any, **kwargs: Any) -> Any:  # noqa: ANN001
        out = original(self, *args, **kwargs) if where == "write" else None
        if self.manifest_fields["step"] == kill_step:
            if where == "commit":  # everything written but the manifest and the rename
                files.FileSystemWriter.finish(self, *args, **kwargs)
            os.kill(os.getpid(), signal.SIGKILL)
        return out if where == "write" else original(self, *args, **kwargs)

    setattr(cls, "write_data" if where == "write" else "finish", dying)


def train_executor(rank: int, world: int, ckdir: str, steps: int, zero_stage: int, *, save_every: int = 0,
                   resume: bool = False, die_after_step: int | None = None) -> dict[str, Any]:
    """As `train`, through dcp.executor.Executor at `zero_stage` (FSDP2) and its optimizer: every
    rank runs its group's part of each step's plan (dcp-greedy, for this world size)."""
    from dcp.executor import Executor, ParallelState, executor_optimizer

    spec = load_model("tiny-llama")
    state = ParallelState.create(timeout_s=60)
    executor = Executor(build_model(spec, dtype=torch.float64, seed=0), state, zero_stage=zero_stage)
    opt = executor_optimizer(executor, lr=1e-2, weight_decay=0.1)
    sampler = make_sampler(world, zero_stage)
    ckpt = Checkpointer(ckdir, digest=run_digest(model=spec, zero_stage=zero_stage, recipe=executor.recipe))
    step, trained = 0, []
    if resume:
        step = ckpt.load(executor.model, opt, sampler=sampler).step

    def loss_fn(out: torch.Tensor, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return lm_loss(out, batch["labels"])

    for batch in sampler:
        plan = batch.plan
        tensors = {i: sample_tensors(spec, plan.sample_map()[i], dtype=torch.float64)
                   for i in batch.local_samples(rank)}
        executor.step(plan, tensors, loss_fn)
        opt.step()
        opt.zero_grad(set_to_none=True)
        trained.append((batch.epoch, batch.step, batch.sample_ids))
        step += 1
        if save_every and step % save_every == 0:
            ckpt.save(step, executor.model, opt, sampler_state=sampler.state_dict_after(batch))
        if die_after_step == step:
            dist.barrier()
            os.kill(os.getpid(), signal.SIGKILL)
        if step == steps:
            break
    state_ = full_state(executor.model, opt)  # a collective: every rank
    return {"trained": trained, "state": state_ if rank == 0 else None}
