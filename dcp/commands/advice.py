"""What the planning commands check before planning, with advice that can help: model states that
fill the GPU before any sample does."""

from __future__ import annotations

from typing import Any

from dcp.costmodel import RECIPES, CostModel, CostModelError
from dcp.planner.run import build_cost_model

MAX_GPUS = 2**20
"""The largest job the memory advice considers: more GPUs than this is no advice."""


def check_model_states(cm: CostModel, config: dict[str, Any]) -> None:
    """When the model states alone (parameters, gradients, optimizer, what the ZeRO schedule gathers)
    fill the usable memory, say so and offer only what fits them: a higher ZeRO stage, another
    precision recipe, more GPUs (at most `MAX_GPUS`); or that none of these can."""
    room = cm.cluster.memory_bytes
    if cm.static_bytes < room:
        return

    def static(**change: Any) -> float | None:
        c = {**config, **change}
        try:
            return build_cost_model(c["model"], c["hardware"], c["gpus"], c["gpus_per_node"], c["memory_gb"],
                                    c["zero_stage"], c["precision"]).static_bytes
        except (CostModelError, ValueError):  # e.g. a model JSON without that recipe's footprint
            return None

    helps = []
    for stage in range(config["zero_stage"], 4):  # this stage on more GPUs, or a higher one
        gpus = config["gpus"]
        while gpus <= MAX_GPUS:
            need = static(zero_stage=stage, gpus=gpus)
            if need is not None and need < room:
                flags = [f"--zero-stage {stage}"] * (stage != config["zero_stage"])
                flags += [f"--gpus {gpus}"] * (gpus != config["gpus"])
                helps.append(f"{' '.join(flags)} ({need / 1e9:.1f} GB)")
                break
            gpus *= 2
    for recipe in RECIPES:
        need = static(precision=recipe) if recipe != config["precision"] else None
        if need is not None and need < room:
            helps.append(f"--precision {recipe} ({need / 1e9:.1f} GB)")
    what = (f"model states of {cm.model.name} need {cm.static_bytes / 1e9:.1f} GB per GPU at ZeRO stage "
            f"{config['zero_stage']} in {config['precision']}, more than the {room / 1e9:.1f} GB usable")
    if helps:
        raise CostModelError(f"{what}; these fit them: {', '.join(helps)}")
    raise CostModelError(f"{what}, and no ZeRO stage, precision recipe or GPU count (up to {MAX_GPUS:,}) "
                         "brings them under it: plan a smaller model or a GPU with more memory (--memory-gb)")
