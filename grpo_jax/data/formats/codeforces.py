"""Open-R1 Codeforces (`codeforces`): open-r1/codeforces on the Hugging Face Hub (columns id, title,
description, input_format, output_format, note, examples, official_tests, official_tests_complete,
input_mode, generated_checker, interaction_format, time_limit, memory_limit, rating, ...), read as its card
describes and as Open-R1 grades it (huggingface/open-r1 src/open_r1/utils/competitive_programming/
cf_scoring.py, which runs the guipenedo/piston `codeforces` package's `run` script):

* `id` ("1234/A") is the task id; the statement is the title, description, input and output formats and
  note, as the problem page shows them; `examples` [{input, output}] are the public tests (shown per
  --visible_tests), `official_tests` [{input, output}] the hidden ones (`official_tests_complete` false: the
  dataset kept only the tests that fit; graded on those);
* `input_mode` "file": the program reads `input.txt` and writes `output.txt` (its standard output is
  ignored), in the sandbox's working directory (TestCase input_file / output_file);
* `generated_checker`: a Python checker for problems with several right answers, run in the sandbox as its
  own program, never in the candidate's process, as `checker.py INPUT CORRECT_OUTPUT SOLUTION_OUTPUT`; the
  test passes iff it prints 1 or 100 (TestCase checker); a checker that does not compile is left out
  (counted, `Unsupported`), as are interactive problems (`interaction_format`);
* without a checker the output is compared by the sandbox's stdout rule (lines and tokens, numbers by value);
* `rating` is the difficulty (--difficulty); no reference solution (the dataset has none).
"""

from __future__ import annotations

import ast
import warnings

from grpo_jax.data import common as c
from grpo_jax.data.registry import Format, register
from grpo_jax.problem import Problem

_TESTS = '[{"input": str, "output": str}, ...]'
IO_FILES = ("input.txt", "output.txt")  # Codeforces' input_mode "file" names


def convert(row: dict, ctx: c.Ctx) -> Problem:
    tid = c.task_id(row, "id", ctx)
    if row.get("interaction_format"):
        raise c.Unsupported(
            ctx.where, "interaction_format", "an interactive problem", "stdio or file problems"
        )
    mode = row.get("input_mode") or "stdio"
    if mode not in ("stdio", "file"):
        raise c.DatasetError(ctx.where, "input_mode", repr(mode), '"stdio" or "file"')
    checker = c.text(row, "generated_checker", ctx, required=False)
    if checker.strip():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ast.parse(checker)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
            raise c.Unsupported(
                ctx.where, "generated_checker", f"does not compile ({type(e).__name__})", "a Python checker"
            ) from None
    kw = {}
    if checker.strip():
        kw["checker"] = checker
    if mode == "file":
        kw["input_file"], kw["output_file"] = IO_FILES
    public = _tests(row, "examples", ctx, "example", kw, required=False)
    hidden = _tests(row, "official_tests", ctx, "official", kw, required=True)
    parts = [c.text(row, "title", ctx, required=False), c.text(row, "description", ctx, nonempty=True)]
    for head, field in (("Input", "input_format"), ("Output", "output_format"), ("Note", "note")):
        body = c.text(row, field, ctx, required=False)
        if body.strip():
            parts.append(f"{head}\n\n{body.strip()}")
    if mode == "file":
        parts.append(
            "The program reads its input from the file input.txt and writes its answer to output.txt."
        )
    instruction = (
        "Write a complete Python 3 program that reads the input from input.txt and writes the answer to "
        "output.txt."
        if mode == "file"
        else ""
    )
    return c.make_problem(
        ctx,
        task_id=tid,
        statement="\n\n".join(p.strip() for p in parts if p.strip()),
        starter_code="",
        test_kind="stdio",
        fn_name="",
        public=public,
        hidden=hidden,
        reference="",
        source="codeforces",
        split="train",
        instruction=instruction,
    )


def _tests(row: dict, field: str, ctx: c.Ctx, label: str, kw: dict, required: bool) -> list:
    v = c.need(row, field, ctx, _TESTS) if required else (row.get(field) or [])
    v = c.json_field(v, ctx, field, _TESTS)
    if not isinstance(v, list):
        raise c.DatasetError(ctx.where, field, f"a JSON {type(v).__name__}", _TESTS)
    out = []
    for i, t in enumerate(v):
        if (
            not isinstance(t, dict)
            or not isinstance(t.get("input"), str)
            or not isinstance(t.get("output"), str)
        ):
            raise c.DatasetError(ctx.where, f"{field}[{i}]", "not {input: str, output: str}", _TESTS)
        out.append(c.stdio_test(t["input"], t["output"], f"{label} {i}", **kw))
    return out


FORMAT = register(
    Format(
        name="codeforces",
        signature=("id", "description", "official_tests"),
        description="Open-R1 Codeforces format",
        follows="the open-r1/codeforces card; open-r1 cf_scoring.py; guipenedo/piston codeforces run",
        convert=convert,
        order=22,
        columns=(
            "id",
            "title",
            "description",
            "input_format",
            "output_format",
            "note",
            "examples",
            "official_tests",
            "official_tests_complete",
            "input_mode",
            "generated_checker",
            "interaction_format",
            "time_limit",
            "memory_limit",
            "rating",
        ),
        difficulty=lambda row: row.get("rating"),
    )
)
