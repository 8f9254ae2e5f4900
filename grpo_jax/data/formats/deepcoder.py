"""DeepCoder (`deepcoder`): agentica-org/DeepCoder-Preview-Dataset on the Hugging Face Hub (subsets
primeintellect, taco, lcbv5, codeforces; columns `problem`, `tests`, and where a subset has them
`starter_code`, `metadata`, `solutions`), read as agentica-project/rllm builds and grades it
(scripts/data/deepcoder_dataset.py, rllm/rewards/code_reward.py):

* `tests` is a JSON string (or nested data) in one of two layouts:
  - a dict {"inputs": [...], "outputs": [...], "fn_name"?} (the taco subset): TACO's conventions (apps);
  - a list of {"input", "output", ...}: with "testtype" "stdin" | "functional" (lcbv5): LiveCodeBench's
    conventions (a functional test's input is one JSON argument a line, its output one JSON value, the
    function `metadata.func_name`); with "type" "stdin_stdout" | "function_call" (primeintellect):
    SYNTHETIC-1's; with neither (codeforces): stdin/stdout;
* the rows have no id: the task id is "deepcoder/<row index>" (its 0-based position in the input);
* every test is hidden; `starter_code` is shown; the first of `solutions` (if any) is the reference.
"""

from __future__ import annotations

from grpo_jax.data import common as c
from grpo_jax.data.formats import apps, livecodebench
from grpo_jax.data.registry import Format, register
from grpo_jax.problem import Problem

_TESTS = (
    'a JSON string: {"inputs": [...], "outputs": [...], "fn_name"?} or [{"input", "output", '
    '"testtype"? | "type"?}, ...]'
)


def convert(row: dict, ctx: c.Ctx) -> Problem:
    statement = c.text(row, "problem", ctx, nonempty=True)
    starter = c.text(row, "starter_code", ctx, required=False)
    tests = c.json_field(c.need(row, "tests", ctx, _TESTS), ctx, "tests", _TESTS)
    meta = row.get("metadata")
    meta = {} if meta in (None, "") else c.json_field(meta, ctx, "metadata", 'JSON {"func_name"?}')
    if not isinstance(meta, dict):
        raise c.DatasetError(ctx.where, "metadata", f"a JSON {type(meta).__name__}", 'JSON {"func_name"?}')
    cls = c.solution_class(starter)
    if isinstance(tests, dict):
        ins, outs = tests.get("inputs"), tests.get("outputs")
        if not isinstance(ins, list) or not isinstance(outs, list) or len(ins) != len(outs):
            raise c.DatasetError(ctx.where, "tests", "inputs / outputs not lists of one length", _TESTS)
        fn = tests.get("fn_name") or meta.get("func_name") or ""
        if fn:
            kind, fn = "call", c.fn_name(fn, ctx, "tests.fn_name")
            hidden = apps.call_tests(fn, cls, ins, outs, ctx, "tests")
        else:
            kind, hidden = "stdio", apps.stdio_tests(ins, outs, ctx, "tests")
    elif isinstance(tests, list):
        kind, fn, hidden = _listed(tests, meta, cls, ctx)
    else:
        raise c.DatasetError(ctx.where, "tests", f"a JSON {type(tests).__name__}", _TESTS)
    sols = row.get("solutions")
    sols = c.json_field(sols, ctx, "solutions", "a list of programs") if sols not in (None, "") else []
    ref = sols[0] if isinstance(sols, list) and sols and isinstance(sols[0], str) else ""
    return c.make_problem(
        ctx,
        task_id=f"deepcoder/{ctx.index}",
        statement=statement,
        starter_code=starter,
        test_kind=kind,
        fn_name=fn,
        public=[],
        hidden=hidden,
        reference=c.strip_fence(ref) if ref else "",
        source="deepcoder",
        split="train",
    )


def _listed(tests: list, meta: dict, cls: bool, ctx: c.Ctx) -> tuple[str, str, list]:
    for i, t in enumerate(tests):
        if not isinstance(t, dict) or "input" not in t or "output" not in t:
            raise c.DatasetError(ctx.where, f"tests[{i}]", "malformed", _TESTS)
    marks = {t.get("testtype") or t.get("type") or "stdin" for t in tests}
    if marks <= {"stdin", "stdin_stdout"}:
        return "stdio", "", c.listed_stdio_tests(tests, ctx, "tests")
    if marks == {"function_call"}:  # SYNTHETIC-1's layout
        fn = c.fn_name(tests[0].get("fn_name") or meta.get("func_name"), ctx, "tests[0].fn_name")
        ins, outs = [t["input"] for t in tests], [t["output"] for t in tests]
        return "call", fn, apps.call_tests(fn, cls, ins, outs, ctx, "tests", json_strings=True)
    if marks == {"functional"}:  # LiveCodeBench's layout
        fn = c.fn_name(meta.get("func_name"), ctx, "metadata.func_name")
        out = []
        for i, t in enumerate(tests):
            if not isinstance(t["input"], str) or not isinstance(t["output"], str):
                raise c.DatasetError(ctx.where, f"tests[{i}]", "input / output not strings", _TESTS)
            out.append(livecodebench.functional_test(fn, cls, t, f"test {i}", ctx, f"tests[{i}]"))
        return "call", fn, out
    raise c.DatasetError(
        ctx.where,
        "tests",
        f"test types {sorted(map(str, marks))} mixed or unknown",
        '"stdin" / "functional" (testtype) or "stdin_stdout" / "function_call" (type), one kind a problem',
    )


FORMAT = register(
    Format(
        name="deepcoder",
        signature=("problem", "tests"),
        description="DeepCoder-Preview format",
        follows="the agentica-org/DeepCoder-Preview-Dataset card; agentica-project/rllm deepcoder_dataset.py",
        convert=convert,
        order=25,
    )
)
