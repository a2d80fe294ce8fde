"""Distributed state in one validated object: world, GPUs per node, and a process group for
every aligned power-of-two block of ranks, created once at start, in one order, and warmed.

Creating groups lazily mid-run would need every rank (members or not) to call new_group at the
same moment; a plan that puts ranks in different groups makes that a deadlock. So all of them
exist from the start, and each is warmed with a tiny collective so that connection setup (NCCL
communicator init) happens here and not inside the first timed micro-batch. Ring attention's
point-to-point sends need no group of their own (they go over the world group by global rank),
but every pair of ring neighbours exchanges a tiny tensor here too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from dcp.executor.ring_comm import warm_rings


def aligned_blocks(world_size: int) -> list[tuple[int, int]]:
    """(start, size) of every aligned block of 2..world_size ranks: size a power of two, start a
    multiple of size. Smallest sizes first, then by start: the one creation order of all ranks."""
    blocks, size = [], 2
    while size <= world_size:
        blocks += [(start, size) for start in range(0, world_size - size + 1, size)]
        size *= 2
    return blocks


@dataclass(frozen=True)
class ParallelState:
    """Where this process sits and which groups it can use; pass it explicitly, never a global."""

    world_size: int
    rank: int
    gpus_per_node: int
    device: torch.device
    groups: dict[tuple[int, int], dist.ProcessGroup] = field(repr=False)
    """Process group of each aligned block by (start rank, size); size 1 needs none."""
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if self.world_size <= 0 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside a world of {self.world_size}")
        if self.gpus_per_node <= 0:
            raise ValueError(f"GPUs per node must be positive, got {self.gpus_per_node}")
        missing = set(aligned_blocks(self.world_size)) - set(self.groups)
        if missing:
            raise ValueError(f"process groups missing for blocks (start, size) {sorted(missing)}")

    @classmethod
    def create(cls, *, gpus_per_node: int | None = None, device: torch.device | str | None = None,
               timeout_s: float = 600.0, warm: bool = True) -> ParallelState:
        """Build every aligned group on an initialized default process group (torchrun).

        `timeout_s` bounds every collective of these groups, so a dead peer turns into an error
        (and torchrun ends the job) instead of a hang."""
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialized: call dist.init_process_group first "
                               "(e.g. under torchrun)")
        world, rank = dist.get_world_size(), dist.get_rank()
        if device is None:
            device = (torch.device("cuda", torch.cuda.current_device())
                      if dist.get_backend() == "nccl" else torch.device("cpu"))
        if gpus_per_node is None:  # torchrun's processes on this node; else the devices it has
            local = os.environ.get("LOCAL_WORLD_SIZE")
            gpus_per_node = (int(local) if local else
                             torch.cuda.device_count() if torch.device(device).type == "cuda" else world)
        timeout = timedelta(seconds=timeout_s)
        # Every rank calls new_group for every block, in the same order (a torch requirement).
        groups = {b: dist.new_group(list(range(b[0], b[0] + b[1])), timeout=timeout)
                  for b in aligned_blocks(world)}
        state = cls(world, rank, max(1, min(gpus_per_node, world)), torch.device(device), groups, timeout_s)
        if warm:
            for (start, size), group in groups.items():
                if start <= rank < start + size:
                    dist.all_reduce(torch.ones(1, device=state.device), group=group)
            # Ring attention sends point-to-point over the world group: connect every ring now.
            dist.all_reduce(torch.ones(1, device=state.device))
            warm_rings(world, rank, state.device)
        return state

    def group(self, start: int, size: int) -> dist.ProcessGroup | None:
        """The group of the block of `size` ranks starting at `start` (None for one rank)."""
        if size == 1:
            return None
        if (start, size) not in self.groups:
            raise ValueError(f"no process group for ranks {start}..{start + size - 1}: blocks must be aligned "
                             f"powers of two within {self.world_size} ranks")
        return self.groups[(start, size)]
