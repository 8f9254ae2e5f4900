"""This project's own format (`native`): task_id, statement, kind "stdio" | "call", fn_name (call),
starter_code, public_tests, tests (hidden, at least one), reference, split, time_limit_s, prelude
(docs/DATA_FORMATS.md).
"""

from __future__ import annotations

from grpo_jax.data import common as c
from grpo_jax.data.registry import Format, register
from grpo_jax.problem import Problem

_NATIVE_TEST = {
    "stdio": '{"input": str, "output": str}',
    "call": '{"args": [JSON, ...], "output": JSON}',
}


def convert(row: dict, ctx: c.Ctx) -> Problem:
    """This project's JSONL (docs/DATA_FORMATS.md): task_id, statement, kind "stdio" | "call", fn_name (call),
    starter_code, public_tests, tests (hidden, at least one), reference, split, time_limit_s, prelude."""
    task_id = c.task_id(row, "task_id", ctx)
    statement = c.text(row, "statement", ctx, nonempty=True)
    kind = row.get("kind")
    if kind not in _NATIVE_TEST:
        raise c.DatasetError(ctx.where, "kind", repr(kind), '"stdio" or "call"')
    starter = c.text(row, "starter_code", ctx, required=False)
    fn = (
        c.fn_name(c.need(row, "fn_name", ctx, "a Python identifier"), ctx, "fn_name")
        if kind == "call"
        else ""
    )
    cls = c.solution_class(starter)
    split = c.text(row, "split", ctx, required=False) or "train"
    tl = row.get("time_limit_s")
    if tl is not None and (isinstance(tl, bool) or not isinstance(tl, (int, float)) or not tl > 0):
        raise c.DatasetError(ctx.where, "time_limit_s", repr(tl), "a number of seconds > 0")
    groups = []
    for field, label in (("public_tests", "public"), ("tests", "private")):
        items = row.get(field) if field == "public_tests" else c.need(row, field, ctx, "a list")
        items = [] if items is None else items
        if not isinstance(items, list):
            raise c.DatasetError(
                ctx.where, field, f"a JSON {type(items).__name__}", "a list of " + _NATIVE_TEST[kind]
            )
        out = []
        for i, t in enumerate(items):
            f = f"{field}[{i}]"
            if not isinstance(t, dict) or "output" not in t:
                raise c.DatasetError(ctx.where, f, "malformed", _NATIVE_TEST[kind])
            if kind == "stdio":
                if not isinstance(t.get("input"), str) or not isinstance(t["output"], str):
                    raise c.DatasetError(ctx.where, f, "input / output not strings", _NATIVE_TEST[kind])
                out.append(c.stdio_test(t["input"], t["output"], f"{label} {i}"))
            else:
                if not isinstance(t.get("args"), list):
                    raise c.DatasetError(ctx.where, f + ".args", "not a list", _NATIVE_TEST[kind])
                out.append(c.call_test(fn, cls, t["args"], t["output"], f"{label} {i}", ctx, f))
        groups.append(out)
    return c.make_problem(
        ctx,
        task_id=task_id,
        statement=statement,
        starter_code=starter,
        test_kind=kind,
        fn_name=fn,
        public=groups[0],
        hidden=groups[1],
        reference=c.text(row, "reference", ctx, required=False),
        source="native",
        split=split,
        prelude=c.text(row, "prelude", ctx, required=False),
        time_limit_s=float(tl) if tl is not None else None,
    )


FORMAT = register(
    Format(
        name="native",
        signature=("task_id", "statement", "kind", "tests"),
        description="native format",
        follows="docs/DATA_FORMATS.md (this project)",
        convert=convert,
        order=41,
        difficulty=lambda row: row.get("difficulty"),
    )
)
