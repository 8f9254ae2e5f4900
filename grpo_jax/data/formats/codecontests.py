"""CodeContests (`codecontests`): google-deepmind/code_contests (contest_problem.proto ContestProblem) as the
Hugging Face deepmind/code_contests rows lay it out, in JSON Lines or in the Hub's parquet shards (whose test
columns are structs {input: list<string>, output: list<string>}: read as dicts, the same data).
"""

from __future__ import annotations

from grpo_jax.data import common as c
from grpo_jax.data.registry import Format, register
from grpo_jax.problem import Problem
from grpo_jax.sandbox.types import plain_file_name_error

_CC_TESTS = '{"input": [str, ...], "output": [str, ...]} (or a list of {"input": str, "output": str})'
PYTHON3 = 3  # contest_problem.proto Solution.Language.PYTHON3


def convert(row: dict, ctx: c.Ctx) -> Problem:
    """google-deepmind/code_contests contest_problem.proto (ContestProblem) as the Hugging Face
    deepmind/code_contests rows lay it out: `name` (the task id), `description`, `public_tests` (visible),
    `private_tests` + `generated_tests` (hidden, in that order), each {"input": [...], "output": [...]};
    every test is stdin/stdout. `solutions` {"language": [...], "solution": [...]}: the first PYTHON3 (3) one
    is the reference. A problem that reads `input_file` / writes `output_file` (the proto's file I/O) is
    graded so: its input is that file in the sandbox's work dir, its answer that file's content."""
    name = c.text(row, "name", ctx, nonempty=True)
    description = c.text(row, "description", ctx, nonempty=True)
    io = {}
    for f in ("input_file", "output_file"):
        v = row.get(f) or ""
        why = plain_file_name_error(v) if isinstance(v, str) else "not a string"
        if why:
            raise c.DatasetError(ctx.where, f, f"{v!r} ({why})", "a plain file name, or empty (standard I/O)")
        if v:
            io[f] = v
    if io.get("input_file") and io.get("input_file") == io.get("output_file"):
        raise c.DatasetError(ctx.where, "output_file", "the input file's name", "another file name")
    public = _cc_tests(row, "public_tests", ctx, "public", io)
    hidden = _cc_tests(row, "private_tests", ctx, "private", io) + _cc_tests(
        row, "generated_tests", ctx, "generated", io
    )
    reference = ""
    sols = row.get("solutions")
    if (
        isinstance(sols, dict)
        and isinstance(sols.get("language"), list)
        and isinstance(sols.get("solution"), list)
    ):
        for lang, code in zip(sols["language"], sols["solution"], strict=False):
            if lang == PYTHON3 and isinstance(code, str):
                reference = code
                break
    elif sols not in (None, "", [], {}):
        raise c.DatasetError(
            ctx.where, "solutions", "malformed", '{"language": [int, ...], "solution": [str, ...]}'
        )
    return c.make_problem(
        ctx,
        task_id=name,
        statement=description,
        starter_code="",
        test_kind="stdio",
        fn_name="",
        public=public,
        hidden=hidden,
        reference=reference,
        source="codecontests",
        split="train",
    )


def _cc_tests(row: dict, field: str, ctx: c.Ctx, label: str, io: dict) -> list:
    v = row.get(field)
    if v is None:
        return []
    if isinstance(v, list):  # the proto's repeated Test as JSON
        if not all(isinstance(t, dict) for t in v):
            raise c.DatasetError(ctx.where, field, "a list of non-objects", _CC_TESTS)
        ins, outs = [t.get("input") for t in v], [t.get("output") for t in v]
    elif isinstance(v, dict):
        ins, outs = v.get("input", []), v.get("output", [])
    else:
        raise c.DatasetError(ctx.where, field, f"a JSON {type(v).__name__}", _CC_TESTS)
    if not isinstance(ins, list) or not isinstance(outs, list) or len(ins) != len(outs):
        raise c.DatasetError(ctx.where, field, "input and output are not lists of one length", _CC_TESTS)
    out = []
    for i, (a, b) in enumerate(zip(ins, outs, strict=True)):
        if not isinstance(a, str) or not isinstance(b, str):
            raise c.DatasetError(ctx.where, f"{field}[{i}]", "input / output not strings", _CC_TESTS)
        out.append(c.stdio_test(a, b, f"{label} {i}", **io))
    return out


FORMAT = register(
    Format(
        name="codecontests",
        signature=("name", "description", "public_tests", "private_tests"),
        description="CodeContests format",
        follows="google-deepmind/code_contests contest_problem.proto; the deepmind/code_contests card",
        convert=convert,
        order=21,
        aliases=("code_contests",),
        # incorrect_solutions (most of a shard's bytes) is never read
        columns=(
            "name",
            "description",
            "public_tests",
            "private_tests",
            "generated_tests",
            "solutions",
            "input_file",
            "output_file",
            "difficulty",
            "time_limit",
        ),
        difficulty=lambda row: row.get("difficulty"),
    )
)
