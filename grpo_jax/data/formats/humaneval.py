"""HumanEval (`humaneval`): openai/human-eval rows (task_id, prompt, entry_point, canonical_solution, test),
through grpo_jax.codegen.datasets.humaneval_problem (the built-in HumanEval set's own converter)."""

from __future__ import annotations

from grpo_jax.codegen import datasets
from grpo_jax.data import common as c
from grpo_jax.data.registry import Format, register
from grpo_jax.problem import Problem


def legacy(row: dict, ctx: c.Ctx, fmt: Format, fn) -> Problem:
    """A HumanEval / MBPP converter's errors as one DatasetError naming the row and the format."""
    try:
        return fn(row)
    except (KeyError, TypeError, ValueError, AttributeError, SyntaxError) as e:
        raise c.DatasetError(ctx.where, "row", f"{type(e).__name__}: {e}", fmt.title) from None


def missing(row: dict, ctx: c.Ctx, fmt: Format) -> None:
    lack = [f for f in fmt.signature if f not in row]
    if lack:
        raise c.DatasetError(ctx.where, ", ".join(sorted(lack)), "missing", fmt.title)


def convert(row: dict, ctx: c.Ctx) -> Problem:
    missing(row, ctx, FORMAT)
    return legacy(row, ctx, FORMAT, datasets.humaneval_problem)


FORMAT = register(
    Format(
        name="humaneval",
        signature=("task_id", "prompt", "entry_point", "canonical_solution", "test"),
        description="HumanEval format",
        follows="openai/human-eval human_eval/data.py and execution.py",
        convert=convert,
        order=10,
        unique_ids=False,
    )
)
