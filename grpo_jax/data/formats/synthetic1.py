"""SYNTHETIC-1's code problems (`synthetic1`): PrimeIntellect/verifiable-coding-problems on the Hugging Face
Hub (columns source, task_type, in_source_id, prompt, gold_standard_solution, verification_info, metadata,
problem_id), read as the dataset card describes and as agentica-project/rllm's graders run them
(rllm/rewards/code_reward.py `primeintellect_check_correctness`,
rllm/data/preprocess/code/primeintellect.ipynb):

* `problem_id` is the task id, `prompt` the statement (it already says which language and I/O to use; this
  project's instruction follows it);
* `verification_info`: a JSON string (or the same as nested data; a Python-literal string, which some rows
  hold, is read with `ast.literal_eval`, which evaluates literals only) {"language": "python",
  "test_cases": [{"type": "stdin_stdout" | "function_call", "input", "output", "fn_name"?}, ...]};
* stdin_stdout tests: input / output strings; function_call tests: the TACO conventions (rllm converts them to
  TACO's input_output and runs TACO's testing_util): `input` the argument list, `output` the result wrapped in
  a one-element list (either may be a JSON string of that), `fn_name` the function (the first test's);
* every test is hidden (the prompt shows its own examples); `gold_standard_solution` (a ```python fenced
  program) is the reference; `metadata` (JSON) may hold `difficulty`.
"""

from __future__ import annotations

import ast
import json

from grpo_jax.data import common as c
from grpo_jax.data.formats import apps
from grpo_jax.data.registry import Format, register
from grpo_jax.problem import Problem

_INFO = (
    'a JSON string {"language": "python", "test_cases": [{"type": "stdin_stdout" | "function_call", '
    '"input", "output", "fn_name"?}, ...]}'
)
TYPES = ("stdin_stdout", "function_call")


def literal_or_json(v, ctx: c.Ctx, field: str, valid: str):
    """JSON, else a Python literal (ast.literal_eval: literals only, nothing is called)."""
    if not isinstance(v, str):
        return v
    try:
        return json.loads(v)
    except (json.JSONDecodeError, RecursionError):
        pass
    try:
        return ast.literal_eval(v)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as e:
        raise c.DatasetError(
            ctx.where, field, f"neither JSON nor a Python literal ({type(e).__name__})", valid
        ) from None


def convert(row: dict, ctx: c.Ctx) -> Problem:
    tid = c.task_id(row, "problem_id", ctx)
    statement = c.text(row, "prompt", ctx, nonempty=True)
    info = literal_or_json(c.need(row, "verification_info", ctx, _INFO), ctx, "verification_info", _INFO)
    if not isinstance(info, dict) or not isinstance(info.get("test_cases"), list):
        raise c.DatasetError(ctx.where, "verification_info", "no test_cases list", _INFO)
    lang = info.get("language", "python")
    if lang != "python":
        raise c.DatasetError(ctx.where, "verification_info.language", repr(lang), '"python"')
    cases = info["test_cases"]
    for i, t in enumerate(cases):
        if not isinstance(t, dict) or "input" not in t or "output" not in t:
            raise c.DatasetError(ctx.where, f"verification_info.test_cases[{i}]", "malformed", _INFO)
    types = {t.get("type", "stdin_stdout") for t in cases}
    if not types <= set(TYPES) or len(types) > 1:
        raise c.DatasetError(
            ctx.where, "verification_info.test_cases", f"types {sorted(map(str, types))}", f"one of {TYPES}"
        )
    ins, outs = [t["input"] for t in cases], [t["output"] for t in cases]
    field = "verification_info.test_cases"
    if types == {"function_call"}:
        kind = "call"
        fn = c.fn_name(cases[0].get("fn_name"), ctx, f"{field}[0].fn_name")
        hidden = apps.call_tests(fn, False, ins, outs, ctx, field, json_strings=True)
    else:
        kind, fn, hidden = "stdio", "", c.listed_stdio_tests(cases, ctx, field)
    gold = c.text(row, "gold_standard_solution", ctx, required=False)
    return c.make_problem(
        ctx,
        task_id=tid,
        statement=statement,
        starter_code="",
        test_kind=kind,
        fn_name=fn,
        public=[],
        hidden=hidden,
        reference=c.strip_fence(gold) if gold else "",
        source="synthetic1",
        split="train",
    )


def _difficulty(row: dict):
    meta = row.get("metadata")
    try:
        meta = json.loads(meta) if isinstance(meta, str) else meta
    except (json.JSONDecodeError, RecursionError):
        return None
    return meta.get("difficulty") if isinstance(meta, dict) else None


FORMAT = register(
    Format(
        name="synthetic1",
        signature=("problem_id", "prompt", "verification_info"),
        description="SYNTHETIC-1 / PrimeIntellect verifiable-coding-problems format",
        follows="the PrimeIntellect/verifiable-coding-problems card; agentica-project/rllm code_reward.py",
        convert=convert,
        order=24,
        aliases=("primeintellect",),
        difficulty=_difficulty,
    )
)
