"""The plan for one global batch: which ranks form which SP groups, running which micro-batches. It
carries its samples and cluster, so any rank can validate it and any tool re-simulate it; its
phases' groups start when their last rank is free (`Plan.group_starts_s`: no global barrier).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from dcp.planner.sample import Sample

PLAN_SCHEMA_VERSION = 3
"""3: groups carry `ulysses`, `ring` and `phase`; 2 (no `phase`) and 1 (Ulysses only) still read."""
READABLE_SCHEMA_VERSIONS = (1, 2, 3)
SAMPLE_FIELDS = ("id", "tokens", "attn_pairs", "frames")
"""What each entry of a plan JSON's `samples` list holds, in order."""
# Predicted times are sums of floats computed in different orders by planner and validator.
_TIME_RTOL = 1e-6


def _integer(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{where}: {value!r} is not an integer")  # from_dict reports it as a PlanError
    return value


def _group_from_dict(g: dict[str, Any], version: int) -> Group:
    """A group of a version 1 (Ulysses only), 2 (`ulysses` x `ring`) or 3 (and its `phase`) plan."""
    sp = _integer(g["sp"], "group sp")
    ring = 1 if version == 1 else _integer(g["ring"], "group ring")
    if version > 1 and ring >= 1 and _integer(g["ulysses"], "group ulysses") * ring != sp:
        raise ValueError(f"group of ranks {g['ranks']!r:.40}: ulysses {g['ulysses']} x ring {ring} is not its SP size {sp}")
    phase = _integer(g["phase"], "group phase") if version >= 3 else 0
    return Group(list(g["ranks"]), sp, [MicroBatch(**mb) for mb in g["microbatches"]], ring=ring, phase=phase)


class PlanError(ValueError):
    """A plan breaks an invariant (see `Plan.validate`)."""


class InfeasibleError(ValueError):
    """A sample cannot run anywhere on the cluster."""


@dataclass
class MicroBatch:
    """Samples one SP group runs together (packed, varlen) with `ckpt_layers` checkpointed."""

    samples: list[int]
    ckpt_layers: int
    time_s: float
    memory_bytes: float


@dataclass
class Group:
    """An aligned block of ranks running its micro-batches in turn as one SP group of `sp` = ulysses
    x ring ranks: Ulysses over consecutive ranks, ring attention across them."""

    ranks: list[int]
    sp: int
    microbatches: list[MicroBatch] = field(default_factory=list)
    ring: int = 1
    """Ring degree c (1: Ulysses only); the Ulysses degree is sp / ring."""
    phase: int = 0
    """The phase of the step it runs in: 0, 1, ... in order (0 throughout a single-layout plan)."""

    @property
    def ulysses(self) -> int:
        """Ulysses degree u = sp / ring."""
        return self.sp // self.ring

    @property
    def layout(self) -> str:
        """How the group splits attention: "8" (Ulysses only) or "8x4" (Ulysses x ring)."""
        return str(self.sp) if self.ring == 1 else f"{self.ulysses}x{self.ring}"

    @property
    def busy_s(self) -> float:
        return sum(mb.time_s for mb in self.microbatches)


@dataclass
class Plan:
    """One global batch's runtime, as every rank executes it."""

    strategy: str
    num_gpus: int
    gpus_per_node: int
    memory_limit_bytes: float
    num_layers: int
    samples: list[Sample]
    groups: list[Group]
    step_time_s: float
    lower_bound_s: float
    grad_sync_s: float = 0.0
    solve_time_s: float = 0.0
    solver_status: str = "heuristic"
    gap: float | None = None
    """(step_time - best proven bound) / step_time from the solver; None for heuristics."""
    notes: list[str] = field(default_factory=list)
    zero_stage: int | None = None
    """The ZeRO stage the step was priced for (the executor checks it); None: a hand-made plan."""

    # -- derived ---------------------------------------------------------------------------
    @property
    def num_phases(self) -> int:
        """How many layouts the step runs one after another (1 for a single-layout plan)."""
        return max((g.phase for g in self.groups), default=0) + 1

    def closing_groups(self) -> dict[int, bool]:
        """Each rank's last group with micro-batches (index) -> whether every member ends there:
        only then do the reductions run under its last backward, else in an empty pass after."""
        last: dict[int, int] = {}
        for gi, g in enumerate(self.groups):
            for r in g.ranks if g.microbatches else ():
                if r not in last or self.groups[last[r]].phase < g.phase:
                    last[r] = gi
        return {gi: all(last[r] == gi for r in self.groups[gi].ranks) for gi in sorted(set(last.values()))}

    def phases(self) -> list[list[Group]]:
        """The groups of each phase, in phase order."""
        out: list[list[Group]] = [[] for _ in range(self.num_phases)]
        for g in self.groups:
            out[g.phase].append(g)
        return out

    def group_starts_s(self, busy: Sequence[float] | None = None) -> list[float]:
        """When each group starts (s): once its last rank ends its earlier phases; empty groups hold
        nobody up. `busy`: every group's busy time, when the caller has it."""
        busy = [g.busy_s for g in self.groups] if busy is None else busy
        free = [0.0] * self.num_gpus
        starts = [0.0] * len(self.groups)
        for gi in sorted(range(len(self.groups)), key=lambda i: self.groups[i].phase):
            g = self.groups[gi]
            ranks = [r for r in g.ranks if 0 <= r < self.num_gpus]
            starts[gi] = max((free[r] for r in ranks), default=0.0)
            if g.microbatches:
                end = starts[gi] + busy[gi]
                for r in ranks:
                    free[r] = end
        return starts

    def busy_s(self, busy: Sequence[float] | None = None) -> float:
        """When the last rank ends its last micro-batch (s); `busy` as for `group_starts_s`."""
        busy = [g.busy_s for g in self.groups] if busy is None else busy
        if self.num_phases == 1:
            return max(busy, default=0.0)
        return max((s + b for s, b in zip(self.group_starts_s(busy), busy, strict=True)), default=0.0)

    def groups_of_rank(self, rank: int) -> list[Group]:
        """The groups `rank` runs in, in phase order (at most one per phase; empty if idle)."""
        return [g for g in self.groups if rank in g.ranks]

    def sample_map(self) -> dict[int, Sample]:
        return {s.id: s for s in self.samples}

    # -- invariants ------------------------------------------------------------------------
    def validate(self) -> Plan:
        """Check every invariant, PlanError on the first broken: samples of 1+ tokens in equal
        frames, each run once; phases 0, 1, ... in order, each with work, its groups disjoint
        aligned power-of-two rank blocks (in a node if they fit); micro-batches in memory,
        0..num_layers checkpointed; step_time_s = `busy_s` + sync, at least the bound."""
        if self.num_gpus <= 0 or self.gpus_per_node <= 0:
            raise PlanError(f"plan cluster is invalid: {self.num_gpus} GPUs, {self.gpus_per_node} per node")
        if self.num_layers <= 0:
            raise PlanError(f"plan is for a model of {self.num_layers} layers")
        if self.zero_stage is not None and self.zero_stage not in (0, 1, 2, 3):
            raise PlanError(f"plan's ZeRO stage {self.zero_stage!r} is not 0, 1, 2 or 3")
        for s in self.samples:
            if s.tokens < 1:
                raise PlanError(f"sample {s.id} has {s.tokens} tokens; a sample needs at least 1")
            if s.frames < 1 or s.tokens % s.frames:
                raise PlanError(f"sample {s.id}: {s.tokens} tokens do not split into {s.frames} equal frames")
        ids = Counter(s.id for s in self.samples)
        dup = [i for i, n in ids.items() if n > 1]
        if dup:
            raise PlanError(f"batch lists sample {dup[0]} more than once")
        self._check_phases()
        ran: list[int] = []  # every micro-batch's samples, in order (counted once at the end)
        used: set[int] = set()
        phase = 0
        limit = self.memory_limit_bytes * (1 + 1e-9)
        for gi, g in enumerate(self.groups):
            if g.phase != phase:
                phase, used = g.phase, set()
            p = g.sp
            if p < 1 or p & (p - 1):
                raise PlanError(f"group {gi}: SP size {p} is not a power of two")
            if g.ring < 1 or g.ring & (g.ring - 1) or p % g.ring:
                raise PlanError(f"group {gi}: ring degree {g.ring} is not a power of two dividing its SP size {p}")
            if len(g.ranks) != p or g.ranks != list(range(g.ranks[0], g.ranks[0] + p)):
                raise PlanError(f"group {gi}: ranks {g.ranks} are not {p} consecutive ranks")
            start = g.ranks[0]
            if start % p:
                raise PlanError(f"group {gi}: ranks {g.ranks} do not start at a multiple of {p}")
            if start < 0 or start + p > self.num_gpus:
                raise PlanError(f"group {gi}: ranks {g.ranks} outside the {self.num_gpus} GPUs")
            if p <= self.gpus_per_node and start // self.gpus_per_node != (start + p - 1) // self.gpus_per_node:
                raise PlanError(f"group {gi}: ranks {g.ranks} cross a node boundary")
            overlap = used.intersection(g.ranks)
            if overlap:
                where = f" of phase {phase}" if self.num_phases > 1 else ""
                raise PlanError(f"group {gi}: rank {min(overlap)} is in two groups{where}")
            used.update(g.ranks)
            for mi, mb in enumerate(g.microbatches):
                if not mb.samples:
                    raise PlanError(f"group {gi} micro-batch {mi} is empty")
                if not 0 <= mb.ckpt_layers <= self.num_layers:
                    raise PlanError(f"group {gi} micro-batch {mi}: {mb.ckpt_layers} checkpointed layers "
                                    f"outside 0..{self.num_layers}")
                if mb.memory_bytes > limit:
                    raise PlanError(f"group {gi} micro-batch {mi} needs {mb.memory_bytes / 1e9:.2f} GB, "
                                    f"more than the {self.memory_limit_bytes / 1e9:.2f} GB per GPU")
                ran.extend(mb.samples)
        seen = Counter(ran)
        missing = set(ids) - set(seen)
        if missing:
            raise PlanError(f"sample {min(missing)} is in no micro-batch")
        extra = set(seen) - set(ids)
        if extra:
            raise PlanError(f"micro-batch runs sample {min(extra)}, which is not in the batch")
        twice = [i for i, n in seen.items() if n > 1]
        if twice:
            where = [f"group {gi} micro-batch {mi}" for gi, g in enumerate(self.groups)
                     for mi, mb in enumerate(g.microbatches) for i in mb.samples if i == twice[0]]
            raise PlanError(f"sample {twice[0]} runs {seen[twice[0]]} times: in {', '.join(where)}")
        expected = self.busy_s() + self.grad_sync_s
        if abs(self.step_time_s - expected) > _TIME_RTOL * max(1.0, expected):
            what = "slowest group" if self.num_phases == 1 else "end of the phases"
            raise PlanError(f"step_time_s {self.step_time_s} != {what} {self.busy_s()} + grad sync "
                            f"{self.grad_sync_s}")
        if self.step_time_s < self.lower_bound_s * (1 - _TIME_RTOL):
            raise PlanError(f"step_time_s {self.step_time_s} is below the lower bound {self.lower_bound_s}")
        if self.gap is not None and not 0 <= self.gap <= 1 + 1e-9:
            raise PlanError(f"gap {self.gap} is not a fraction")
        return self

    def _check_phases(self) -> None:
        phases = [g.phase for g in self.groups]
        for gi, ph in enumerate(phases):
            if isinstance(ph, bool) or not isinstance(ph, int) or ph < 0:
                raise PlanError(f"group {gi}: phase {ph!r} is not a whole number >= 0")
        if phases != sorted(phases):
            gi = next(i for i in range(1, len(phases)) if phases[i] < phases[i - 1])
            raise PlanError(f"group {gi} (phase {phases[gi]}) follows a group of phase {phases[gi - 1]}: "
                            "groups must be listed in phase order")
        if len(set(phases)) > 1 or phases and phases[0]:
            for ph in range(max(phases) + 1):
                if not any(g.microbatches for g in self.groups if g.phase == ph):
                    raise PlanError(f"phase {ph} runs no micro-batch (phases are numbered 0, 1, ... and "
                                    "each has work)")

    # -- serialization ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: `samples` as [id, tokens, attn_pairs, frames] lists (`sample_fields`)."""
        d = asdict(self)
        d["samples"] = [[s.id, s.tokens, s.attn_pairs, s.frames] for s in self.samples]
        d["groups"] = [{"ranks": g["ranks"], "sp": g["sp"], "ulysses": grp.ulysses, "ring": grp.ring, "phase": grp.phase,
                        "microbatches": g["microbatches"]} for g, grp in zip(d["groups"], self.groups, strict=True)]
        return {"schema_version": PLAN_SCHEMA_VERSION, "sample_fields": list(SAMPLE_FIELDS), **d}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        if not isinstance(d, dict):
            raise PlanError(f"plan must be a JSON object, got {type(d).__name__}")
        version = d.get("schema_version")
        if version not in READABLE_SCHEMA_VERSIONS:
            raise PlanError(f"plan schema_version {version!r} is not {PLAN_SCHEMA_VERSION} "
                            f"(readable: {', '.join(map(str, READABLE_SCHEMA_VERSIONS))})")
        try:
            d = dict(d)
            d.pop("schema_version")
            d.pop("sample_fields", None)
            d["samples"] = [Sample(*(_integer(v, f"sample {row!r:.60}") for v in row)) for row in d["samples"]]
            d["groups"] = [_group_from_dict(g, version) for g in d["groups"]]
            return cls(**d)
        except (KeyError, TypeError, ValueError) as e:
            raise PlanError(f"malformed plan: {e}") from e

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        try:
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as e:
            raise PlanError(f"plan is not valid JSON ({e.msg} at line {e.lineno})") from e

    def digest(self) -> str:
        """Hash of what ranks must agree on (cluster, depth, samples' tokens and frames, groups,
        phases, assignment, checkpointing; not timings); ring and phase only where present."""
        key = [(g.ranks, g.sp, [(mb.samples, mb.ckpt_layers) for mb in g.microbatches], *([g.ring] if g.ring > 1 else []))
               for g in self.groups]
        if self.num_phases > 1:
            key = [[*k, "phase", g.phase] for k, g in zip(key, self.groups, strict=True)]
        samples = [[s.id, s.tokens, s.frames] for s in self.samples]
        key_json = json.dumps([self.num_gpus, self.gpus_per_node, self.num_layers, samples, key])
        return hashlib.sha256(key_json.encode()).hexdigest()

    def to_frame(self) -> Any:
        """One row per micro-batch (pandas DataFrame)."""
        import pandas as pd

        tokens = {s.id: s.tokens for s in self.samples}
        rows = []
        for gi, g in enumerate(self.groups):
            for mi, mb in enumerate(g.microbatches):
                rows.append({
                    "group": gi, "phase": g.phase, "first_rank": g.ranks[0], "sp": g.sp, "ulysses": g.ulysses,
                    "ring": g.ring, "microbatch": mi,
                    "samples": len(mb.samples), "tokens": sum(tokens[i] for i in mb.samples),
                    "ckpt_layers": mb.ckpt_layers, "time_s": mb.time_s, "memory_gb": mb.memory_bytes / 1e9,
                })
        return pd.DataFrame(rows)
