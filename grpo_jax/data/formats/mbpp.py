"""MBPP (`mbpp`): google-research/mbpp rows (task_id, text, code, test_list, test_setup_code), through
grpo_jax.codegen.datasets.mbpp_problem (the built-in MBPP set's own converter; integer ids become `Mbpp/N`).

A file detected as HumanEval or MBPP (no format named) may mix rows of the two (`either`), as before.
"""

from __future__ import annotations

from grpo_jax.codegen import datasets
from grpo_jax.data import common as c
from grpo_jax.data.formats import humaneval
from grpo_jax.data.registry import Format, register
from grpo_jax.problem import Problem


def convert(row: dict, ctx: c.Ctx) -> Problem:
    humaneval.missing(row, ctx, FORMAT)
    return humaneval.legacy(row, ctx, FORMAT, datasets.mbpp_problem)


def either(row: dict, ctx: c.Ctx) -> Problem:
    """A row of a detected HumanEval / MBPP file: whichever of the two its fields are."""
    for fmt in (humaneval.FORMAT, FORMAT):
        if set(fmt.signature) <= row.keys():
            return fmt.convert(row, ctx)
    raise c.DatasetError(
        ctx.where,
        "fields",
        f"neither {humaneval.FORMAT.title} nor {FORMAT.title}",
        f"{humaneval.FORMAT.title} / {FORMAT.title}",
    )


FORMAT = register(
    Format(
        name="mbpp",
        signature=("task_id", "text", "code", "test_list"),
        description="MBPP format",
        follows="google-research/mbpp (mbpp.jsonl); the evalplus task-id convention",
        convert=convert,
        order=11,
        unique_ids=False,
    )
)
