"""Read back what `dcp plan --format json` wrote, rebuild its cost model, and describe a plan.

    doc = load_plan_document("plan.json")
    cm = doc.cost_model()
    plan = doc.step(0)
    timeline = simulate(plan, cm)
    other = reprice(plan, doc.cost_model(model="llama-13b"))   # the same plan on another model
    group_rows(plan)            # one row per SP group
    kind_shares(timeline)       # share of rank-seconds per event kind

Used by `dcp show` and the notebooks. Never imports torch, click or matplotlib.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dcp.costmodel import DEFAULT_HARDWARE, DEFAULT_MODEL, CostModel
from dcp.planner.bounds import lower_bound
from dcp.planner.plan import Plan, PlanError
from dcp.planner.pricing import group_layout
from dcp.planner.run import build_cost_model
from dcp.planner.simulate import EVENT_KINDS, Timeline
from dcp.planner.sync import price_step


@dataclass
class PlanDocument:
    """Plans read from a file: a `dcp plan --format json` document or one bare plan."""

    path: Path
    plans: list[Plan]
    config: dict[str, Any] = field(default_factory=dict)
    """The `config` object `dcp plan` stored; empty for a bare plan."""

    def step(self, index: int) -> Plan:
        """The plan of step `index` (0-based), with an error naming the valid range."""
        if not 0 <= index < len(self.plans):
            raise PlanError(f"step {index} is out of range: {self.path} has steps 0..{len(self.plans) - 1}")
        return self.plans[index]

    def describe(self) -> str:
        """One line: strategy, cluster, model and workload as far as the file says."""
        c, p = self.config, self.plans[0]
        hw = f" x {c['hardware']}" if "hardware" in c else ""
        what = ", ".join(str(c[k]) for k in ("model", "workload") if c.get(k))
        steps = f" ({len(self.plans)} steps)" if len(self.plans) > 1 else ""
        return f"{p.strategy} on {p.num_gpus}{hw}" + (f", {what}" if what else "") + steps

    def cost_model(self, model: str | None = None, hardware: str | None = None,
                   zero_stage: int | None = None) -> CostModel:
        """The cost model of the stored config, overridden by the arguments; a bare plan gets `dcp
        plan`'s model and hardware; relative file paths are the plan file's (`stored_path`)."""
        c, p = self.config, self.plans[0]
        hw = hardware or self._stored(c.get("hardware")) or DEFAULT_HARDWARE
        spec = model or self._stored(c.get("model")) or DEFAULT_MODEL
        memory_gb = c.get("memory_gb") if c else p.memory_limit_bytes / 1e9
        return build_cost_model(spec, hw, p.num_gpus, p.gpus_per_node, memory_gb,
                                int(zero_stage if zero_stage is not None else c.get("zero_stage", 1)),
                                c.get("precision", "bf16"), c.get("shard_group"))

    def _stored(self, value: Any) -> str | None:
        if value is None:
            return None
        value = str(value)
        if is_file_ref(value) and not Path(value).is_absolute():
            return str(self.path.parent / value)
        return value


def is_file_ref(value: str) -> bool:
    """Whether a --model or --hardware value names a file, not a preset (as `load_model`)."""
    return value.endswith(".json") or Path(value).is_file()


def stored_path(value: str, document: Path | None) -> str:
    """How a plan document records a --model or --hardware value: a preset as is, a file relative to
    the document's folder (absolute for stdout), so `dcp show` finds it from any directory."""
    if not is_file_ref(value):
        return value
    path = Path(value).resolve()
    if document is None:
        return str(path)
    return os.path.relpath(path, document.resolve().parent)


def reprice(plan: Plan, cm: CostModel) -> Plan:
    """The same plan (groups, assignment, checkpointing) priced on another cost model: micro-batch
    times and memory, sync, step and bound. PlanError if it no longer holds there."""
    if plan.num_gpus != cm.cluster.num_gpus:
        raise PlanError(f"plan is for {plan.num_gpus} GPUs, the cost model for {cm.cluster.num_gpus}")
    if cm.training.zero_stage == 3 and plan.num_phases > 1:
        raise PlanError(f"the plan has {plan.num_phases} phases, but ZeRO stage 3 runs one layout (lockstep "
                        "slots): plan at stage 3 instead (dcp plan --zero-stage 3)")
    k = cm.model.num_layers
    new = copy.deepcopy(plan)
    by_id = new.sample_map()
    for gi, g in enumerate(new.groups):
        for mi, mb in enumerate(g.microbatches):
            if mb.ckpt_layers > k:
                raise PlanError(f"group {gi} micro-batch {mi} checkpoints {mb.ckpt_layers} layers; {cm.model.name} "
                                f"has {k}")
            tokens = sum(by_id[i].tokens for i in mb.samples)
            pairs = sum(by_id[i].attn_pairs for i in mb.samples)
            mb.time_s = cm.time_s(tokens, pairs, g.sp, mb.ckpt_layers, group_layout(g))
            mb.memory_bytes = cm.memory_bytes(tokens, g.sp, mb.ckpt_layers, group_layout(g))
    new.num_layers, new.memory_limit_bytes = k, cm.cluster.memory_bytes
    price_step(new, cm)
    new.lower_bound_s = min(lower_bound(new.samples, cm), new.step_time_s)
    new.gap, new.solve_time_s = None, 0.0
    new.notes = [*plan.notes, f"re-priced on {cm.model.name} x {cm.hardware.name}"]
    try:
        return new.validate()
    except PlanError as e:
        raise PlanError(f"the plan does not hold on {cm.model.name} x {cm.hardware.name}: {e}") from e


def parse_plan_document(doc: Any, path: str | Path = "<plan>") -> PlanDocument:
    """A `PlanDocument` from parsed JSON: {"config", "steps": [{"plan", ...}]} or a bare plan."""
    path = Path(path)
    if isinstance(doc, dict) and "steps" in doc:
        steps = doc["steps"]
        if not isinstance(steps, list) or not steps:
            raise PlanError(f"{path}: 'steps' must be a non-empty list of plans")
        try:
            plans = [Plan.from_dict(s["plan"]) for s in steps]
        except (KeyError, TypeError) as e:
            raise PlanError(f"{path}: every step must be an object with a 'plan' ({e})") from e
        config = doc.get("config") or {}
        if not isinstance(config, dict):
            raise PlanError(f"{path}: 'config' must be an object")
        for i, p in enumerate(plans):
            try:
                p.validate()
            except PlanError as e:
                raise PlanError(f"{path}: step {i}: {e}") from e
        return PlanDocument(path, plans, dict(config))
    if isinstance(doc, dict) and "groups" in doc:
        return PlanDocument(path, [Plan.from_dict(doc).validate()])
    raise PlanError(f"{path} is not a dcp plan: expected the output of `dcp plan --format json` "
                    "(an object with 'config' and 'steps') or a single plan object")


def load_plan_document(path: str | Path) -> PlanDocument:
    """Read a plan file; malformed content raises PlanError with one clear line."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise PlanError(f"{path} is not valid JSON ({e.msg} at line {e.lineno})") from e
    except UnicodeDecodeError as e:
        raise PlanError(f"{path} is not a text file ({e.reason})") from e
    except FileNotFoundError as e:
        raise PlanError(f"plan file {path} does not exist") from e
    except OSError as e:
        raise PlanError(f"cannot read plan file {path}: {e.strerror or e}") from e
    return parse_plan_document(doc, path)


def group_rows(plan: Plan) -> Any:
    """One row per SP group (pandas DataFrame): phase, ranks, SP size, layout ("8x4": Ulysses 8 x
    ring 4), micro-batches, samples, tokens, ckpt_min/max, start and busy s, peak memory GB."""
    import pandas as pd

    tokens = {s.id: s.tokens for s in plan.samples}
    rows = []
    for gi, (g, start) in enumerate(zip(plan.groups, plan.group_starts_s(), strict=True)):
        mbs = g.microbatches
        ckpt = [mb.ckpt_layers for mb in mbs] or [0]
        rows.append({
            "group": gi, "phase": g.phase, "start_s": start, "ranks": f"{g.ranks[0]}-{g.ranks[-1]}" if len(g.ranks) > 1 else str(g.ranks[0]),
            "sp": g.sp, "layout": g.layout, "microbatches": len(mbs), "samples": sum(len(mb.samples) for mb in mbs),
            "tokens": sum(tokens[i] for mb in mbs for i in mb.samples),
            "ckpt_min": min(ckpt), "ckpt_max": max(ckpt), "busy_s": g.busy_s,
            "peak_memory_gb": max((mb.memory_bytes for mb in mbs), default=0.0) / 1e9,
        })
    return pd.DataFrame(rows)


def kind_shares(timeline: Timeline) -> dict[str, float]:
    """Share of all rank-seconds of the step spent in each event kind (sums to 1)."""
    by_kind = timeline.seconds_by_kind()
    total = sum(by_kind.values())
    return {k: (by_kind[k] / total if total else 0.0) for k in EVENT_KINDS}


def memory_headroom(plan: Plan) -> float:
    """Fraction of a GPU's usable memory left free by the plan's fullest micro-batch."""
    peak = max((mb.memory_bytes for g in plan.groups for mb in g.microbatches), default=0.0)
    return 1.0 - peak / plan.memory_limit_bytes


def checkpoint_share(plan: Plan) -> float:
    """Checkpointed over all layers run, weighted by micro-batch: 1.0 is full recomputation."""
    mbs = [mb for g in plan.groups for mb in g.microbatches]
    return sum(mb.ckpt_layers for mb in mbs) / (plan.num_layers * len(mbs)) if mbs else 0.0


def unused_ranks(plan: Plan) -> int:
    """Ranks in no group of any phase: they only wait for the gradient all-reduce."""
    return plan.num_gpus - len({r for g in plan.groups for r in g.ranks})
