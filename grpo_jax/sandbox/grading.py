"""Parent-side grading: the child's bytes become plain data here and the parent decides.

* `grpo_jax.sandbox.asserts` splits asserts into `TestCase`s (only CALL goes to the child; the expected side
  stays in the parent); `check_value` applies a test's wrappers and comparison to the child's plain value.
* `parse_records` reads the child's line-delimited, type-tagged JSON with size and depth caps; it never
  unpickles or evals child bytes and never calls methods on child-made objects (there are none: only builtin
  containers and scalars are constructed here).
* `strict_equal` compares type-strictly: bool is not int, tuple is not list; the only widening is that an int
  and a float with the same value are equal (as Python's ``==`` says; bool never takes part) — see
  `NUMERIC_WIDENING`.
* `grade` turns a zygote response plus the records into a `Verdict` with the documented status precedence.
* stdin/stdout tests (`TestCase(kind="stdout")`): `stdout_matches` compares a program's standard output with
  the expected text, `grade_stdout_test` decides one test from the zygote's report (`stdout_run_failure`:
  how the run ended, then the comparison), `stdio_verdict` the job. A checker-judged test's output goes
  through `drop_blank_lines` / `checker_correct_output` to the checker, whose run `grade_checker` judges.
"""

from __future__ import annotations

import json
import math
import re
import reprlib
import signal
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

from grpo_jax.sandbox.types import Status, TestCase, TestResult, Verdict

MAX_DEPTH = 100
MAX_RECORDS = 100_000
NUMERIC_WIDENING = True  # int 3 == float 3.0 (Python semantics of the original asserts); bool never widens


class BadResult(ValueError):
    """The child's result bytes are malformed, too deep, or use an unknown tag."""


# ------------------------------------------------------------------------------------------------------------
# Tagged values
# ------------------------------------------------------------------------------------------------------------
def tag(v: Any, depth: int = 0) -> Any:
    """Parent-side mirror of the child's tagging (used for cache keys)."""
    if depth > MAX_DEPTH:
        raise BadResult("too deep")
    t = type(v)
    if v is None or t is bool or t is str:
        return v
    if t is int:
        return {"i": hex(v)} if abs(v) > (1 << 53) else {"i": v}
    if t is float:
        return {"f": repr(v)}
    if t in (list, tuple, set, frozenset):
        keys: dict[type, str] = {list: "l", tuple: "t", set: "s", frozenset: "fs"}
        key = keys[t]
        items = [tag(x, depth + 1) for x in v]
        if t in (set, frozenset):
            items.sort(key=lambda x: json.dumps(x, sort_keys=True))
        return {key: items}
    if t is dict:
        return {"d": [[tag(k, depth + 1), tag(x, depth + 1)] for k, x in v.items()]}
    if t is bytes:
        return {"b": v.hex()}
    if t is complex:
        return {"c": [repr(v.real), repr(v.imag)]}
    raise BadResult(f"unsupported type {t.__name__}")


def untag(x: Any, depth: int = 0) -> Any:
    """Tagged JSON (already json-parsed) -> plain builtin value. Raises BadResult on anything unexpected."""
    if depth > MAX_DEPTH:
        raise BadResult("result nested too deeply")
    if x is None or type(x) in (bool, str):
        return x
    if type(x) is not dict or len(x) != 1:
        raise BadResult("malformed tagged value")
    ((k, v),) = x.items()
    if k == "i":
        if type(v) is int:
            return v
        if type(v) is str and len(v) <= 1_000_000:
            return int(v, 16)
        raise BadResult("bad int")
    if k == "f":
        if type(v) is not str or len(v) > 64:
            raise BadResult("bad float")
        try:
            return float(v)
        except ValueError:
            raise BadResult("bad float") from None
    if k == "c":
        if type(v) is not list or len(v) != 2 or not all(type(p) is str and len(p) <= 64 for p in v):
            raise BadResult("bad complex")
        return complex(float(v[0]), float(v[1]))
    if k == "b":
        if type(v) is not str:
            raise BadResult("bad bytes")
        return bytes.fromhex(v)
    if type(v) is not list:
        raise BadResult("bad container")
    if k == "l":
        return [untag(e, depth + 1) for e in v]
    if k == "t":
        return tuple(untag(e, depth + 1) for e in v)
    if k in ("s", "fs"):
        items = [untag(e, depth + 1) for e in v]
        try:
            return set(items) if k == "s" else frozenset(items)
        except TypeError:
            raise BadResult("unhashable set element") from None
    if k == "d":
        out = {}
        for pair in v:
            if type(pair) is not list or len(pair) != 2:
                raise BadResult("bad dict item")
            key = untag(pair[0], depth + 1)
            try:
                out[key] = untag(pair[1], depth + 1)
            except TypeError:
                raise BadResult("unhashable dict key") from None
        return out
    raise BadResult("unknown tag")


def strict_equal(got: Any, exp: Any, tol: float = 0.0, depth: int = 0) -> bool:
    """Type-strict equality of two plain values (both built by the parent)."""
    if depth > MAX_DEPTH + 2:
        return False
    tg, te = type(got), type(exp)
    if tg is not te:
        if NUMERIC_WIDENING and {tg, te} == {int, float}:
            return _num_eq(float(got) if tg is int else got, float(exp) if te is int else exp, tol)
        return False
    if te is float:
        return _num_eq(got, exp, tol)
    if te is complex:
        return _num_eq(got.real, exp.real, tol) and _num_eq(got.imag, exp.imag, tol)
    if te in (list, tuple):
        if len(got) != len(exp):
            return False
        return all(strict_equal(g, e, tol, depth + 1) for g, e in zip(got, exp, strict=True))
    if te is dict:
        if len(got) != len(exp):
            return False
        gkeys = {_hkey(k): k for k in got}
        for k, ev in exp.items():
            gk = gkeys.get(_hkey(k))
            if gk is None and _hkey(k) not in gkeys:
                return False
            if not strict_equal(gk, k, 0.0, depth + 1) or not strict_equal(got[gk], ev, tol, depth + 1):
                return False
        return True
    if te in (set, frozenset):
        if len(got) != len(exp):
            return False
        gitems = {_hkey(x): x for x in got}
        return all(_hkey(e) in gitems and strict_equal(gitems[_hkey(e)], e, 0.0, depth + 1) for e in exp)
    return got == exp  # None, bool, int, str, bytes


def _hkey(x: Any) -> Any:
    """A hash key that keeps bool apart from int (True and 1 hash alike)."""
    return (type(x) is bool, x)


def _num_eq(a: float, b: float, tol: float) -> bool:
    try:
        if a == b:
            return True
        if tol > 0 and math.isfinite(a) and math.isfinite(b):
            return abs(a - b) <= tol
    except OverflowError:
        return False
    return False


# ------------------------------------------------------------------------------------------------------------
# One parent-graded test: wrappers and the comparison, on plain data only
# ------------------------------------------------------------------------------------------------------------
# the plain-data functions a test may wrap around its CALL (`set(f(x)) == ...`): name -> (function, how many
# literal arguments may follow the value). The one list: `asserts` splits exactly these.
WRAPPERS: dict[str, tuple[Any, int]] = {
    "set": (set, 0),
    "frozenset": (frozenset, 0),
    "sorted": (sorted, 0),  # reverse=<literal bool> is its one keyword
    "list": (list, 0),
    "tuple": (tuple, 0),
    "len": (len, 0),
    "abs": (abs, 0),
    "round": (round, 1),
    "sum": (sum, 0),
    "min": (min, 0),
    "max": (max, 0),
    "str": (str, 0),
    "int": (int, 0),
    "float": (float, 0),
    "bool": (bool, 0),
}


def _apply_wrap(name: str, args: tuple, v: Any) -> Any:
    if type(v) is bool and name in ("abs", "round", "sum"):
        raise TypeError(f"{name}() of a bool")
    if name == "sorted":
        return sorted(v, reverse=bool(args[0]) if args else False)
    if name == "round":
        if type(v) not in (int, float):
            raise TypeError("round() of a non-number")
        return round(v, *args)
    if name in ("str", "int", "float") and type(v) not in (int, float, str, bool):
        # str(list) would format in the parent: not what a test means
        raise TypeError(f"{name}() of a container")
    if name == "int" and type(v) is str and len(v) > 4300:
        raise ValueError("int() of a huge string")
    return WRAPPERS[name][0](v)


def json_lists(v: Any, depth: int = 0) -> Any:
    """Plain data as JSON sees it for json_eq: tuples become lists, recursively (list items, dict values; dict
    keys and set items stay as they are: they must be hashable). Built-in containers only (parent data)."""
    if depth > MAX_DEPTH + 2:
        raise RecursionError("nested too deeply")
    t = type(v)
    if t is list or t is tuple:
        return [json_lists(x, depth + 1) for x in v]
    if t is dict:
        return {k: json_lists(x, depth + 1) for k, x in v.items()}
    return v


def _real(x: Any) -> bool:
    return type(x) in (int, float)  # bool is not a number here


def check_value(tc: TestCase, got: Any) -> bool:
    """Does the child's plain value `got` pass `tc`? Raises nothing for plain data: a value the wrappers or
    the comparison cannot take (sorted of mixed types, set of lists) fails the test."""
    try:
        for name, args in tc.wrap:
            got = _apply_wrap(name, args, got)
        exp = tc.expected
        k = tc.kind
        if k == "invalid":  # the expected side could not be computed (executor oracle)
            return False
        if k == "eq":
            return strict_equal(got, exp, tc.float_tol)
        if k == "json_eq":
            # LiveCodeBench lcb_runner/evaluation/testing_util.py grade_call_based: "don't penalize model if
            # it produces tuples instead of lists" (tuple -> list, then `prediction == gt_out`); here
            # recursively and type-strictly (JSON tells true from 1), exact unless the test sets float_tol
            return strict_equal(json_lists(got), json_lists(exp), tc.float_tol)
        if k == "ne":
            return not strict_equal(got, exp, tc.float_tol)
        if k == "truthy":
            return bool(got)
        if k == "falsy":
            return not bool(got)
        if k in ("lt", "le", "gt", "ge"):
            if not (
                (_real(got) and _real(exp)) or (type(got) is type(exp) and type(got) in (str, tuple, list))
            ):
                return False
            return {"lt": got < exp, "le": got <= exp, "gt": got > exp, "ge": got >= exp}[k]
        if k in ("in", "not_in", "contains", "not_contains"):
            hay, needle = (exp, got) if k in ("in", "not_in") else (got, exp)
            if type(hay) is str:
                found = type(needle) is str and needle in hay
            elif type(hay) in (list, tuple, set, frozenset):
                found = any(strict_equal(needle, e, tc.float_tol) for e in hay)
            elif type(hay) is dict:
                found = any(strict_equal(needle, e) for e in hay)
            else:
                return False
            return found if k in ("in", "contains") else not found
        if k in ("abs_lt", "abs_le"):
            x, tol = exp
            if not (_real(got) and _real(x) and _real(tol)):
                return False
            d = abs(got - x)
            return d < tol if k == "abs_lt" else d <= tol
        if k == "isclose":
            x, rel, abs_tol = exp
            if not (_real(got) and _real(x) and _real(rel) and _real(abs_tol)):
                return False
            return math.isclose(got, x, rel_tol=rel, abs_tol=abs_tol)
    except (TypeError, ValueError, OverflowError, RecursionError, MemoryError, ZeroDivisionError):
        return False
    return False


# ------------------------------------------------------------------------------------------------------------
# Records -> Verdict
# ------------------------------------------------------------------------------------------------------------
def parse_records(raw: bytes, max_bytes: int) -> tuple[list[dict], str]:
    """Split the child's result bytes into records. Returns (records, problem) — problem is "" when clean."""
    problem = ""
    if len(raw) > max_bytes:
        raw = raw[:max_bytes]
        problem = "result too large"
    records: list[dict] = []
    for line in raw.split(b"\n"):
        if not line:
            continue
        if len(records) >= MAX_RECORDS:
            problem = problem or "too many records"
            break
        try:
            rec = json.loads(line.decode("utf-8", "surrogatepass"))
        except (ValueError, RecursionError, UnicodeDecodeError, MemoryError):
            problem = problem or "malformed result record"
            continue
        if type(rec) is not dict or type(rec.get("k")) is not str:
            problem = problem or "malformed result record"
            continue
        records.append(rec)
    return records, problem


def _text(x: Any, n: int = 200) -> str:
    """Sanitise a child-provided string for a report (never executed or repr'd as an object)."""
    if type(x) is not str:
        return ""
    x = x[:n]
    return "".join(c if c.isprintable() else "?" for c in x)


GOT_CHARS = 400  # the most characters of a wrong answer's actual result kept in TestResult.got
_REPR = reprlib.Repr()  # (Python 3.11's Repr takes no keyword arguments)
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxset, _REPR.maxdict = 4, 12, 12, 12, 8
_REPR.maxstring, _REPR.maxlong, _REPR.maxother = 120, 60, 60


def _short_repr(v: Any) -> str:
    """A bounded repr of a child's plain value (builtin data only, after `untag`): long containers and
    strings elided with '...', so a huge result costs no more than a short one."""
    return _REPR.repr(v)


def _as_text(b: bytes) -> str:
    return b[: GOT_CHARS * 4].decode("utf-8", "replace")


def _shown(x: str, n: int) -> str:
    """`_text` that keeps line breaks and tabs (a program's output is shown line by line)."""
    return "".join(c if c.isprintable() or c in "\n\t" else "?" for c in x[:n])


_MEMORY_EXC = {"MemoryError"}


def grade(
    tests: Sequence[TestCase],
    has_check: bool,
    info: dict,
    raw: bytes,
    output: bytes,
    result_cap: int,
    stop_on_failure: bool = False,
) -> Verdict:
    """Decide the verdict from the zygote's report (`info`), the child's records and its output excerpt.

    `stop_on_failure` (Job.stop_on_failure): the tests end with the first one that did not pass and the
    verdict's status is that test's (a compile error, an error at import or a sandbox failure still come
    first); a child check is then not consulted."""
    secs = float(info.get("secs") or 0.0)
    out_excerpt = output[-600:].decode("utf-8", "replace")
    out_excerpt = "".join(c if (c.isprintable() or c in "\n\t") else "?" for c in out_excerpt)
    n = len(tests)
    if info.get("infra"):
        return Verdict(Status.INFRA_ERROR, False, (), None, secs, _text(info["infra"], 400))
    records, problem = parse_records(raw, result_cap)
    if info.get("result_limit"):
        problem = "result too large"
    setup_err = next((r for r in records if r["k"] == "setup_err"), None)
    if setup_err is not None:
        return Verdict(
            Status.INFRA_ERROR, False, (), None, secs, "sandbox setup: " + _text(setup_err.get("msg"))
        )
    syntax = next((r for r in records if r["k"] == "syntax"), None)
    prog_err = next((r for r in records if r["k"] == "prog_err"), None)
    started = any(r["k"] == "start" for r in records)
    done = any(r["k"] == "done" for r in records)
    sig = info.get("signal")
    timed_out = bool(info.get("timed_out")) or sig in (signal.SIGXCPU,)

    # per-test results (first record per index wins; duplicates are a forgery sign and fail that test)
    by_index: dict[int, dict] = {}
    dup: set[int] = set()
    for rec in records:
        if rec["k"] == "t" and type(rec.get("i")) is int and 0 <= rec["i"] < n:
            if rec["i"] in by_index:
                dup.add(rec["i"])
            else:
                by_index[rec["i"]] = rec
    results: list[TestResult] = []
    any_exc = False
    any_mem = False
    for i, tc in enumerate(tests):
        r = by_index.get(i)
        if r is None:
            break
        s_raw: Any = r.get("s")  # the child's JSON: anything
        s = float(s_raw) if type(s_raw) in (int, float) and math.isfinite(s_raw) else 0.0
        if i in dup:
            results.append(TestResult(False, Status.RUNTIME_ERROR, s, "duplicate result records"))
            any_exc = True
        elif "exc" in r:
            et = _text(r.get("exc"), 60)
            status = Status.MEMORY if et in _MEMORY_EXC else Status.RUNTIME_ERROR
            any_mem |= status is Status.MEMORY
            any_exc = True
            results.append(TestResult(False, status, s, f"{et}: {_text(r.get('msg'))}"))
        elif "v" in r:
            try:
                got = untag(r["v"])
                ok = check_value(tc, got)
                why = "" if ok or tc.kind != "invalid" else f"expected value unavailable: {tc.expected}"
                shown = "" if ok else _shown(_short_repr(got), GOT_CHARS)
                results.append(TestResult(ok, Status.PASSED if ok else Status.WRONG_ANSWER, s, why, shown))
            except (BadResult, RecursionError, ValueError, OverflowError, MemoryError) as e:
                results.append(TestResult(False, Status.WRONG_ANSWER, s, f"unusable result: {_text(str(e))}"))
        else:
            results.append(TestResult(False, Status.WRONG_ANSWER, s, _text(r.get("bad")) or "bad result"))
    # tests without a record
    if len(results) < n:
        if timed_out:
            fill = TestResult(False, Status.TIMEOUT, 0.0, "not run: time limit")
        elif info.get("output_limit") or problem == "result too large":
            fill = TestResult(False, Status.OUTPUT_LIMIT, 0.0, "not run: output limit")
        else:
            fill = TestResult(False, Status.RUNTIME_ERROR, 0.0, "no result (the process ended early)")
        if started or timed_out or not (syntax or prog_err):
            any_exc |= fill.status is Status.RUNTIME_ERROR
            results += [fill] * (n - len(results))
    check_passed: bool | None = None
    check_detail = ""
    if has_check:
        chk = next((r for r in records if r["k"] == "check"), None)
        check_passed = bool(chk is not None and chk.get("ok") is True and done)
        if chk is not None and chk.get("ok") is not True:
            et = _text(chk.get("exc"), 60)
            check_detail = f"check failed: {et}: {_text(chk.get('msg'))}"
            if et in _MEMORY_EXC:
                any_mem = True
            elif et != "AssertionError":
                any_exc = True
        elif chk is None:
            check_detail = "check did not complete"

    detail = ""
    if syntax is not None:
        status = Status.SYNTAX_ERROR
        detail = f"{_text(syntax.get('exc'), 60)}: {_text(syntax.get('msg'))}"
    elif timed_out:
        status = Status.TIMEOUT
        detail = "wall time limit" if info.get("timed_out") else "cpu time limit"
    elif any_mem or (prog_err is not None and prog_err.get("exc") in _MEMORY_EXC):
        status = Status.MEMORY
        detail = "memory limit"
    elif info.get("output_limit") or problem == "result too large":
        status = Status.OUTPUT_LIMIT
        detail = "output limit" if info.get("output_limit") else "result too large"
    elif prog_err is not None:
        status = Status.RUNTIME_ERROR
        detail = f"{_text(prog_err.get('exc'), 60)}: {_text(prog_err.get('msg'))}"
    elif any_exc or not started or (has_check and not check_passed and check_detail.startswith("check did")):
        status = Status.RUNTIME_ERROR
        if not started:
            detail = "the program ended before the tests ran"
        elif check_detail:
            detail = check_detail
        else:
            detail = next((t.error for t in results if t.status is Status.RUNTIME_ERROR), "runtime error")
        if sig and sig not in (signal.SIGKILL,):
            detail += f" (signal {sig})"
    elif any(not t.passed for t in results) or len(results) < n or (has_check and not check_passed):
        status = Status.WRONG_ANSWER
        detail = check_detail or "wrong answer"
    else:
        status = Status.PASSED
    if problem and status is Status.PASSED:
        status, detail = Status.RUNTIME_ERROR, problem
    first_fail = next((i for i, t in enumerate(results) if not t.passed), None)
    if stop_on_failure and first_fail is not None and syntax is None and prog_err is None:
        results = results[: first_fail + 1]
        status = results[-1].status
        detail = f"test {first_fail}: {results[-1].error or status.value}"
    passed = status is Status.PASSED
    if out_excerpt and not passed:
        detail = (detail + " | output: " + out_excerpt[-300:]).strip()
    return Verdict(status, passed, tuple(results), check_passed, secs, detail[:1000])


# ------------------------------------------------------------------------------------------------------------
# stdin/stdout tests: the program's standard output against the expected text, in the parent
# ------------------------------------------------------------------------------------------------------------
# Tokens that are numbers: an optional sign, digits with an optional fraction, an optional exponent. "nan",
# "inf", "0x10", "1_000" are not numbers here (they compare as strings).
_NUMBER = re.compile(rb"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
# Default float tolerance of stdout tests: absolute or relative error <= 1e-6, the most common statement of
# Codeforces-style problems and testlib's rcmp6 checker (testlib.h doubleCompare(expected, result, 1E-6)).
# APPS / TACO testing_util.py accept np.allclose (rtol 1e-5, atol 1e-8) per output line; LiveCodeBench's
# grade_stdio accepts only Decimal-equal tokens. A TestCase's float_tol > 0 replaces it.
STDOUT_FLOAT_TOL = 1e-6
_MAX_NUMBER_TOKEN = 4000  # longer tokens compare as strings only


def _as_bytes(x: str | bytes) -> bytes:
    return x if type(x) is bytes else str(x).encode("utf-8", "surrogateescape")


def _norm_lines(b: bytes) -> list[bytes]:
    lines = [ln.rstrip() for ln in b.replace(b"\r\n", b"\n").split(b"\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _token_equal(got: bytes, exp: bytes, tol: float) -> bool:
    """Two unequal tokens: equal as numbers? Decimal equality first (LiveCodeBench's grade_stdio compares
    "element-wise ... use `decimal` library", so 5 == 5.0 == +5); if either token is not an integer literal,
    then |got - exp| <= tol * max(1, |exp|) (testlib doubleCompare: absolute or relative error). Two
    integer literals must be equal exactly (LiveCodeBench: "otherwise gotcha: np.isclose(50000000000000000,
    50000000000000001) = True")."""
    if len(got) > _MAX_NUMBER_TOKEN or len(exp) > _MAX_NUMBER_TOKEN:
        return False
    if _NUMBER.fullmatch(got) is None or _NUMBER.fullmatch(exp) is None:
        return False
    try:
        if Decimal(got.decode("ascii")) == Decimal(exp.decode("ascii")):
            return True
    except (InvalidOperation, ValueError):
        return False
    if not any(c in tok for tok in (got, exp) for c in b".eE"):
        return False
    try:
        g, e = float(got), float(exp)
    except (ValueError, OverflowError):
        return False
    if not (math.isfinite(g) and math.isfinite(e)):
        return False
    return abs(g - e) <= tol * max(1.0, abs(e)) + 1e-15


def stdout_matches(got: str | bytes, expected: str | bytes, float_tol: float = 0.0) -> tuple[bool, str]:
    """(passed, why not) for a program's standard output against a stdout test's expected text.

    1. Exact after normalising both sides (the community harnesses strip before comparing: LiveCodeBench's
       get_stripped_lines, APPS / TACO's stripped_string_compare): "\\r\\n" is "\\n", trailing whitespace
       of each line and trailing blank lines are ignored.
    2. Else token by token (whitespace-separated, line breaks included: testlib's wcmp): as many tokens, each
       pair equal as bytes, or both numbers equal by value (`_token_equal`: Decimal equality, and a float
       tolerance where one is not an integer: `float_tol` if > 0, else STDOUT_FLOAT_TOL = 1e-6 absolute or
       relative). Case matters ("YES" is not "Yes"), as in every one of those harnesses.
    """
    g, e = _as_bytes(got), _as_bytes(expected)
    if g == e:
        return True, ""
    gl, el = _norm_lines(g), _norm_lines(e)
    if gl == el:
        return True, ""
    gt, et = g.split(), e.split()
    if gt == et:
        return True, ""
    if len(gt) != len(et):
        return False, f"{len(gt)} output tokens, expected {len(et)}"
    tol = float_tol if float_tol > 0 else STDOUT_FLOAT_TOL
    for k, (a, b) in enumerate(zip(gt, et, strict=True)):
        if a != b and not _token_equal(a, b, tol):
            shown = _text(a.decode("utf-8", "replace"), 40)
            return (
                False,
                f"token {k + 1}: got {shown!r}, expected {_text(b.decode('utf-8', 'replace'), 40)!r}",
            )
    return True, ""


def grade_stdout_test(
    tc: TestCase, info: dict, raw: bytes, stdout: bytes, output: bytes, result_cap: int
) -> TestResult:
    """One stdin/stdout test from the zygote's report: the exit status and signal (the zygote's, never the
    program's word), the harness's records (syntax, start, the uncaught exception's type), the captured
    standard output (`stdout`; a file-I/O test's output file instead) and the stderr excerpt (`output`).
    Status precedence: sandbox failure (INFRA_ERROR), compile error (SYNTAX_ERROR), wall or CPU limit
    (TIMEOUT), MemoryError (MEMORY), output or result cap (OUTPUT_LIMIT), a signal, a non-zero exit status or
    no start (RUNTIME_ERROR), no output file (WRONG_ANSWER); else the output decides (PASSED / WRONG_ANSWER).
    Records can only make a failure more specific: a pass needs exit status 0 from the zygote and the right
    output. A checker-judged test is decided by the executor instead (`stdout_run_failure`, then the
    checker's run, `grade_checker`)."""
    failed = stdout_run_failure(tc, info, raw, output, result_cap)
    if failed is not None:
        return failed
    secs = float(info.get("secs") or 0.0)
    ok, diff = stdout_matches(stdout, tc.expected, tc.float_tol)
    if ok:
        return TestResult(True, Status.PASSED, secs, "")
    return TestResult(False, Status.WRONG_ANSWER, secs, diff, _shown(_as_text(stdout), GOT_CHARS))


def stdout_run_failure(
    tc: TestCase, info: dict, raw: bytes, output: bytes, result_cap: int
) -> TestResult | None:
    """How a stdin/stdout test's run ended, before its output is judged (`grade_stdout_test`'s precedence up
    to the output): the failing TestResult, or None when the program ended normally (exit status 0) and its
    answer (stdout, or the test's output file) is there to be judged. A checker runs only after None: its
    cost is proportional to the runs that ended normally, and a crash stays the candidate's own status."""
    secs = float(info.get("secs") or 0.0)
    if info.get("infra"):
        return TestResult(False, Status.INFRA_ERROR, secs, _text(info["infra"], 400))
    records, problem = parse_records(raw, result_cap)
    kinds = {r["k"]: r for r in reversed(records)}  # the first record of each kind
    if "setup_err" in kinds:
        return TestResult(
            False, Status.INFRA_ERROR, secs, "sandbox setup: " + _text(kinds["setup_err"].get("msg"))
        )
    if "syntax" in kinds:
        r = kinds["syntax"]
        return TestResult(
            False, Status.SYNTAX_ERROR, secs, f"{_text(r.get('exc'), 60)}: {_text(r.get('msg'))}"
        )
    sig = info.get("signal")
    exc = kinds.get("exc")
    why = f"{_text(exc.get('exc'), 60)}: {_text(exc.get('msg'))}" if exc is not None else ""
    lines = output[-600:].decode("utf-8", "replace").strip().splitlines()[-3:]  # the end of stderr
    err = " / ".join(_text(ln.strip(), 120) for ln in lines if ln.strip())
    if info.get("timed_out") or sig == signal.SIGXCPU:
        return TestResult(
            False, Status.TIMEOUT, secs, "wall time limit" if info.get("timed_out") else "cpu time limit"
        )
    if exc is not None and exc.get("exc") in _MEMORY_EXC:
        return TestResult(False, Status.MEMORY, secs, "memory limit: " + why)
    if info.get("output_limit") or info.get("result_limit") or problem == "result too large":
        return TestResult(False, Status.OUTPUT_LIMIT, secs, "output limit")
    if "start" not in kinds:
        return TestResult(False, Status.RUNTIME_ERROR, secs, "the program did not start")
    if sig:
        return TestResult(
            False,
            Status.RUNTIME_ERROR,
            secs,
            (why or f"killed by signal {sig}") + (f" | stderr: {err}" if err else ""),
        )
    code = info.get("exit")
    if code != 0:
        return TestResult(
            False,
            Status.RUNTIME_ERROR,
            secs,
            (why or f"exit status {code}") + (f" | stderr: {err}" if err else ""),
        )
    if tc.output_file and info.get("output_file") != "ok":
        state = _text(info.get("output_file"), 80) or "not reported"
        return TestResult(
            False,
            Status.WRONG_ANSWER,
            secs,
            f"no output file {tc.output_file!r} ({state}): this test judges the file the program writes, "
            "not its standard output",
        )
    return None


# ------------------------------------------------------------------------------------------------------------
# checker-judged stdin/stdout tests (TestCase.checker): open-r1's codeforces runner (guipenedo/piston
# packages/codeforces/1.0.0/run) prepares both outputs, runs `python3 checker.py <input> correct_output.txt
# <solution output>` with a 10 s limit and accepts iff the checker's stdout, all whitespace removed, is "1" or
# "100". The executor runs the checker as its own sandboxed program (executor.CHECKER_RUNNER).
# ------------------------------------------------------------------------------------------------------------
CHECKER_WALL_S = 10.0  # the runner's `timeout 10 python3 checker.py ...`
CHECKER_ACCEPTS = (b"1", b"100")
_WHITESPACE = re.compile(rb"\s+")


def drop_blank_lines(b: bytes) -> bytes:
    """The runner's `sed -i '/^$/d'` on the solution's output: empty lines go (a line of spaces stays, as does
    a missing final newline)."""
    lines = b.split(b"\n")
    end = lines.pop()  # what follows the last newline ("" when the text ends with one)
    return b"".join(ln + b"\n" for ln in lines if ln) + end


def checker_correct_output(expected: str | bytes) -> bytes:
    """The correct output as the runner hands it to a checker: `$(cat correct_output.txt)` drops the trailing
    newlines, `echo` adds one, `sed 's/\\r$//'` drops a carriage return at each line end ("dumb \\r from
    codeforces"), `sed '/^$/d'` the empty lines."""
    b = _as_bytes(expected).rstrip(b"\n") + b"\n"
    b = b"\n".join(ln[:-1] if ln.endswith(b"\r") else ln for ln in b.split(b"\n"))
    return drop_blank_lines(b)


def grade_checker(
    tc: TestCase,
    secs: float,
    answer: bytes,
    info: dict,
    raw: bytes,
    stdout: bytes,
    output: bytes,
    result_cap: int,
    deadline_capped: bool = False,
) -> TestResult:
    """A checker-judged test from its checker's run (the zygote's report `info`, the runner's records, the
    checker's stdout and stderr excerpt), after the candidate's run ended normally (`secs`: the candidate's
    time, `answer`: what it wrote, shown on a wrong answer). PASSED iff the checker exited normally and
    printed "1" or "100" (whitespace ignored). A checker that says anything else, crashes, exceeds its time
    or output limit, or runs out of memory fails the test as WRONG_ANSWER with a detail that says so: a
    candidate's garbage output may crash a checker, and no such failure may count as a pass. A sandbox
    failure is INFRA_ERROR (nobody's answer); a checker stopped by the batch deadline (`deadline_capped`: its
    wall limit was cut short by it) is TIMEOUT, like a program the deadline stopped."""
    got = _shown(_as_text(answer), GOT_CHARS)

    def wrong(why: str) -> TestResult:
        return TestResult(False, Status.WRONG_ANSWER, secs, why[:600], got)

    if info.get("infra"):
        return TestResult(False, Status.INFRA_ERROR, secs, "checker: " + _text(info["infra"], 400))
    records, problem = parse_records(raw, result_cap)
    kinds = {r["k"]: r for r in reversed(records)}
    if "setup_err" in kinds:
        msg = _text(kinds["setup_err"].get("msg"))
        return TestResult(False, Status.INFRA_ERROR, secs, "checker: sandbox setup: " + msg)
    if "syntax" in kinds or "start" not in kinds:  # the runner itself did not start: the sandbox's fault
        return TestResult(False, Status.INFRA_ERROR, secs, "checker: its runner did not start")
    exc = kinds.get("exc")
    why = f"{_text(exc.get('exc'), 60)}: {_text(exc.get('msg'))}" if exc is not None else ""
    lines = output[-600:].decode("utf-8", "replace").strip().splitlines()[-2:]
    err = " / ".join(_text(ln.strip(), 120) for ln in lines if ln.strip())
    sig = info.get("signal")
    if info.get("timed_out") or sig == signal.SIGXCPU:
        if deadline_capped:
            return TestResult(False, Status.TIMEOUT, secs, "checker stopped: batch deadline reached", got)
        return wrong(f"checker failed: time limit ({CHECKER_WALL_S:g} s)")
    if info.get("output_limit") or info.get("result_limit") or problem == "result too large":
        return wrong("checker failed: output limit")
    if sig or info.get("exit") != 0:
        what = why or (f"killed by signal {sig}" if sig else f"exit status {info.get('exit')}")
        return wrong(f"checker failed: {what}" + (f" | stderr: {err}" if err else ""))
    verdict = _WHITESPACE.sub(b"", stdout)
    if verdict in CHECKER_ACCEPTS:
        return TestResult(True, Status.PASSED, secs, "")
    shown = _text(verdict[:40].decode("utf-8", "replace"), 40)
    return wrong(f"checker: not accepted (it printed {shown!r})")


# the job's status from its tests, worst first (the order of `grade`'s precedence)
_STDIO_ORDER = (
    Status.TIMEOUT,
    Status.MEMORY,
    Status.OUTPUT_LIMIT,
    Status.RUNTIME_ERROR,
    Status.WRONG_ANSWER,
)


def stdio_verdict(results: Sequence[TestResult], n_tests: int, secs: float, retried: bool = False) -> Verdict:
    """A stdin/stdout job's verdict from its tests' results (fewer than `n_tests` only after a stop):
    PASSED iff every test ran and passed; else the first of TIMEOUT, MEMORY, OUTPUT_LIMIT, RUNTIME_ERROR,
    WRONG_ANSWER that some test has, with the first such test in `detail`."""
    results = tuple(results)
    if len(results) == n_tests and all(t.passed for t in results):
        return Verdict(Status.PASSED, True, results, None, secs, "", retried=retried)
    present = {t.status for t in results}
    status = next((s for s in _STDIO_ORDER if s in present), Status.WRONG_ANSWER)
    i = next((i for i, t in enumerate(results) if t.status is status), None)
    detail = f"test {i}: {results[i].error or status.value}" if i is not None else "not every test ran"
    return Verdict(status, False, results, None, secs, detail[:1000], retried=retried)
