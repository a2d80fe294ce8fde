"""The global-batch sampler: a dataset's samples as a stream of (global batch, plan) steps.

Every rank builds the same sampler with the same seed and so sees the same batches; plans are
made `plan_ahead` steps early in worker processes (dcp.data.prefetch). Each epoch trains every
sample exactly once, the last partial batch included; samples that fit nowhere on the cluster are
refused before training starts (or skipped, when the user allows it). `state_dict()` records
(epoch, step, seed) so a restarted job continues with the very batches and plans it would have
had. Never imports torch; the DataLoader glue is in dcp.data.loader.
"""

from __future__ import annotations

import hashlib
import logging
import numbers
from collections.abc import Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass
from typing import Any

import numpy as np

from dcp.costmodel import CostModel, attention_pairs
from dcp.data.lengths import LengthSource, resolve_lengths
from dcp.data.local import LocalBatch, local_samples
from dcp.data.prefetch import PlanAhead, Planner, SolvePlanner
from dcp.data.workloads import Workload, cut_batches
from dcp.planner.feasibility import allowed_sp_sizes, check_feasible
from dcp.planner.options import StrategyOptions, with_dataset
from dcp.planner.plan import InfeasibleError, Plan
from dcp.planner.sample import Sample

log = logging.getLogger(__name__)

def unfittable_ids(tokens: np.ndarray, cm: CostModel, sp_sizes: Sequence[int] | None = None) -> np.ndarray:
    """Ids of samples that fit nowhere: not even alone at the largest allowed SP size with every
    layer checkpointed (the planner's own feasibility rule), or beyond the cost model's range."""
    p = max(allowed_sp_sizes(cm, sp_sizes))
    check_feasible([], cm, [p])  # model states alone must leave room
    # min_ckpt_layers is None both when memory is short and beyond the profile's fitted range.
    bad = [t for t in np.unique(tokens).tolist() if cm.min_ckpt_layers(t, p) is None]
    return np.flatnonzero(np.isin(tokens, bad))


def epoch_batches(tokens: np.ndarray, ids: np.ndarray, *, seed: int, epoch: int,
                  batch_size: int | None = None, token_budget: int | None = None) -> list[np.ndarray]:
    """Shuffle `ids` with seed + epoch, then cut consecutive global batches of `batch_size`
    samples or of at most `token_budget` tokens (a longer sample gets a batch of its own).
    Nothing is dropped or repeated: the last batch may be partial."""
    order = ids[np.random.default_rng(seed + epoch).permutation(len(ids))]
    return cut_batches(order, tokens[order], batch_size=batch_size, token_budget=token_budget)


@dataclass(frozen=True)
class PlannedBatch:
    """One training step: the global batch's sample ids and the plan every rank follows."""

    epoch: int
    step: int
    """Step within the epoch, from 0."""
    sample_ids: list[int]
    plan: Plan
    plan_wait_s: float
    """Seconds the training loop waited for this plan (0 when it was ready in time)."""

    def local_samples(self, rank: int) -> list[int]:
        """Sample ids this rank's SP group runs, in execution order (empty for an idle rank)."""
        return local_samples(self.plan, rank)


class PlannedIndices(list):
    """A rank's sample ids for one step (a list, as DataLoader batch samplers yield) carrying
    the step's plan; dcp.data.local.PlannedDataset turns it into a LocalBatch."""

    def __init__(self, ids: Sequence[int], *, batch: PlannedBatch, rank: int | None) -> None:
        super().__init__(ids)
        self.batch = batch
        self.rank = rank


class GlobalBatchSampler:
    """Seeded, resumable global batches over a dataset, each planned ahead for the cluster.

    Iterating yields `PlannedBatch` for the rest of the current epoch, then moves to the next
    epoch. `set_epoch(e)` jumps to epoch e (a no-op for the current one, so it can follow
    `load_state_dict`). Call `close()` or use `with` to stop the planner workers.
    """

    def __init__(self, lengths: LengthSource, cost_model: CostModel, *, dataset: Any = None,
                 frames: LengthSource | None = None, batch_size: int | None = None,
                 token_budget: int | None = None, strategy: str | StrategyOptions = "dcp-greedy",
                 planner: Planner | None = None, seed: int = 0, plan_ahead: int = 2,
                 workers: int = 1, mp_context: str = "spawn", plan_timeout_s: float | None = None,
                 skip_unfittable: bool = False) -> None:
        """lengths/frames: per-sample tokens and (video) latent frames, see `resolve_lengths`.
        batch_size or token_budget: samples or tokens per global batch (exactly one).
        strategy: planner strategy name or options; planner: any picklable batch -> Plan callable
        instead (strategy then only sets the SP sizes the feasibility check allows).
        dcp-greedy is the default because every rank plans for itself and a time-limited ILP may
        return different incumbents on different ranks (with ilp, share rank 0's: dcp.executor.broadcast_plan).
        plan_ahead: steps planned beyond the one training; workers: planner processes (0: plan
        inline when a step needs its plan). skip_unfittable: drop (and log) samples that fit
        nowhere instead of refusing to start."""
        from dcp.planner.inputs import check_options

        if (batch_size is None) == (token_budget is None):
            raise ValueError("give exactly one of batch_size (samples) or token_budget (tokens)")
        for name, value in (("batch_size", batch_size), ("token_budget", token_budget)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
        self.cost_model = cost_model
        self.tokens = resolve_lengths(lengths, dataset, "lengths")
        self.frames = (np.ones_like(self.tokens) if frames is None
                       else resolve_lengths(frames, dataset, "frames"))
        if len(self.frames) != len(self.tokens):
            raise ValueError(f"{len(self.frames)} frame counts for {len(self.tokens)} samples")
        uneven = np.flatnonzero(self.tokens % self.frames)
        if cost_model.model.attention == "spatial_temporal" and len(uneven):
            i = int(uneven[0])
            raise ValueError(f"sample {i}: {self.tokens[i]} tokens are not {self.frames[i]} equal frames")
        self.batch_size, self.token_budget = batch_size, token_budget
        self.seed, self.epoch, self.step = seed, 0, 0
        options = check_options(strategy)

        bad = unfittable_ids(self.tokens, cost_model, options.sp_sizes)
        if len(bad) and not skip_unfittable:
            shown = ", ".join(str(i) for i in bad[:20]) + (", ..." if len(bad) > 20 else "")
            err = InfeasibleError(f"{len(bad)} sample(s) fit nowhere on {cost_model.cluster.num_gpus} GPUs of "
                                  f"{cost_model.cluster.memory_bytes / 1e9:.1f} GB: ids {shown} (tokens "
                                  f"{sorted(set(self.tokens[bad].tolist()))[:5]}...); pass "
                                  f"skip_unfittable=True to train without them")
            err.sample_ids = bad.tolist()  # type: ignore[attr-defined]
            raise err
        for i in bad.tolist():
            log.warning("skipping sample %d (%d tokens): it fits nowhere on the cluster", i, self.tokens[i])
        self.skipped_ids: list[int] = bad.tolist()
        self.ids = np.setdiff1d(np.arange(len(self.tokens)), bad)
        if len(self.ids) == 0:
            raise InfeasibleError("no sample fits the cluster")
        # The static baselines (bucket, packed) size their SP group for the longest sample trained.
        self.options = options = with_dataset(options, int(self.tokens[self.ids].max()))
        self._ahead = PlanAhead(planner or SolvePlanner(cost_model, options), workers=workers,
                                depth=plan_ahead, mp_context=mp_context, timeout_s=plan_timeout_s)
        self._cache: tuple[int, list[np.ndarray]] | None = None
        self.fingerprint = self._fingerprint()

    @classmethod
    def from_workload(cls, workload: Workload, cost_model: CostModel, **kwargs: Any) -> GlobalBatchSampler:
        """A sampler over a built-in or file workload (its tokens and frames)."""
        return cls(workload.tokens, cost_model, frames=workload.frames, **kwargs)

    # -- batches -----------------------------------------------------------------------------
    def batches(self, epoch: int | None = None) -> list[np.ndarray]:
        """The global batches (sample ids) of an epoch, the current one by default."""
        epoch = self.epoch if epoch is None else epoch
        if self._cache is None or self._cache[0] != epoch:
            self._cache = (epoch, epoch_batches(self.tokens, self.ids, seed=self.seed, epoch=epoch,
                                                batch_size=self.batch_size, token_budget=self.token_budget))
        return self._cache[1]

    def samples(self, ids: Sequence[int]) -> list[Sample]:
        """Planner samples (tokens, attention pairs for the model's attention, frames) for ids."""
        kind = self.cost_model.model.attention
        out = []
        for i in ids:
            t, f = int(self.tokens[i]), int(self.frames[i])
            out.append(Sample(int(i), t, attention_pairs(kind, t, f), f))
        return out

    def __len__(self) -> int:
        """Steps in the current epoch (all of them, also after a mid-epoch resume)."""
        return len(self.batches())

    def __iter__(self) -> Iterator[PlannedBatch]:
        epoch, batches = self.epoch, self.batches()
        jobs = (((epoch, k), self.samples(batches[k])) for k in range(self.step, len(batches)))
        # closing(): a loop that stops early cancels the plans it will not use, right away.
        with closing(self._ahead.plans(jobs)) as plans:
            for (e, k), plan, wait_s in plans:
                # Consumed when handed out: a checkpoint taken after training it resumes at k + 1.
                self.step = k + 1
                yield PlannedBatch(e, k, batches[k].tolist(), plan, wait_s)
        if self.epoch == epoch:
            self.epoch, self.step = epoch + 1, 0

    def for_rank(self, rank: int | None) -> RankBatches:
        """A DataLoader `batch_sampler`: per step, the ids `rank` loads (None: the whole batch)."""
        return RankBatches(self, rank)

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` from its first step, unless it is already the current epoch."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if epoch != self.epoch:
            self.epoch, self.step = epoch, 0

    # -- resume ------------------------------------------------------------------------------
    def _fingerprint(self) -> str:
        h = hashlib.sha256()
        for a in (self.tokens, self.frames, self.ids):
            h.update(np.ascontiguousarray(a, dtype=np.int64).tobytes())
        h.update(repr((self.batch_size, self.token_budget)).encode())
        return h.hexdigest()[:16]

    def _state(self, epoch: int, step: int) -> dict[str, Any]:
        if step >= len(self.batches(epoch)):
            epoch, step = epoch + 1, 0
        return {"epoch": epoch, "step": step, "seed": self.seed, "fingerprint": self.fingerprint}

    def state_dict(self) -> dict[str, Any]:
        """Where training stands: every batch handed out so far counts as trained."""
        return self._state(self.epoch, self.step)

    def state_dict_after(self, batch: PlannedBatch | LocalBatch) -> dict[str, Any]:
        """The state to resume from once `batch` has trained (use this when a DataLoader draws
        batches ahead of training, so the sampler's own position is ahead of the model's)."""
        return self._state(batch.epoch, batch.step + 1)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a `state_dict()`; refuses one taken over other data or batching."""
        if state.get("fingerprint") != self.fingerprint:
            raise ValueError("sampler state was saved for different lengths, skipped samples or batch size "
                             f"(fingerprint {state.get('fingerprint')} != {self.fingerprint}); resuming would "
                             "not give the same batches")
        epoch, step, seed = int(state["epoch"]), int(state["step"]), int(state["seed"])
        if epoch < 0 or step < 0 or seed < 0:
            raise ValueError(f"invalid sampler state {state}")
        self.seed, self._cache = seed, None
        if step > len(self.batches(epoch)):
            raise ValueError(f"step {step} is past the {len(self.batches(epoch))} steps of epoch {epoch}")
        self.epoch, self.step = epoch, step

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start the planner workers now (otherwise the first step starts them)."""
        self._ahead.start()

    def close(self) -> None:
        """Stop the planner workers; iterating again restarts them."""
        self._ahead.close()

    def __enter__(self) -> GlobalBatchSampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RankBatches:
    """Iterable of `PlannedIndices` for one rank, usable as a torch DataLoader batch_sampler."""

    def __init__(self, sampler: GlobalBatchSampler, rank: int | None) -> None:
        self.sampler, self.rank = sampler, rank

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[PlannedIndices]:
        for b in self.sampler:
            ids = b.sample_ids if self.rank is None else b.local_samples(self.rank)
            yield PlannedIndices(ids, batch=b, rank=self.rank)
