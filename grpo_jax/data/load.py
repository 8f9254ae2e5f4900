"""Problems from a dataset input (any container of grpo_jax.data.containers, any format of the registry).

    problems = load("taco_train.jsonl.gz")                       # format detected
    problems = load("code_contests/train-*.parquet", max_problems=1000, difficulty="1-3")
    problems = load("lcb.jsonl", "livecodebench", grade_tests="private", visible_tests=2, max_tests=50)

Rows are read as a stream and converted one at a time, so `max_problems` bounds both the time and the memory
of a read of any size (the problems kept are the first N that pass the difficulty filter, in file order).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from grpo_jax.data import registry
from grpo_jax.data.common import Ctx, DatasetError, Unsupported
from grpo_jax.data.containers import open_source
from grpo_jax.problem import GRADE_TESTS, Problem


def detect_format(row: dict) -> str | None:
    """The name of the first format (registry order) whose identifying fields the row has, or None."""
    fmt = registry.detect(row.keys())
    return fmt.name if fmt else None


def _unknown(where: str, fields) -> DatasetError:
    seen = ", ".join(sorted(map(str, fields))[:40]) or "none"
    return DatasetError(
        where,
        "fields",
        f"an unknown schema (fields seen: {seen}); neither "
        + " nor ".join(f.title for f in registry.FORMATS.values()),
        f"one of those sets of fields, or name the format: --data_format / fmt= one of "
        f"{', '.join(registry.names())}",
    )


def difficulty_filter(spec: str | None, fmt: registry.Format):
    """A predicate on rows from --difficulty: comma-separated values, each a label compared without case
    ("easy", "EASY", "introductory") or an inclusive integer range "A-B" (ratings); None / "": every row."""
    if not spec:
        return None
    difficulty = fmt.difficulty
    if difficulty is None:
        raise ValueError(
            f"--difficulty={spec!r}: the {fmt.name} format has no difficulty field; valid: leave it empty"
        )
    labels, ranges = set(), []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        lo, sep, hi = part.partition("-")
        if sep and lo.strip().lstrip("-").isdigit() and hi.strip().isdigit():
            ranges.append((int(lo), int(hi)))
        else:
            labels.add(part.lower())

    def keep(row: dict) -> bool:
        v = difficulty(row)
        if v is None:
            return False
        if isinstance(v, (int, float)) and not isinstance(v, bool) and any(a <= v <= b for a, b in ranges):
            return True
        return str(v).lower() in labels

    return keep


def load(
    path: str | Path,
    fmt: str | None = None,
    *,
    grade_tests: str = "all",
    visible_tests: int | None = 0,
    max_tests: int | None = None,
    errors: list | None = None,
    max_problems: int | None = None,
    difficulty: str | None = None,
    skipped: Counter | None = None,
) -> list[Problem]:
    """The problems of a dataset input, in file order.

    fmt: a registry name or alias; None: detected (columnar files from their schema, JSON from the first row).
    grade_tests: "all" (public + hidden tests grade) or "private" (hidden only). visible_tests: public
    examples shown in the prompt (0 none, N the first N, None all). max_tests: keep the first N hidden tests.
    errors: None raises the first malformed row's DatasetError; a list collects one per malformed row and
    skips the row. max_problems: stop after this many problems. difficulty: see `difficulty_filter`.
    skipped: a Counter that receives, per reason, the rows left out as `Unsupported` (interactive problems,
    checkers that do not compile); they are always left out, never an error. Task ids must be unique (every
    format but HumanEval / MBPP)."""
    if grade_tests not in GRADE_TESTS:
        raise ValueError(f"grade_tests={grade_tests!r}; valid: {', '.join(GRADE_TESTS)}")
    if visible_tests is not None and (isinstance(visible_tests, bool) or visible_tests < 0):
        raise ValueError(f"visible_tests={visible_tests!r}; valid: an integer >= 0 or None (all)")
    if max_tests is not None and (isinstance(max_tests, bool) or max_tests < 1):
        raise ValueError(f"max_tests={max_tests!r}; valid: an integer >= 1 or None (all)")
    if max_problems is not None and (isinstance(max_problems, bool) or max_problems < 1):
        raise ValueError(f"max_problems={max_problems!r}; valid: an integer >= 1 or None (all)")
    chosen = None
    if fmt is not None:
        try:
            chosen = registry.get(fmt)
        except ValueError:
            raise ValueError(
                f"fmt={fmt!r}; valid: {', '.join(registry.names())}, or None to detect"
            ) from None
    src = open_source(path)
    if chosen is None and src.fields is not None:
        chosen = registry.detect(src.fields)
        if chosen is None:
            raise _unknown(str(path), src.fields)
    skipped = Counter() if skipped is None else skipped
    out: list[Problem] = []
    seen: dict[str, str] = {}
    convert = keep = None
    n_left = 0
    detected = fmt is None
    if chosen is not None:
        convert, keep = _converter(chosen, detected), difficulty_filter(difficulty, chosen)
    for where, index, row in src.rows(columns=chosen.columns if chosen else None):
        try:
            if isinstance(row, DatasetError):
                raise row
            if chosen is None:  # JSON: the first row decides
                chosen = registry.detect(row.keys())
                if chosen is None:
                    raise _unknown(where, row.keys())
                convert, keep = _converter(chosen, detected), difficulty_filter(difficulty, chosen)
            if keep is not None and not keep(row):
                continue
            ctx = Ctx(where, index, grade_tests, visible_tests, max_tests)
            assert convert is not None  # set together with `chosen`
            prob = convert(row, ctx)
            if chosen.unique_ids:
                if prob.task_id in seen:
                    raise DatasetError(
                        where, "task_id", f"{prob.task_id!r} already at {seen[prob.task_id]}", "unique ids"
                    )
                seen[prob.task_id] = where
        except Unsupported as e:
            skipped[f"{e.field}: {e.what}"] += 1
            n_left += 1
            continue
        except DatasetError as e:
            if errors is None:
                raise
            errors.append(e)
            continue
        out.append(prob)
        if max_problems is not None and len(out) >= max_problems:
            break
    if not out and not errors:
        why = f" (all {n_left} rows left out: {dict(skipped)})" if n_left else ""
        raise ValueError(f"{path}: no problems{why}")
    return out


def _converter(fmt: registry.Format, detected: bool):
    if detected and fmt.name in ("humaneval", "mbpp"):  # a detected HumanEval / MBPP file may mix the two
        from grpo_jax.data.formats import mbpp

        return mbpp.either
    return fmt.convert
