"""`dcp measure-memory`: measure a model JSON's memory footprints ahead of planning."""

from __future__ import annotations

import click

from dcp.commands.common import measure_missing_memory
from dcp.costmodel import RECIPES
from dcp.costmodel.presets import footprint_cache_path


@click.command("measure-memory")
@click.argument("model", metavar="MODEL.json")
@click.option("--precision", "recipes", type=click.Choice(list(RECIPES)), multiple=True,
              help="Recipe to measure (repeatable). Default: every recipe.")
def measure_memory(model: str, recipes: tuple[str, ...]) -> None:
    """Measure the memory footprint of a model JSON in every precision recipe.

    Runs the model's reference implementation at its real shape on fake tensors (no memory is
    allocated, any size takes seconds) and counts what autograd saves per layer, plain and
    checkpointed, and the peak's working memory. The result is cached beside the JSON as
    NAME.memory.json, which `dcp plan`, `compare`, `show` and `profile` read; they also
    measure a missing recipe themselves, so this command only does it ahead of time.

    \b
    Example:
      dcp measure-memory my.json
    """
    measure_missing_memory(model, list(recipes or RECIPES))
    click.echo(f"{model}: memory footprints for {', '.join(recipes or RECIPES)} in {footprint_cache_path(model)}")
