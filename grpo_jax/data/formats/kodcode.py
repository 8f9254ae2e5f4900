"""KodCode (`kodcode`): KodCode/KodCode-V1 on the Hugging Face Hub (KodCode: A Diverse, Challenging, and
Verifiable Synthetic Dataset for Coding, 2025; columns question_id, question, solution, test_code, test_info,
gpt_difficulty, subset, style, ...), read as its card describes:

* `question_id` is the task id (else "kodcode/<row index>"), `question` the statement, `solution` the
  reference;
* `test_code` is pytest source that imports the candidate as the module `solution`
  (`from solution import f`); each `test_*` function (each parameter set of a parametrized one) is one test
  (grpo_jax.sandbox.pytest_tests.split_pytest): its asserts are graded in the parent where they split into a
  call and an expected value (as MBPP's), the other test functions run in the sandbox's checker process,
  which calls the candidate's functions from its own process, with a small `pytest` stand-in (raises, approx,
  parametrize, skip);
* the function(s) to write are named by `test_info` [{function_name, function_declaration, ...}] (or
  `test_entry_point` in older revisions); the prompt names them and says the tests import them from the
  program;
* `gpt_difficulty` ("easy" / "medium" / "hard") is the difficulty (--difficulty).
"""

from __future__ import annotations

from grpo_jax.data import common as c
from grpo_jax.data.registry import Format, register
from grpo_jax.problem import Problem
from grpo_jax.sandbox.asserts import defined_names
from grpo_jax.sandbox.pytest_tests import split_pytest

INSTRUCTION = (
    "Write a Python program that defines {names}. The tests import {them} from your program "
    "(`from solution import ...`) and check the results."
)


def _entry_points(row: dict, ctx: c.Ctx) -> list[str]:
    info = row.get("test_info")
    info = c.json_field(info, ctx, "test_info", "a list of {function_name, ...}") if info else []
    names = []
    if isinstance(info, list):
        for i, t in enumerate(info):
            name = t.get("function_name") if isinstance(t, dict) else None
            if name:
                names.append(c.fn_name(name, ctx, f"test_info[{i}].function_name"))
    entry = row.get("test_entry_point")
    if not names and entry:
        names.append(c.fn_name(entry, ctx, "test_entry_point"))
    return names


def convert(row: dict, ctx: c.Ctx) -> Problem:
    qid = row.get("question_id")
    tid = c.task_id(row, "question_id", ctx) if qid not in (None, "") else f"kodcode/{ctx.index}"
    question = c.text(row, "question", ctx, nonempty=True)
    reference = c.text(row, "solution", ctx, required=False)
    test_code = c.text(row, "test_code", ctx, nonempty=True)
    names = _entry_points(row, ctx)
    try:
        split = split_pytest(test_code, set(names) | (defined_names(reference) if reference else set()))
    except (ValueError, SyntaxError) as e:
        raise c.DatasetError(
            ctx.where, "test_code", str(e) or type(e).__name__, "pytest test functions"
        ) from None
    if not split.names:
        raise c.DatasetError(ctx.where, "test_code", "no test_* function", "pytest test functions")
    shown = ", ".join(f"`{n}`" for n in names) if names else "the functions the tests import"
    instruction = INSTRUCTION.format(names=shown, them="it" if len(names) == 1 else "them")
    prompt = c.build_prompt(question, test_kind="assert", instruction=instruction)
    return Problem(
        task_id=tid,
        prompt=prompt,
        entry_point=names[0] if names else "",
        reference=reference,
        tests=split.tests,
        child_check=split.child_check,
        setup_code=split.setup_code,
        completion_mode="program",
        split="train",
        source="kodcode",
        description=question,
        test_kind="assert",
    )


FORMAT = register(
    Format(
        name="kodcode",
        signature=("question", "solution", "test_code"),
        description="KodCode format",
        follows="the KodCode/KodCode-V1 card (KodCode, 2025)",
        convert=convert,
        order=23,
        columns=(
            "question_id",
            "question",
            "solution",
            "test_code",
            "test_info",
            "test_entry_point",
            "gpt_difficulty",
            "style",
            "subset",
        ),
        difficulty=lambda row: row.get("gpt_difficulty"),
    )
)
