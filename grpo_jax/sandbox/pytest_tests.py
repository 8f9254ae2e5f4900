"""pytest test files (KodCode's `test_code`) as sandbox tests: parent-graded `TestCase`s + a child check.

KodCode (Xu et al., "KodCode: A Diverse, Challenging, and Verifiable Synthetic Dataset for Coding", 2025,
arXiv:2503.02951; dataset card: huggingface.co/datasets/KodCode/KodCode-V1) stores each problem's tests as
the source of a pytest file in the column `test_code`: the candidate program is importable as the module
`solution` (`from solution import f`, `from solution import *` or `import solution` + `solution.f(..)`), and
each `test_*` function (or `Test*` class method) is one test, optionally expanded by
`@pytest.mark.parametrize`. `split_pytest(test_code)` turns that source into this project's sandbox tests,
by AST only: nothing here imports or executes the test code.

Each collected test (named as pytest names it: `test_add[1-2-3]`, `TestStack::test_push`; in `names`;
`Test*` classes without `__init__` and `unittest.TestCase` subclasses included) is

* parent-graded when its body is only asserts that `asserts.split_assert` splits, after the parametrize
  values are substituted into the assert as expressions and the candidate's names are written as the
  program defines them (`solution.f` -> `f`, `from solution import f as g`: `g` -> `f`); an assert
  `CALL == pytest.approx(NUMBER, rel=.., abs=..)` becomes a "isclose" test (pytest's defaults rel 1e-6,
  abs 1e-12; only `abs` given: rel 0). `Cls(ARGS).method(ARGS)` with `Cls` a capitalised name of the
  candidate and candidate-free ARGS counts as one CALL (a LeetCode-style `Solution().f(..)`). Only the CALL
  runs in the sandboxed child; the expected side stays in the parent. A test with several asserts yields
  several TestCases, whose `source` is `"<test name>: <assert>"` (`case_test_name(source)` gives the
  name back). `setup_code` holds the test's import lines that these calls need (they run in the program's
  namespace);
* otherwise run child-side in `child_check`, by the sandbox's two-process checker (the checker calls the
  program's functions through RPC, on plain data; the program never shares a process with the test code).
  The child check is a prelude + the test module (minus `if __name__ == "__main__":` blocks and the
  parent-graded test functions) + a runner call that runs every child-side test, with parametrize,
  fixtures and setup / teardown as pytest would, and fails with the names of the tests that failed.

The prelude first moves every name the checker bound from the program out of the check's namespace into a
module `solution` in `sys.modules` (so the test's imports bind what pytest would, and a program defining
`len` or `sorted` cannot stand in for the builtins the test calls; `from solution import *` leaves out
builtin names other than `own_names`, the reference solution's names). The stand-ins then run in a
namespace of their own (names the test module binds never change the runner): a `pytest` module (there is
no pytest in the sandbox) with `raises` (context manager / call form, `match=`, `excinfo.value`, `.type`,
`.match`), `approx` (numbers, sequences, dicts), `mark.parametrize` / `skip` / `skipif` / `xfail` /
`usefixtures` (other marks are ignored), `param`, `fixture` (any scope, generator fixtures with teardown,
`autouse`), `skip`, `fail`; and the `tmp_path` fixture (a `str` that also answers `pathlib.Path`'s
methods: the program receives plain data). An exception raised in the program is re-raised in the checker
as the same builtin type with its message (`_zygote._remote_exception`), so `pytest.raises(ValueError)`
works; any other class (the program's own, a library's) arrives as `RuntimeError("Name: message")`, which
`raises(Name)` and `raises(Exception)` match by name. A limit of that protocol: a program's own subclass of
ValueError does not match `raises(ValueError)`. A program that exits (SystemExit is no Exception) or dies
in a call never matches `raises(Exception)`.

Refused with a ValueError naming the test and the construct (the loader reports / skips the row): fixtures
that cannot work across processes or are not defined (`capsys`, `monkeypatch`, `request`, ...),
parametrized or class-level fixtures, `indirect` parametrize, unsupported `pytest.*` names (`warns`,
`importorskip`, ...), other decorators, `async def` tests, and three child-side shapes that would fail for
every program because objects stay in the program's process: a bare candidate call whose argument is read
afterwards (an in-place change the checker cannot see), attributes of an instance of a (capitalised)
candidate class, and a function passed to the candidate. (Other such shapes, `r = f(a)` then reading `a`,
or attributes of an object a lower-case function returns, are not detected: they fail for every program,
the reference solution included, which the loader can check.)

Differences from pytest, by design: parent-graded calls run before the child-side tests (module-level state
of the program is shared in a different order); equality is type-strict in the parent (`grading`);
`approx` in the parent uses `math.isclose` (relative to the larger magnitude); a test whose parameter sets
are only known at run time (`parametrize("x", make_cases())`) has one name and runs child-side; ids of
values that are not literals are `<argname><index>`.
"""

from __future__ import annotations

import ast
import builtins
import copy
import dataclasses
import itertools
from typing import Any

from grpo_jax.sandbox.asserts import BUILTIN_NAMES, dotted_name, free_names, parse, split_assert
from grpo_jax.sandbox.types import TestCase

__all__ = ["PytestTests", "case_test_name", "split_pytest"]

SOURCE_SEP = ": "  # TestCase.source = f"{test name}{SOURCE_SEP}{assert text}"

_PYTEST_SUPPORTED = frozenset({"raises", "approx", "mark", "fixture", "skip", "fail", "param"})
_MARKS_DROP = frozenset({"skip", "xfail"})  # never graded (pytest: skipped / expected to fail)
_MARKS_CHILD = frozenset({"skipif", "usefixtures"})  # decided at run time, child-side
_FIXTURES_BUILTIN = frozenset({"tmp_path"})
_FIXTURES_REFUSED = {
    "capsys": "the program prints in its own process; the checker cannot capture it",
    "capfd": "the program prints in its own process; the checker cannot capture it",
    "capsysbinary": "the program prints in its own process; the checker cannot capture it",
    "capfdbinary": "the program prints in its own process; the checker cannot capture it",
    "caplog": "the program logs in its own process; the checker cannot capture it",
    "monkeypatch": "a patch in the checker does not reach the program's process",
    "mocker": "a patch in the checker does not reach the program's process",
    "recwarn": "warnings of the program's process do not reach the checker",
    "request": "pytest's request object is not provided",
    "tmpdir": "py.path tmpdir is not provided (tmp_path is)",
    "tmp_path_factory": "not provided (tmp_path is)",
    "tmpdir_factory": "not provided (tmp_path is)",
    "pytestconfig": "not provided",
}


@dataclasses.dataclass(frozen=True)
class PytestTests:
    tests: tuple[TestCase, ...]  # parent-graded, in the order of the file; source = "<test name>: <assert>"
    child_check: (
        str | None
    )  # the checker's code for the other tests, or None when every test is parent-graded
    names: tuple[str, ...]  # every collected test, pytest's names, in the order of the file
    setup_code: str  # import lines the parent-graded calls need (run in the program's namespace)


def case_test_name(source: str) -> str:
    """The test a parent-graded TestCase belongs to, from its `source` ("<test name>: assert ...")."""
    return source.partition(SOURCE_SEP + "assert ")[0]


# ------------------------------------------------------------------------------------------------------------
# The module: what its names are bound to
# ------------------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class _Module:
    sol_names: dict[str, str]  # local name -> the program's name (from solution import f as g)
    sol_modules: set[str]  # names bound to the module `solution`
    star: bool  # from solution import *
    pytest_names: dict[str, str]  # local name -> pytest attribute ("" for the module itself)
    prelude: list[tuple[str, frozenset[str]]]  # other import lines and the names each binds
    prelude_names: frozenset[str]
    module_names: set[str]  # names the test module binds itself (helpers, constants, tests, fixtures)
    defs: set[str]  # module-level functions and classes
    fixtures: dict[str, ast.FunctionDef]  # fixture name -> its function
    autouse: bool
    assigns: dict[str, ast.expr]  # module-level names assigned once -> value (parametrize lists)
    own: frozenset[str]
    other_star: bool = False  # from <another module> import *


@dataclasses.dataclass
class _Item:
    name: str
    path: tuple[str, ...]  # ("test_f",) or ("TestC", "test_m")
    kind: str  # "fn", "class", "unittest"
    fn: ast.FunctionDef
    cls: ast.ClassDef | None
    idx: tuple[int, ...] | None  # per parametrize mark, closest to the function first; None: all, at run time
    bindings: dict[str, ast.expr] | None  # argname -> value (None: not known before run time)
    child_marks: bool  # skipif / usefixtures: decided at run time


def _pytest_attr(node: ast.AST, mod: _Module) -> str | None:
    """`pytest.a.b` (through any alias, or `from pytest import a`) -> "a.b"; None when not pytest's."""
    d = dotted_name(node.func if isinstance(node, ast.Call) else node)
    if not d:
        return None
    head, _, rest = d.partition(".")
    if head not in mod.pytest_names:
        return None
    base = mod.pytest_names[head]
    return ".".join(p for p in (base, rest) if p)


def _is_main_guard(node: ast.stmt) -> bool:
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare) or len(node.test.ops) != 1:
        return False
    sides = {ast.unparse(node.test.left), ast.unparse(node.test.comparators[0])}
    return sides == {"__name__", "'__main__'"}


def _is_runner_call(node: ast.stmt, mod: _Module) -> bool:
    """A top-level `pytest.main(...)` / `unittest.main()` statement."""
    if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
        return False
    return _pytest_attr(node.value, mod) == "main" or dotted_name(node.value.func) == "unittest.main"


def _stored_names(node: ast.AST) -> set[str]:
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store | ast.Del):
            out.add(n.id)
        elif isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.add(n.name)
        elif isinstance(n, ast.Import | ast.ImportFrom):
            out |= {a.asname or a.name.split(".")[0] for a in n.names if a.name != "*"}
        elif isinstance(n, ast.arg):
            out.add(n.arg)
        elif isinstance(n, ast.ExceptHandler) and n.name:
            out.add(n.name)
    return out


def _read_module(tree: ast.Module, own: frozenset[str]) -> _Module:
    mod = _Module({}, set(), False, {}, [], frozenset(), set(), set(), {}, False, {}, own)
    counts: dict[str, int] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "solution" and not node.level:
            for a in node.names:
                if a.name == "*":
                    mod.star = True
                else:
                    mod.sol_names[a.asname or a.name] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module == "pytest" and not node.level:
            for a in node.names:
                if a.name == "*":
                    raise ValueError("module level: `from pytest import *` is not supported")
                mod.pytest_names[a.asname or a.name] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module == "__future__":
            continue
        elif isinstance(node, ast.Import):
            rest = []
            for a in node.names:
                if a.name == "solution":
                    mod.sol_modules.add(a.asname or a.name)
                elif a.name == "pytest":
                    mod.pytest_names[a.asname or a.name] = ""
                else:
                    rest.append(a)
            if rest:
                line = ast.unparse(ast.Import(names=rest))
                mod.prelude.append((line, frozenset(a.asname or a.name.split(".")[0] for a in rest)))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                raise ValueError(f"module level: `{ast.unparse(node)}` is not supported")
            if any(a.name == "*" for a in node.names):
                mod.other_star = True  # names not known here: only child-side tests use them
                continue
            mod.prelude.append((ast.unparse(node), frozenset(a.asname or a.name for a in node.names)))
        elif _is_main_guard(node):
            continue
        else:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                bound = {node.name}
                mod.defs.add(node.name)
            else:
                bound = _stored_names(node)
            mod.module_names |= bound
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
            ):
                mod.assigns[node.targets[0].id] = node.value
            for name in bound:
                counts[name] = counts.get(name, 0) + 1
    mod.assigns = {k: v for k, v in mod.assigns.items() if counts.get(k) == 1}
    mod.prelude_names = (
        frozenset().union(*(names for _, names in mod.prelude)) if mod.prelude else frozenset()
    )
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            fx = _fixture_decorator(node, mod)
            if fx is not None:
                kw = {k.arg: k.value for k in fx.keywords} if isinstance(fx, ast.Call) else {}
                if "params" in kw:
                    raise ValueError(
                        f"fixture {node.name}: parametrized fixtures (params=) are not supported"
                    )
                name = node.name
                if "name" in kw:
                    if not (isinstance(kw["name"], ast.Constant) and isinstance(kw["name"].value, str)):
                        raise ValueError(f"fixture {node.name}: name= must be a string")
                    name = kw["name"].value
                mod.fixtures[name] = node
                auto = kw.get("autouse")
                mod.autouse |= bool(isinstance(auto, ast.Constant) and auto.value)
                if auto is not None and not isinstance(auto, ast.Constant):
                    raise ValueError(f"fixture {node.name}: autouse= must be a constant")
    return mod


def _fixture_decorator(fn: ast.FunctionDef, mod: _Module) -> ast.expr | None:
    for d in fn.decorator_list:
        if _pytest_attr(d, mod) == "fixture":
            return d
    return None


# ------------------------------------------------------------------------------------------------------------
# Collection: tests, marks, parametrize ids
# ------------------------------------------------------------------------------------------------------------
_NONPRINTABLE = {i: f"\\x{i:02x}" for i in (*range(0, 32), 127) if chr(i) not in "\t\n\r"}
_NONPRINTABLE.update({ord("\t"): "\\t", ord("\n"): "\\n", ord("\r"): "\\r"})


def _ascii_escaped(v: str | bytes) -> str:
    """pytest's `_pytest.compat.ascii_escaped`."""
    s = v.decode("ascii", "backslashreplace") if isinstance(v, bytes) else v.encode("unicode_escape").decode()
    return s.translate(_NONPRINTABLE)


def _literal(node: ast.AST) -> tuple[bool, Any]:
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _idval(node: ast.expr, argname: str, idx: int, mod: _Module) -> str:
    """pytest's id of one parameter value (`ParameterSet ids`: str / bytes up to 100 characters escaped,
    numbers / None / bools as str, a function's or class's name, else `<argname><index>`)."""
    ok, v = _literal(node)
    if ok:
        if isinstance(v, str | bytes):
            return _ascii_escaped(v) if len(v) <= 100 else f"{argname}{idx}"
        if v is None or isinstance(v, bool | int | float | complex):
            return str(v)
    elif isinstance(node, ast.Name) and (node.id in mod.defs or node.id in BUILTIN_NAMES):
        return node.id
    return f"{argname}{idx}"


def _unique(ids: list[str]) -> list[str]:
    """pytest's `make_unique_parameterset_ids`: duplicates get a counter suffix."""
    counts: dict[str, int] = {}
    for i in ids:
        counts[i] = counts.get(i, 0) + 1
    if all(c == 1 for c in counts.values()):
        return ids
    taken, out, nxt = set(ids), [], dict.fromkeys(ids, 0)
    for i in ids:
        if counts[i] > 1:
            sep = "_" if i and i[-1].isdigit() else ""
            new = f"{i}{sep}{nxt[i]}"
            while new in taken:
                nxt[i] += 1
                new = f"{i}{sep}{nxt[i]}"
            nxt[i] += 1
            taken.add(new)
            out.append(new)
        else:
            out.append(i)
    return out


@dataclasses.dataclass
class _Param:
    argnames: tuple[str, ...]
    sets: list[tuple[list[ast.expr], str, bool]] | None  # (values, id, dropped); None: known at run time


def _mark_name(dec: ast.expr, mod: _Module) -> str | None:
    attr = _pytest_attr(dec, mod)
    if attr is None or not attr.startswith("mark."):
        return None
    return attr[len("mark.") :]


def _parametrize(test: str, dec: ast.Call, mod: _Module) -> _Param:
    args = dict(zip(("argnames", "argvalues"), dec.args, strict=False))
    kw = {k.arg: k.value for k in dec.keywords}
    if None in kw or len(dec.args) > 2:
        raise ValueError(f"{test}: parametrize with more than argnames, argvalues and keywords")
    args.update({k: v for k, v in kw.items() if k in ("argnames", "argvalues")})
    if "argnames" not in args or "argvalues" not in args:
        raise ValueError(f"{test}: parametrize without argnames / argvalues")
    ind = kw.get("indirect")
    if ind is not None and not (isinstance(ind, ast.Constant) and ind.value is False):
        raise ValueError(f"{test}: indirect parametrize is not supported")
    ok, names = _literal(args["argnames"])
    if ok and isinstance(names, str):
        argnames = tuple(s.strip() for s in names.split(",") if s.strip())
    elif ok and isinstance(names, list | tuple) and all(isinstance(s, str) for s in names):
        argnames = tuple(names)
    else:
        raise ValueError(f"{test}: parametrize argnames must be a literal string or list of strings")
    values = args["argvalues"]
    if isinstance(values, ast.Name) and values.id in mod.assigns:
        values = mod.assigns[values.id]
    if not isinstance(values, ast.List | ast.Tuple) or any(isinstance(e, ast.Starred) for e in values.elts):
        return _Param(argnames, None)
    ids_node = kw.get("ids")
    explicit: list | None = None
    if ids_node is not None:
        ok, explicit = _literal(ids_node)
        if not ok or not isinstance(explicit, list | tuple):
            explicit = None  # an ids function: pytest's default ids here (documented)
    sets: list[tuple[list[ast.expr], str, bool]] = []
    for i, elt in enumerate(values.elts):
        pid, dropped = None, False
        if isinstance(elt, ast.Call) and _pytest_attr(elt, mod) == "param":
            pkw = {k.arg: k.value for k in elt.keywords}
            if set(pkw) - {"id", "marks"} or any(isinstance(a, ast.Starred) for a in elt.args):
                raise ValueError(f"{test}: pytest.param({ast.unparse(elt)[12:60]}..) is not supported")
            if "id" in pkw:
                ok, pid = _literal(pkw["id"])
                if not ok or not isinstance(pid, str | type(None)):
                    raise ValueError(f"{test}: pytest.param id= must be a literal string")
            if "marks" in pkw:
                m = pkw["marks"]
                marks = m.elts if isinstance(m, ast.List | ast.Tuple) else [m]
                for mk in marks:
                    name = _mark_name(mk, mod)
                    if name is None:
                        raise ValueError(f"{test}: pytest.param marks= {ast.unparse(mk)} is not supported")
                    if name in _MARKS_DROP:
                        dropped = True
                    elif name in _MARKS_CHILD:
                        raise ValueError(f"{test}: pytest.param marks= {name} is not supported")
            vals = list(elt.args)
            if len(vals) != len(argnames):
                raise ValueError(f"{test}: pytest.param with {len(vals)} values for {len(argnames)} names")
        elif len(argnames) == 1:
            vals = [elt]
        elif isinstance(elt, ast.Tuple | ast.List) and not any(isinstance(e, ast.Starred) for e in elt.elts):
            vals = list(elt.elts)
            if len(vals) != len(argnames):
                raise ValueError(
                    f"{test}: parameter set {i} has {len(vals)} values for {len(argnames)} names"
                )
        else:
            return _Param(argnames, None)  # a name or call per set: unpacked at run time
        if pid is None and explicit is not None and i < len(explicit) and explicit[i] is not None:
            e = explicit[i]
            pid = _ascii_escaped(e) if isinstance(e, str | bytes) else str(e)
        if pid is None:
            pid = "-".join(_idval(v, n, i, mod) for v, n in zip(vals, argnames, strict=True))
        else:
            pid = _ascii_escaped(pid)
        sets.append((vals, pid, dropped))
    ids = _unique([s[1] for s in sets])
    return _Param(argnames, [(v, j, d) for (v, _, d), j in zip(sets, ids, strict=True)])


def _test_marks(test: str, fn: ast.FunctionDef, mod: _Module, unittest_cls: bool) -> tuple[bool, list, bool]:
    """(dropped, parametrize marks closest first, child-only marks) of a test function."""
    dropped, params, child = False, [], False
    for dec in reversed(fn.decorator_list):
        name = _mark_name(dec, mod)
        if name is None:
            d = dotted_name(dec.func if isinstance(dec, ast.Call) else dec)
            if unittest_cls and d.split(".")[-1] in ("skip", "skipIf", "skipUnless") and "unittest" in d:
                child = True
                continue
            if unittest_cls and d.split(".")[-1] == "expectedFailure":
                dropped = True
                continue
            raise ValueError(f"{test}: decorator @{ast.unparse(dec)[:80]} is not supported")
        if name in _MARKS_DROP:
            dropped = True
        elif name == "parametrize":
            if not isinstance(dec, ast.Call):
                raise ValueError(f"{test}: @pytest.mark.parametrize without arguments")
            params.append(_parametrize(test, dec, mod))
        elif name == "skipif":
            cond = dec.args[0] if isinstance(dec, ast.Call) and dec.args else None
            if isinstance(cond, ast.Constant) and isinstance(cond.value, str):
                raise ValueError(f"{test}: skipif with a condition string is not supported")
            child = True
        elif name == "usefixtures":
            child = True
    return dropped, params, child


def _collect(tree: ast.Module, mod: _Module) -> list[_Item]:
    items: list[_Item] = []

    def add_function(fn: ast.AST, cls: ast.ClassDef | None, kind: str) -> None:
        if isinstance(fn, ast.FunctionDef) and cls is not None and _fixture_decorator(fn, mod) is not None:
            raise ValueError(f"{cls.name}::{fn.name}: class-level fixtures are not supported")
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) or not fn.name.startswith("test"):
            return
        if isinstance(fn, ast.AsyncFunctionDef):
            raise ValueError(f"{fn.name}: async test functions are not supported")
        if _fixture_decorator(fn, mod) is not None:
            return
        base = f"{cls.name}::{fn.name}" if cls is not None else fn.name
        dropped, params, child = _test_marks(base, fn, mod, kind == "unittest")
        path = (cls.name, fn.name) if cls is not None else (fn.name,)
        items[:] = [it for it in items if it.path != path]  # a redefinition replaces the earlier test
        if dropped:
            return
        if kind == "unittest" and params:
            raise ValueError(f"{base}: parametrize on a unittest.TestCase method is not supported")
        if any(p.sets is None for p in params):
            items.append(_Item(base, path, kind, fn, cls, None, None, child))
            return
        pools = [[(i, s) for i, s in enumerate(p.sets or []) if not s[2]] for p in params]
        for combo in itertools.product(*pools):
            bindings: dict[str, ast.expr] = {}
            for p, (_, (vals, _, _)) in zip(params, combo, strict=True):
                bindings.update(zip(p.argnames, vals, strict=True))
            ids = "-".join(s[1] for _, s in combo)
            name = f"{base}[{ids}]" if params else base
            name = name.replace(SOURCE_SEP + "assert ", ":\\x20assert ")
            idx = tuple(i for i, _ in combo)
            items.append(_Item(name, path, kind, fn, cls, idx, bindings, child))

    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            add_function(node, None, "fn")
        elif isinstance(node, ast.ClassDef):
            unit = any(dotted_name(b).split(".")[-1] == "TestCase" for b in node.bases)
            if not (unit or node.name.startswith("Test")):
                continue  # pytest collects Test* classes and unittest.TestCase subclasses
            methods = [n for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
            if not unit and any(m.name in ("__init__", "__new__") for m in methods):
                continue  # pytest does not collect a class with __init__
            for dec in node.decorator_list:
                name = _mark_name(dec, mod)
                if name in _MARKS_DROP:
                    break
                raise ValueError(f"{node.name}: class decorator @{ast.unparse(dec)[:80]} is not supported")
            else:
                for m in methods:
                    add_function(m, node, "unittest" if unit else "class")
    return items


# ------------------------------------------------------------------------------------------------------------
# Which names mean what inside a test; parent-graded asserts
# ------------------------------------------------------------------------------------------------------------
_NO_NAMES: frozenset[str] = frozenset()
# what `== pytest.approx(..)` becomes (split_assert grades an `isclose` imported from math)
_ISCLOSE = "_grpo_isclose"


def _is_candidate(name: str, mod: _Module, local: set[str] | frozenset[str] = _NO_NAMES) -> bool:
    if name in local or name in mod.module_names or name in mod.pytest_names or name in mod.prelude_names:
        return False
    if name in mod.sol_names:
        return True
    if not mod.star or mod.other_star:  # with two star imports a name's origin is not known here
        return False
    return name in mod.own or name not in BUILTIN_NAMES


def _candidate_ref(node: ast.AST, mod: _Module, local: set[str] | frozenset[str] = _NO_NAMES) -> str | None:
    """The program's name `node` refers to (`f`, an alias of it, `solution.f`), else None."""
    if isinstance(node, ast.Name) and _is_candidate(node.id, mod, local):
        return mod.sol_names.get(node.id, node.id)
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in mod.sol_modules
        and node.value.id not in local
    ):
        return node.attr
    return None


class _Substitute(ast.NodeTransformer):
    """Parameter names -> their values (each value inserted as is, never visited again)."""

    def __init__(self, bindings: dict[str, ast.expr]):
        self.bindings = bindings

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if isinstance(node.ctx, ast.Load) and node.id in self.bindings:
            return copy.deepcopy(self.bindings[node.id])
        return node


class _Rewrite(ast.NodeTransformer):
    """The program's names as it defines them (`solution.f`, aliases -> `f`); `X == pytest.approx(N)` ->
    `_grpo_isclose(X, N, rel_tol=.., abs_tol=..)`; `Cls(ARGS).m(ARGS)` -> a placeholder call (restored in the
    TestCase's call). `bad`: an approx this cannot express."""

    def __init__(self, mod: _Module, local: set[str]):
        self.mod, self.local = mod, local
        self.placeholders: dict[str, ast.expr] = {}
        self.candidates: set[str] = set()
        self.approx = self.bad = False

    def visit_Name(self, node: ast.Name) -> ast.AST:
        ref = _candidate_ref(node, self.mod, self.local)
        if ref is not None:
            self.candidates.add(ref)
            return ast.copy_location(ast.Name(id=ref, ctx=node.ctx), node)
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        ref = _candidate_ref(node, self.mod, self.local)
        if ref is not None:
            self.candidates.add(ref)
            return ast.copy_location(ast.Name(id=ref, ctx=ast.Load()), node)
        return self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> ast.AST:
        f = node.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Call):
            ref = _candidate_ref(f.value.func, self.mod, self.local)
            if ref is not None and ref[:1].isupper():
                inner = self.generic_visit(copy.deepcopy(node))
                assert isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute)
                made = inner.func.value
                assert isinstance(made, ast.Call)
                args = [*made.args, *inner.args, *(k.value for k in made.keywords + inner.keywords)]
                if not any(free_names(a) - BUILTIN_NAMES - self.mod.prelude_names for a in args):
                    ph = f"_grpo_method{len(self.placeholders)}"
                    self.placeholders[ph] = inner
                    self.candidates.add(ph)
                    call = ast.Call(func=ast.Name(id=ph, ctx=ast.Load()), args=[], keywords=[])
                    return ast.copy_location(call, node)
        return self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        if len(node.ops) == 1 and isinstance(node.ops[0], ast.Eq):
            for other, side in ((node.left, node.comparators[0]), (node.comparators[0], node.left)):
                if isinstance(side, ast.Call) and _pytest_attr(side, self.mod) == "approx":
                    iso = self._isclose(other, side)
                    if iso is None:
                        self.bad = True
                        return node
                    self.approx = True
                    return ast.copy_location(iso, node)
        return self.generic_visit(node)

    def _isclose(self, other: ast.expr, approx: ast.Call) -> ast.expr | None:
        """pytest.approx(N, rel=, abs=) of one number: |x - N| <= max(rel * |N|, abs), rel 1e-6 and abs 1e-12
        by default, rel 0 when only abs is given (math.isclose: relative to the larger of the two)."""
        kw = {k.arg: k.value for k in approx.keywords}
        if len(approx.args) != 1 or None in kw or set(kw) - {"rel", "abs"}:
            return None
        ok, value = _literal(approx.args[0])
        if not ok or type(value) not in (int, float):
            return None
        tol = {}
        for k in ("rel", "abs"):
            if k in kw:
                ok, v = _literal(kw[k])
                if not ok or type(v) not in (int, float) or v < 0:
                    return None
                tol[k] = float(v)
        rel = tol.get("rel", 0.0 if "abs" in tol else 1e-6)
        keywords = [
            ast.keyword("rel_tol", ast.Constant(rel)),
            ast.keyword("abs_tol", ast.Constant(tol.get("abs", 1e-12))),
        ]
        return ast.Call(
            func=ast.Name(id=_ISCLOSE, ctx=ast.Load()),
            args=[self.visit(other), ast.Constant(value)],
            keywords=keywords,
        )


class _Restore(ast.NodeTransformer):
    def __init__(self, placeholders: dict[str, ast.expr]):
        self.placeholders = placeholders

    def visit_Call(self, node: ast.Call) -> ast.AST:
        if isinstance(node.func, ast.Name) and node.func.id in self.placeholders:
            return copy.deepcopy(self.placeholders[node.func.id])
        return self.generic_visit(node)


def _immutable(v: object) -> bool:
    if isinstance(v, tuple | frozenset):
        return all(_immutable(x) for x in v)
    return v is None or isinstance(v, bool | int | float | complex | str | bytes)


def _params(item: _Item) -> list[str]:
    a = item.fn.args
    return [x.arg for x in a.posonlyargs + a.args][1 if item.cls is not None else 0 :]


def _parent_cases(item: _Item, mod: _Module, prelude: str) -> list[TestCase] | None:
    """The item's asserts as parent-graded TestCases, or None when it must run child-side."""
    fn, bindings = item.fn, item.bindings
    if bindings is None or item.child_marks or mod.autouse or item.kind == "unittest":
        return None
    if item.cls is not None:
        hooks = {"setup_method", "teardown_method", "setup_class", "teardown_class", "setup", "teardown"}
        if any(isinstance(n, ast.FunctionDef) and n.name in hooks for n in item.cls.body):
            return None
    a = fn.args
    if a.vararg or a.kwarg or a.kwonlyargs or set(_params(item)) != set(bindings):
        return None  # fixtures (or *args): child-side
    body = fn.body[1:] if ast.get_docstring(fn) is not None else fn.body
    asserts = [s for s in body if isinstance(s, ast.Assert)]
    if not body or len(asserts) != len(body):
        return None
    loads: dict[str, int] = {}
    for s in asserts:
        for n in ast.walk(s):
            if isinstance(n, ast.Name) and n.id in bindings:
                if not isinstance(n.ctx, ast.Load):
                    return None
                loads[n.id] = loads.get(n.id, 0) + 1
            if isinstance(n, ast.arg) and n.arg in bindings:
                return None  # a lambda argument shadows a parameter
    for name, count in loads.items():
        ok, v = _literal(bindings[name])
        if count > 1 and not (ok and _immutable(v)):
            return None  # one object seen twice (an in-place change would show): keep pytest's semantics
    self_name = {x.arg for x in (a.posonlyargs + a.args)[:1]} if item.cls is not None else set()
    cases = []
    for s in asserts:
        written = _Substitute(bindings).visit(copy.deepcopy(s.test))
        rw = _Rewrite(mod, self_name | (_stored_names(written) - set(bindings)))
        test = rw.visit(copy.deepcopy(written))
        if rw.bad:
            return None
        if rw.candidates & (mod.module_names | mod.prelude_names | set(mod.pytest_names)):
            return None  # an alias `as` a name the test binds otherwise: keep pytest's namespace
        free = free_names(test)
        allowed = BUILTIN_NAMES | mod.prelude_names | rw.candidates | ({_ISCLOSE} if rw.approx else set())
        if free - allowed or free & ((mod.module_names | set(mod.pytest_names)) - rw.candidates):
            return None
        pre = prelude + (f"\nfrom math import isclose as {_ISCLOSE}" if rw.approx else "")
        tc = split_assert(
            ast.unparse(ast.Assert(test=test)), pre, rw.candidates | (mod.own if mod.star else set())
        )
        if tc is None:
            return None
        if rw.placeholders:
            tc = dataclasses.replace(
                tc, call=ast.unparse(_Restore(rw.placeholders).visit(parse(tc.call, mode="eval")))
            )
        shown = ast.unparse(ast.Assert(test=written))
        cases.append(dataclasses.replace(tc, source=f"{item.name}{SOURCE_SEP}{shown}"))
    return cases


# ------------------------------------------------------------------------------------------------------------
# Child-side tests: what cannot work across processes
# ------------------------------------------------------------------------------------------------------------
def _instance_fixtures(mod: _Module) -> set[str]:
    """Fixtures that return / yield an instance of a (capitalised) class of the program."""
    out = set()
    for name, fx in mod.fixtures.items():
        local = _stored_names(fx) - {fx.name}
        made = set()
        for n in ast.walk(fx):
            if isinstance(n, ast.Assign) and _makes_instance(n.value, mod, local):
                made |= {t.id for t in n.targets if isinstance(t, ast.Name)}
            if isinstance(n, ast.Return | ast.Yield) and n.value is not None:
                if _makes_instance(n.value, mod, local) or (
                    isinstance(n.value, ast.Name) and n.value.id in made
                ):
                    out.add(name)
    return out


def _makes_instance(node: ast.AST, mod: _Module, local: set[str]) -> bool:
    if not isinstance(node, ast.Call):
        return False
    ref = _candidate_ref(node.func, mod, local)
    return ref is not None and ref[:1].isupper()


def _mutable_local(name: str, fn: ast.FunctionDef, item: _Item) -> bool:
    """Could the local `name` hold a mutable object? False only when every binding is an immutable literal."""
    if item.bindings is not None and name in item.bindings:
        ok, v = _literal(item.bindings[name])
        return not (ok and _immutable(v))
    values = []
    for n in ast.walk(fn):
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in n.targets):
            values.append(n.value)
        elif isinstance(n, ast.AugAssign | ast.AnnAssign | ast.For | ast.With | ast.NamedExpr | ast.arg):
            stored = n.arg if isinstance(n, ast.arg) else None
            if stored == name or name in _stored_names(n.target if hasattr(n, "target") else n):
                return True
    if not values:
        return True
    for v in values:
        ok, lit = _literal(v)
        if not (ok and _immutable(lit)):
            return True
    return False


def _refusal(item: _Item, mod: _Module, instance_fixtures: set[str]) -> str | None:
    """Why a child-side test would fail for every program (objects stay in the program's process), or None."""
    fn = item.fn
    local = _stored_names(fn) - {fn.name}
    local_defs = {
        n.name for n in ast.walk(fn) if isinstance(n, ast.FunctionDef | ast.ClassDef) and n is not fn
    }
    in_raises: set[int] = set()
    for n in ast.walk(fn):
        if isinstance(n, ast.With) and any(
            isinstance(w.context_expr, ast.Call)
            and (
                _pytest_attr(w.context_expr, mod) == "raises"
                or dotted_name(w.context_expr.func).endswith(".assertRaises")
            )
            for w in n.items
        ):
            in_raises |= {id(x) for s in n.body for x in ast.walk(s)}
    instances = {x.arg for x in fn.args.args if x.arg in instance_fixtures}
    for n in ast.walk(fn):
        if isinstance(n, ast.Assign) and _makes_instance(n.value, mod, local):
            instances |= {t.id for t in n.targets if isinstance(t, ast.Name)}
    for n in ast.walk(fn):
        if isinstance(n, ast.Attribute) and (
            (isinstance(n.value, ast.Name) and n.value.id in instances)
            or _makes_instance(n.value, mod, local)
        ):
            return (
                f"uses `{ast.unparse(n)[:60]}`, an attribute of an instance of the program's class "
                "(objects of the program stay in its process)"
            )
        if not isinstance(n, ast.Call) or _candidate_ref(n.func, mod, local) is None:
            continue
        for arg in [*n.args, *(k.value for k in n.keywords)]:
            if isinstance(arg, ast.Lambda) or (
                isinstance(arg, ast.Name)
                and (
                    arg.id in local_defs
                    or (arg.id in mod.defs and arg.id not in local)
                    or (
                        arg.id in BUILTIN_NAMES
                        and arg.id not in local
                        and not _is_candidate(arg.id, mod, local)
                        and callable(getattr(builtins, arg.id))
                    )
                )
            ):
                return (
                    f"passes a function to the program in `{ast.unparse(n)[:60]}` (only plain data crosses)"
                )
    loads = [
        (n.lineno, n.col_offset, n.id)
        for n in ast.walk(fn)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
    ]
    for s in ast.walk(fn):
        if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)) or id(s) in in_raises:
            continue
        call = s.value
        if _candidate_ref(call.func, mod, local) is None:
            continue
        args = {a.id for a in [*call.args, *(k.value for k in call.keywords)] if isinstance(a, ast.Name)}
        end = (call.end_lineno or call.lineno, call.end_col_offset or 0)
        later = {name for ln, col, name in loads if (ln, col) > end}
        hit = sorted(
            x for x in args & later if (x in local or x in _params(item)) and _mutable_local(x, fn, item)
        )
        if hit:
            return (
                f"calls `{ast.unparse(call)[:60]}` and then reads `{hit[0]}`: an in-place change made in the "
                "program's process is not seen by the checker"
            )
    return None


def _check_fixtures(item: _Item, mod: _Module) -> None:
    fn = item.fn
    a = fn.args
    params = [x.arg for x in a.posonlyargs + a.args][1 if item.cls is not None else 0 :]
    bound = set(item.bindings or {})
    if item.bindings is None:  # run-time parameter sets: their argnames are bound there
        for dec in fn.decorator_list:
            if _mark_name(dec, mod) == "parametrize" and isinstance(dec, ast.Call):
                bound |= set(_parametrize(item.name, dec, mod).argnames)
    need = [p for p in params[: len(params) - len(a.defaults)] if p not in bound]  # defaults: no fixture
    for dec in fn.decorator_list:
        if _mark_name(dec, mod) == "usefixtures" and isinstance(dec, ast.Call):
            for x in dec.args:
                ok, v = _literal(x)
                if not ok or not isinstance(v, str):
                    raise ValueError(f"{item.name}: usefixtures takes literal fixture names")
                need.append(v)
    seen: set[str] = set()
    while need:
        name = need.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in _FIXTURES_BUILTIN:
            continue
        if name in mod.fixtures:
            fx = mod.fixtures[name].args
            fparams = [x.arg for x in fx.posonlyargs + fx.args]
            need += fparams[: len(fparams) - len(fx.defaults)]
            continue
        why = _FIXTURES_REFUSED.get(name, "it is not defined in the test code")
        raise ValueError(f"{item.name}: fixture `{name}` is not supported ({why})")


def _check_pytest_uses(tree: ast.Module, mod: _Module) -> None:
    for name in mod.pytest_names.values():
        if name and name.split(".")[0] not in _PYTEST_SUPPORTED:
            raise ValueError(f"module level: `from pytest import {name}` is not supported")
    for node in tree.body:
        if _is_main_guard(node) or _is_runner_call(node, mod):
            continue
        where = getattr(node, "name", "module level")
        for n in ast.walk(node):
            if isinstance(n, ast.Attribute | ast.Name) and not isinstance(getattr(n, "ctx", None), ast.Store):
                attr = _pytest_attr(n, mod)
                if attr and attr.split(".")[0] not in _PYTEST_SUPPORTED:  # "" is the module itself
                    raise ValueError(f"{where}: `pytest.{attr}` is not supported")


# ------------------------------------------------------------------------------------------------------------
# split_pytest
# ------------------------------------------------------------------------------------------------------------
def split_pytest(test_code: str, own_names: set[str] | frozenset[str] = frozenset()) -> PytestTests:
    """Turn a pytest file (KodCode's `test_code`) into parent-graded tests and a child check (module
    docstring). `own_names`: the names the reference solution defines (`asserts.defined_names`); with
    `from solution import *` they are the program's even where they shadow a builtin. Raises ValueError for
    source that does not parse, has no test, or uses a construct that is not supported."""
    try:
        tree = parse(test_code)
    except (SyntaxError, ValueError) as e:
        raise ValueError(f"test_code does not parse: {e}") from None
    if not isinstance(tree, ast.Module):
        raise ValueError("test_code is not a module")
    mod = _read_module(tree, frozenset(own_names))
    _check_pytest_uses(tree, mod)
    items = _collect(tree, mod)
    if not items:
        raise ValueError("test_code has no test (no test* function or Test* class method to collect)")
    prelude = "\n".join(line for line, _ in mod.prelude)
    instance_fx = _instance_fixtures(mod)
    tests: list[TestCase] = []
    child: list[_Item] = []
    for item in items:
        cases = _parent_cases(item, mod, prelude)
        if cases is not None:
            tests += cases
            continue
        _check_fixtures(item, mod)
        why = _refusal(item, mod, instance_fx)
        if why is not None:
            raise ValueError(f"{item.name}: {why}")
        child.append(item)
    used = set().union(*(free_names(parse(t.call, mode="eval")) for t in tests)) if tests else set()
    setup = "\n".join(line for line, names in mod.prelude if names & used)
    child_check = _child_code(tree, mod, child) if child or _has_module_effects(tree, mod) else None
    return PytestTests(
        tuple(tests), child_check, tuple(it.name for it in items), setup + "\n" if setup else ""
    )


def _has_module_effects(tree: ast.Module, mod: _Module) -> bool:
    """Top-level statements pytest would run at import besides imports, definitions and literal constants."""
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom | ast.FunctionDef | ast.ClassDef | ast.Pass):
            continue
        if _is_main_guard(node) or _is_runner_call(node, mod):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue
        if (
            isinstance(node, ast.Assign | ast.AnnAssign)
            and node.value is not None
            and not free_names(node.value) - BUILTIN_NAMES - mod.prelude_names
        ):
            continue
        return True
    return False


def _child_code(tree: ast.Module, mod: _Module, child: list[_Item]) -> str:
    keep_fns = {it.path[0] for it in child}
    body = []
    for node in tree.body:
        if _is_main_guard(node) or _is_runner_call(node, mod):
            continue
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            continue
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test") and node.name not in keep_fns:
            if _fixture_decorator(node, mod) is None:
                continue  # parent-graded (or skipped) test: not needed here
        body.append(node)
    module = ast.unparse(ast.Module(body=body, type_ignores=[]))
    runs = [(it.name, it.path, it.idx, it.kind) for it in child]
    own = sorted(mod.own)
    prelude = _PRELUDE.replace("_GRPO_OWN_NAMES", repr(own)).replace("_GRPO_SHIM_SOURCE", repr(_SHIM))
    return (
        prelude
        + "\n# ---- the test module ----\n"
        + module
        + "\n\n# ---- run ----\n"
        + f"_grpo_run({runs!r})\n"
    )


# The check's first lines. They run in the check's namespace, where the checker bound the program's names
# (plain data or references to the program's objects; those that shadow a builtin only in `__program__`,
# which the checker fills with every non-dunder name), and move them all into `_grpo_cand` before any lookup
# of a name the program could have bound (only `__builtins__`, which the program cannot name, is used until
# then; a namespace whose `__builtins__` is not the builtins module fails at once). The stand-ins (`_SHIM`)
# then run in a namespace of their own, so names the test module binds (its helpers, a star import) never
# change what the runner and `pytest` do.
_PRELUDE = """\
_grpo_g = __builtins__.globals()
_grpo_prog = _grpo_g.pop("__program__", {})
_grpo_cand = {}
for _grpo_k in __builtins__.list(_grpo_g):
    if _grpo_k not in ("__name__", "__builtins__", "_grpo_g", "_grpo_cand", "_grpo_prog"):
        _grpo_cand[_grpo_k] = _grpo_g.pop(_grpo_k)
_grpo_cand.update(_grpo_prog)
del _grpo_k, _grpo_prog
_grpo_shim = {"__builtins__": __builtins__, "__name__": "_grpo_pytest_shim", "_grpo_g": _grpo_g}
_grpo_shim.update(_grpo_cand=_grpo_cand, _grpo_own=frozenset(_GRPO_OWN_NAMES))
exec(compile(_GRPO_SHIM_SOURCE, "<pytest stand-in>", "exec"), _grpo_shim)
_grpo_run = _grpo_shim["_grpo_run"]
del _grpo_shim
"""

# The stand-ins: `solution` and `pytest` in sys.modules, the runner. Globals given by _PRELUDE: _grpo_g (the
# check's namespace), _grpo_cand (the program's names), _grpo_own (the reference solution's names).
_SHIM = r'''
import sys as _grpo_sys
import types as _grpo_types
import re as _grpo_re
import math as _grpo_math
import itertools as _grpo_itertools
import builtins as _grpo_builtins

_grpo_solution = _grpo_types.ModuleType("solution")
for _grpo_k, _grpo_v in _grpo_cand.items():
    setattr(_grpo_solution, _grpo_k, _grpo_v)
_grpo_solution.__all__ = [
    k for k in _grpo_cand if not k.startswith("_") and (k in _grpo_own or not hasattr(_grpo_builtins, k))
]
_grpo_sys.modules["solution"] = _grpo_solution


class _grpo_Outcome(BaseException):
    pass


class _grpo_Skipped(_grpo_Outcome):
    pass


class _grpo_Failed(_grpo_Outcome):
    pass


def _grpo_skip(reason="", **kwargs):
    raise _grpo_Skipped(reason)


def _grpo_fail(reason="", pytrace=True):
    raise _grpo_Failed(reason)


_grpo_skip.Exception = _grpo_Skipped
_grpo_fail.Exception = _grpo_Failed
# what the checker's call raises when the program's process is gone: never an expected exception
_grpo_PROTOCOL = (
    "the program's process ended during the check",
    "the program's process broke the call protocol",
)
_grpo_BASE_ONLY = ("SystemExit", "KeyboardInterrupt", "GeneratorExit")


def _grpo_exc_matches(et, ev, expected):
    """Does an exception of type `et` match pytest.raises(expected)? The program's exceptions that are not
    builtin Exception types arrive as RuntimeError("Name: message"): matched by Name."""
    exp = expected if isinstance(expected, tuple) else (expected,)
    name = None
    if et is RuntimeError:
        text = str(ev)
        if text in _grpo_PROTOCOL:
            return False
        head = text.split(": ", 1)[0] if ": " in text else ""
        name = head if head.isidentifier() else None
    base_only = name in _grpo_BASE_ONLY
    own_class = name is not None and type(_grpo_cand.get(name)).__name__ == "_Remote"
    for e in exp:
        if isinstance(e, type):
            if name is not None and e.__name__ == name and (e.__module__ != "builtins" or base_only):
                return True
            if base_only:
                if e is BaseException:
                    return True
                continue
            if own_class:
                if e in (BaseException, Exception):
                    return True
                continue
            if issubclass(et, e):
                return True
        elif name is not None and type(e).__name__ == "_Remote":
            if any(k == name and type(v) is type(e) and v == e for k, v in _grpo_cand.items()):
                return True
    return False


class _grpo_ExceptionInfo:
    def __init__(self):
        self.value = self.type = self.tb = None

    @property
    def typename(self):
        return self.type.__name__

    def match(self, regexp):
        value = str(self.value)
        if not _grpo_re.search(regexp, value):
            raise AssertionError(f"Regex pattern did not match.\n Regex: {regexp!r}\n Input: {value!r}")
        return True

    def errisinstance(self, exc):
        return _grpo_exc_matches(self.type, self.value, exc)


class _grpo_RaisesContext:
    def __init__(self, expected, match):
        self.expected, self.match_expr, self.excinfo = expected, match, _grpo_ExceptionInfo()

    def __enter__(self):
        return self.excinfo

    def __exit__(self, et, ev, tb):
        if et is None:
            raise _grpo_Failed(f"DID NOT RAISE {self.expected!r}")
        if not _grpo_exc_matches(et, ev, self.expected):
            return False
        self.excinfo.value, self.excinfo.type, self.excinfo.tb = ev, et, tb
        if self.match_expr is not None:
            self.excinfo.match(self.match_expr)
        return True


def _grpo_raises(expected, *args, match=None, **kwargs):
    ctx = _grpo_RaisesContext(expected, match)
    if not args:
        return ctx
    with ctx:
        args[0](*args[1:], **kwargs)
    return ctx.excinfo


def _grpo_approx_eq(exp, act, rel, abs_, nan_ok):
    if isinstance(exp, dict):
        return isinstance(act, dict) and set(act) == set(exp) and all(
            _grpo_approx_eq(exp[k], act[k], rel, abs_, nan_ok) for k in exp
        )
    if isinstance(exp, (list, tuple)):
        return isinstance(act, type(exp)) and len(act) == len(exp) and all(
            _grpo_approx_eq(e, a, rel, abs_, nan_ok) for e, a in zip(exp, act)
        )
    if type(exp) is bool or type(act) is bool:
        return type(exp) is type(act) and exp == act
    num = (int, float, complex)
    if not isinstance(exp, num) or not isinstance(act, num):
        return exp == act
    if exp == act:
        return True
    if exp != exp:
        return nan_ok and act != act
    if _grpo_math.isinf(abs(exp)):
        return False
    tol_abs = 1e-12 if abs_ is None else abs_
    if rel is None and abs_ is not None:
        tol = tol_abs
    else:
        tol = max((1e-6 if rel is None else rel) * abs(exp), tol_abs)
    return abs(exp - act) <= tol


class _grpo_Approx:
    __hash__ = None

    def __init__(self, expected, rel=None, abs=None, nan_ok=False):
        self.expected, self.rel, self.abs, self.nan_ok = expected, rel, abs, nan_ok

    def __eq__(self, actual):
        return _grpo_approx_eq(self.expected, actual, self.rel, self.abs, self.nan_ok)

    def __ne__(self, actual):
        return not self.__eq__(actual)

    def __repr__(self):
        return f"approx({self.expected!r})"


class _grpo_Mark:
    def __init__(self, name, args=(), kwargs=None):
        self.name, self.args, self.kwargs = name, tuple(args), dict(kwargs or {})

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):  # applied as a decorator (pytest's rule)
            target = args[0]
            target._grpo_marks = [*target.__dict__.get("_grpo_marks", ()), self]
            return target
        return _grpo_Mark(self.name, self.args + args, {**self.kwargs, **kwargs})


class _grpo_MarkGenerator:
    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return _grpo_Mark(name)


class _grpo_ParameterSet:
    def __init__(self, values, marks, id):
        self.values, self.marks, self.id = values, marks, id


def _grpo_param(*values, marks=(), id=None):
    return _grpo_ParameterSet(values, tuple(marks) if isinstance(marks, (list, tuple)) else (marks,), id)


_grpo_FIXTURES = {}
_grpo_SCOPED = {}


def _grpo_fixture(fixture_function=None, *, scope="function", params=None, autouse=False, ids=None,
                  name=None):
    def deco(f):
        _grpo_FIXTURES[name or f.__name__] = (f, scope, autouse)
        return f

    return deco(fixture_function) if callable(fixture_function) else deco


class _grpo_Path(str):
    """tmp_path: a str (what the program receives is plain data) that answers pathlib.Path's methods."""

    def _path(self):
        import pathlib

        return pathlib.Path(str.__str__(self))

    def __truediv__(self, other):
        return _grpo_Path(str(self._path() / str(other)))

    def __rtruediv__(self, other):
        return _grpo_Path(str(other / self._path()))

    def __getattr__(self, name):
        attr = getattr(self._path(), name)
        if callable(attr):
            return lambda *a, **k: _grpo_as_path(attr(*a, **k))
        return _grpo_as_path(attr)


def _grpo_as_path(v):
    import pathlib

    if isinstance(v, pathlib.PurePath):
        return _grpo_Path(str(v))
    if hasattr(v, "__next__"):
        return (_grpo_as_path(x) for x in v)
    return v


_grpo_pytest = _grpo_types.ModuleType("pytest")
_grpo_pytest.raises = _grpo_raises
_grpo_pytest.approx = _grpo_Approx
_grpo_pytest.mark = _grpo_MarkGenerator()
_grpo_pytest.param = _grpo_param
_grpo_pytest.fixture = _grpo_fixture
_grpo_pytest.skip = _grpo_skip
_grpo_pytest.fail = _grpo_fail
_grpo_sys.modules["pytest"] = _grpo_pytest


def _grpo_argnames(f, bound):
    code = getattr(f, "__func__", f).__code__
    names = list(code.co_varnames[: code.co_argcount])[1 if bound else 0 :]
    nd = len(getattr(f, "__defaults__", None) or ())
    return names[: len(names) - nd] if nd else names


def _grpo_fixture_value(name, cache, teardowns):
    if name in cache:
        return cache[name]
    if name in _grpo_FIXTURES:
        f, scope, _ = _grpo_FIXTURES[name]
        if scope != "function" and name in _grpo_SCOPED:
            return _grpo_SCOPED[name]
        kwargs = {a: _grpo_fixture_value(a, cache, teardowns) for a in _grpo_argnames(f, False)}
        if f.__code__.co_flags & 0x20:  # a generator fixture: yield, then teardown
            gen = f(**kwargs)
            value = next(gen)
            if scope == "function":
                teardowns.append(gen)
        else:
            value = f(**kwargs)
        if scope != "function":
            _grpo_SCOPED[name] = value
    elif name == "tmp_path":
        import tempfile

        value = _grpo_Path(tempfile.mkdtemp(prefix="pytest-"))
    else:
        raise LookupError(f"fixture {name!r} not found")
    cache[name] = value
    return value


_grpo_CLASS_SETUP = set()


def _grpo_call(path, kind, kwargs, marks):
    cache, teardowns, inst = {}, [], None
    try:
        if kind == "fn":
            target = _grpo_g[path[0]]
        else:
            cls = _grpo_g[path[0]]
            hook = "setUpClass" if kind == "unittest" else "setup_class"
            if path[0] not in _grpo_CLASS_SETUP:
                _grpo_CLASS_SETUP.add(path[0])
                if hasattr(cls, hook):
                    getattr(cls, hook)()
            if kind == "unittest":
                inst = cls(path[1])
                inst.setUp()
            else:
                inst = cls()
                if hasattr(inst, "setup_method"):
                    inst.setup_method(getattr(inst, path[1]))
            target = getattr(inst, path[1])
        for m in marks:
            if m.name == "usefixtures":
                for n in m.args:
                    _grpo_fixture_value(n, cache, teardowns)
        for n, (_, _, autouse) in list(_grpo_FIXTURES.items()):
            if autouse:
                _grpo_fixture_value(n, cache, teardowns)
        for a in _grpo_argnames(target, inst is not None):
            if a not in kwargs:
                kwargs[a] = _grpo_fixture_value(a, cache, teardowns)
        target(**kwargs)
    finally:
        try:
            if inst is not None:
                hook = "tearDown" if kind == "unittest" else "teardown_method"
                if hasattr(inst, hook):
                    getattr(inst, hook)(*(() if kind == "unittest" else (getattr(inst, path[1]),)))
        finally:
            for gen in reversed(teardowns):
                try:
                    next(gen)
                except StopIteration:
                    pass


def _grpo_run_one(path, idx, kind):
    obj = _grpo_g[path[0]]
    fn = getattr(obj, path[1]) if len(path) > 1 else obj
    marks = list(getattr(fn, "_grpo_marks", ()))
    for m in marks:
        if m.name in ("skip", "xfail"):
            raise _grpo_Skipped(m.name)
        if m.name == "skipif" and (m.args[0] if m.args else m.kwargs.get("condition")):
            raise _grpo_Skipped("skipif")
    params = []
    for m in marks:
        if m.name == "parametrize":
            a = dict(zip(("argnames", "argvalues"), m.args))
            a.update({k: v for k, v in m.kwargs.items() if k in ("argnames", "argvalues")})
            names = a["argnames"]
            if isinstance(names, str):
                names = [s.strip() for s in names.split(",") if s.strip()]
            names = list(names)
            params.append((names, list(a["argvalues"])))
    combos = [idx] if idx is not None else _grpo_itertools.product(*(range(len(v)) for _, v in params))
    for combo in combos:
        kwargs, skipped = {}, False
        for (names, values), i in zip(params, combo):
            v = values[i]
            if isinstance(v, _grpo_ParameterSet):
                skipped |= any(getattr(mk, "name", "") in ("skip", "xfail") for mk in v.marks)
                vals = v.values
            else:
                vals = (v,) if len(names) == 1 else tuple(v)
            if len(vals) != len(names):
                raise TypeError(f"parameter set {i} has {len(vals)} values for {len(names)} names")
            kwargs.update(zip(names, vals))
        if not skipped:
            _grpo_call(path, kind, kwargs, marks)


def _grpo_run(items):
    failed = []
    for name, path, idx, kind in items:
        try:
            _grpo_run_one(path, idx, kind)
        except _grpo_Skipped:
            pass
        except BaseException as e:
            if type(e).__name__ == "SkipTest":  # unittest's skip
                continue
            failed.append((name, f"{type(e).__name__}: {str(e)[:150]}"))
    if failed:
        names = ", ".join(n for n, _ in failed)
        raise AssertionError(f"{len(failed)} of {len(items)} failed: {names} (first: {failed[0][1]})")
'''
