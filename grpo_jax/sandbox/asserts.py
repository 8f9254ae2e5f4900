"""Split test asserts into parent-graded `TestCase`s (AST only; nothing here runs the test code).

An assert can be graded in the parent when it is one candidate-dependent expression CALL, possibly wrapped in
plain-data functions (`set`, `sorted`, `len`, `round(·, n)`, ...), related by one of these shapes to an
expression EXPR that does not depend on the candidate:

    assert CALL == EXPR          assert CALL != EXPR          assert CALL is None / True / False
    assert CALL                  assert not CALL              assert CALL in EXPR / EXPR in CALL
    assert CALL < EXPR (<=, >, >=)
    assert abs(CALL - EXPR) < TOL (or <=; either order inside abs)
    assert math.isclose(CALL, EXPR, rel_tol=.., abs_tol=..) (or `isclose` imported from math)

Only CALL is sent to the sandboxed child; the parent applies the wrappers and the comparison to the plain
value that comes back (`grading.check_value`). EXPR "does not depend on the candidate" when every free name in
it is a builtin or a module imported by the test's own import lines (`prelude`): a literal EXPR becomes
`TestCase.expected` at once; any other EXPR (`10**12 + 1`, `math.pi`, `[0] * 5`) becomes
`TestCase.expected_expr`, which the executor evaluates once in a separate sandboxed child that never sees a
candidate (`Executor.run` resolves it before grading, cached).

`split_assert(source)` handles one assert line; `split_check(test_code, entry_point)` rewrites HumanEval's
`def check(candidate): ...` into per-assert tests plus what must stay child-side.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import warnings
from collections.abc import Iterable
from typing import Literal, overload

from grpo_jax.sandbox.grading import WRAPPERS
from grpo_jax.sandbox.types import TestCase

BUILTIN_NAMES = frozenset(dir(builtins))
_CMP = {ast.Eq: "eq", ast.NotEq: "ne", ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge"}
_FLIP = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq", "ne": "ne"}


@overload
def parse(code: str, mode: Literal["exec"] = "exec") -> ast.Module: ...
@overload
def parse(code: str, mode: Literal["eval"]) -> ast.Expression: ...
def parse(code: str, mode: str = "exec") -> ast.AST:
    """ast.parse without the Syntax/DeprecationWarnings of dataset code (MBPP's "\\d" in plain strings)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        return ast.parse(code, mode=mode)


# ------------------------------------------------------------------------------------------------------------
# Free names of an expression (lambda / comprehension bindings are local)
# ------------------------------------------------------------------------------------------------------------
def free_names(node: ast.AST) -> set[str]:
    out: set[str] = set()

    def visit(n: ast.AST, bound: frozenset[str]) -> None:
        if isinstance(n, ast.Name):
            if isinstance(n.ctx, ast.Load) and n.id not in bound:
                out.add(n.id)
            return
        if isinstance(n, ast.Lambda):
            a = n.args
            names = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}
            names |= {x.arg for x in (a.vararg, a.kwarg) if x is not None}
            for d in a.defaults + [d for d in a.kw_defaults if d is not None]:
                visit(d, bound)
            visit(n.body, bound | names)
            return
        if isinstance(n, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            inner = set(bound)
            for i, gen in enumerate(n.generators):
                visit(gen.iter, frozenset(inner) if i else bound)
                inner |= {t.id for t in ast.walk(gen.target) if isinstance(t, ast.Name)}
                for cond in gen.ifs:
                    visit(cond, frozenset(inner))
            elts = (n.key, n.value) if isinstance(n, ast.DictComp) else (n.elt,)
            for e in elts:
                visit(e, frozenset(inner))
            return
        if isinstance(n, ast.NamedExpr):
            visit(n.value, bound)
            return
        for child in ast.iter_child_nodes(n):
            visit(child, bound)

    visit(node, frozenset())
    return out


def import_prelude(code: str) -> tuple[str, frozenset[str]]:
    """The top-level `import` / `from .. import` lines of test code, and the names they bind."""
    try:
        tree = parse(code)
    except (SyntaxError, ValueError):
        return "", frozenset()
    lines, names = [], set()
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)) and not (
            isinstance(node, ast.ImportFrom) and (node.level or any(a.name == "*" for a in node.names))
        ):
            lines.append(ast.unparse(node))
            for a in node.names:
                names.add(a.asname or a.name.split(".")[0])
    return "\n".join(lines), frozenset(names)


# ------------------------------------------------------------------------------------------------------------
# One assert
# ------------------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Ctx:
    allowed: frozenset[str]  # names an EXPR may use: builtins + the prelude's imports
    prelude: str
    isclose_names: frozenset[str]  # spellings of math.isclose: "math.isclose", "isclose" if imported
    rename: dict[str, str] | None = None  # e.g. {"candidate": "has_close_elements"}


def _dep(node: ast.AST, ctx: _Ctx) -> bool:
    return bool(free_names(node) - ctx.allowed)


def _literal(node: ast.AST):
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def dotted_name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted_name(node.value)
        return f"{base}.{node.attr}" if base else ""
    return ""


def _peel(node: ast.AST, ctx: _Ctx) -> tuple[ast.AST, tuple[tuple[str, tuple], ...]] | None:
    """CALL wrapped in plain-data functions -> (CALL, wrappers innermost first); None if not that shape."""
    wraps: list[tuple[str, tuple]] = []
    while (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in WRAPPERS
        and node.func.id in ctx.allowed
        and node.args
        and not any(isinstance(a, ast.Starred) for a in node.args)
    ):
        name = node.func.id
        extra = node.args[1:]
        if len(extra) > WRAPPERS[name][1]:
            break
        kw = {k.arg: k.value for k in node.keywords}
        if None in kw or (kw and (name != "sorted" or set(kw) != {"reverse"})):
            break
        ok_args = [_literal(a) for a in extra]
        if not all(ok for ok, _ in ok_args):
            break
        args = tuple(v for _, v in ok_args)
        if name == "sorted":
            ok, rev = _literal(kw["reverse"]) if kw else (True, False)
            if not ok or type(rev) is not bool:
                break
            args = (rev,)
        if not _dep(node.args[0], ctx):
            return None
        wraps.append((name, args))
        node = node.args[0]
    if not _dep(node, ctx) or _decides(node, ctx):
        return None
    return node, tuple(reversed(wraps))


# Operations that compute a verdict rather than a value: evaluated in the child on a candidate-made object
# they dispatch to its methods (__eq__, __lt__, __contains__, __bool__, __class__, startswith, ...) or to
# module functions the program may have replaced (math.isclose = lambda *a: True), so an object or a patch
# that answers True to everything would pass. A CALL containing one is not split: it runs in the child check,
# where the checker sees only plain data.
_DECIDING_CALLS = frozenset({"isinstance", "issubclass", "hasattr", "callable", "all", "any", "type", "id"})


def _decides(node: ast.AST, ctx: _Ctx) -> bool:
    """Does `node` contain, on a candidate-dependent value, a comparison / boolean operation, a deciding
    builtin, a method call or a module function call? (A name bound inside a comprehension counts as
    candidate-made: each sub-expression is judged without its binding context.)"""
    for n in ast.walk(node):
        deciding = isinstance(n, (ast.Compare, ast.BoolOp, ast.IfExp)) or (
            isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not)
        )
        if isinstance(n, ast.Call):
            f = n.func
            deciding |= isinstance(f, ast.Name) and f.id in _DECIDING_CALLS and f.id in ctx.allowed
            deciding |= not isinstance(f, ast.Name)  # x.method(...), module.func(...), f(x)(y)
        if deciding and _dep(n, ctx):
            return True
    return False


def _direct_call(node: ast.AST, ctx: _Ctx) -> bool:
    """`NAME(args)` with NAME the candidate's and candidate-free args: its truth value is the candidate's own
    answer (the only CALL form `assert CALL` / `assert not CALL` accept)."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id not in ctx.allowed
        and not any(_dep(a, ctx) for a in node.args)
        and not any(_dep(k.value, ctx) for k in node.keywords)
    )


def _rename(node: ast.AST, rename: dict[str, str] | None) -> str:
    if rename:
        node = _Renamer(rename).visit(parse(ast.unparse(node), mode="eval")).body
    return ast.unparse(node)


class _Renamer(ast.NodeTransformer):
    def __init__(self, mapping: dict[str, str]):
        self.mapping = mapping

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in self.mapping:
            return ast.copy_location(ast.Name(id=self.mapping[node.id], ctx=node.ctx), node)
        return node


def _make(call_node, wraps, kind, payload_nodes, source, ctx: _Ctx) -> TestCase | None:
    """A TestCase whose payload (the EXPR side, as one value or a tuple) is literal or left to the oracle."""
    for p in payload_nodes:
        if _dep(p, ctx):
            return None
    call = _rename(call_node, ctx.rename)
    if not payload_nodes:
        return TestCase(call=call, expected=None, source=source, kind=kind, wrap=wraps)
    node = (
        payload_nodes[0] if len(payload_nodes) == 1 else ast.Tuple(elts=list(payload_nodes), ctx=ast.Load())
    )
    ok, value = _literal(node)
    if ok:
        return TestCase(call=call, expected=value, source=source, kind=kind, wrap=wraps)
    return TestCase(
        call=call,
        expected=None,
        source=source,
        kind=kind,
        wrap=wraps,
        expected_expr=ast.unparse(node),
        prelude=ctx.prelude,
    )


def _split_test(test: ast.AST, source: str, ctx: _Ctx) -> TestCase | None:
    # assert not CALL
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        peeled = _peel(test.operand, ctx)
        if peeled is None or not _direct_call(peeled[0], ctx):
            return None
        return _make(*peeled, "falsy", (), source, ctx)
    # math.isclose(CALL, EXPR, rel_tol=.., abs_tol=..)
    if isinstance(test, ast.Call) and dotted_name(test.func) in ctx.isclose_names:
        if len(test.args) != 2 or any(isinstance(a, ast.Starred) for a in test.args):
            return None
        kw = {k.arg: k.value for k in test.keywords}
        if None in kw or not set(kw) <= {"rel_tol", "abs_tol"}:
            return None
        a, b = test.args
        for call_side, exp_side in ((a, b), (b, a)):
            peeled = _peel(call_side, ctx)
            if peeled is not None:
                rel = kw.get("rel_tol", ast.Constant(1e-09))
                abs_ = kw.get("abs_tol", ast.Constant(0.0))
                return _make(*peeled, "isclose", (exp_side, rel, abs_), source, ctx)
        return None
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        op, left, right = test.ops[0], test.left, test.comparators[0]
        # abs(CALL - EXPR) < TOL
        if (
            type(op) in (ast.Lt, ast.LtE)
            and isinstance(left, ast.Call)
            and isinstance(left.func, ast.Name)
            and left.func.id == "abs"
            and len(left.args) == 1
            and not left.keywords
            and isinstance(left.args[0], ast.BinOp)
            and isinstance(left.args[0].op, ast.Sub)
        ):
            diff = left.args[0]
            kind = "abs_lt" if isinstance(op, ast.Lt) else "abs_le"
            for call_side, exp_side in ((diff.left, diff.right), (diff.right, diff.left)):
                peeled = _peel(call_side, ctx)
                if peeled is not None and not _dep(exp_side, ctx):
                    return _make(*peeled, kind, (exp_side, right), source, ctx)
            return None
        if type(op) in (ast.Is, ast.IsNot):
            # only `is None / True / False`: identity of those equals type-strict equality of plain data
            for call_side, exp_side in ((left, right), (right, left)):
                if isinstance(exp_side, ast.Constant) and exp_side.value in (None, True, False):
                    if type(exp_side.value) not in (bool, type(None)):
                        continue
                    peeled = _peel(call_side, ctx)
                    if peeled is not None:
                        kind = "eq" if isinstance(op, ast.Is) else "ne"
                        return _make(*peeled, kind, (exp_side,), source, ctx)
            return None
        if type(op) in (ast.In, ast.NotIn):
            neg = isinstance(op, ast.NotIn)
            peeled = _peel(left, ctx)
            if peeled is not None:
                return _make(*peeled, "not_in" if neg else "in", (right,), source, ctx)
            peeled = _peel(right, ctx)
            if peeled is not None:
                return _make(*peeled, "not_contains" if neg else "contains", (left,), source, ctx)
            return None
        if type(op) in _CMP:
            kind = _CMP[type(op)]
            peeled = _peel(left, ctx)
            if peeled is not None:
                return _make(*peeled, kind, (right,), source, ctx)
            peeled = _peel(right, ctx)
            if peeled is not None:
                return _make(*peeled, _FLIP[kind], (left,), source, ctx)
            return None
        return None
    # assert CALL
    peeled = _peel(test, ctx)
    if peeled is None or not _direct_call(peeled[0], ctx):
        return None
    return _make(*peeled, "truthy", (), source, ctx)


def _ctx(
    prelude: str,
    prelude_names: Iterable[str],
    rename: dict[str, str] | None = None,
    candidate_names: Iterable[str] = (),
) -> _Ctx:
    names = frozenset(prelude_names)
    isclose = {"math.isclose"}  # graded by the parent's own math.isclose, imported by the test or not
    try:
        for node in parse(prelude).body:
            if isinstance(node, ast.ImportFrom) and node.module == "math":
                isclose |= {a.asname or a.name for a in node.names if a.name == "isclose"}
    except SyntaxError:
        pass
    allowed = (BUILTIN_NAMES | names) - set(rename or ()) - set(candidate_names)
    return _Ctx(allowed=frozenset(allowed), prelude=prelude, isclose_names=frozenset(isclose), rename=rename)


def split_assert(line: str, prelude: str = "", candidate_names: Iterable[str] = ()) -> TestCase | None:
    """One `assert ...` line -> a parent-graded TestCase, or None when it has none of the shapes above.

    `prelude`: import lines whose names the EXPR side may use (e.g. "import math"). `candidate_names`: names
    the program defines (e.g. `defined_names(reference)`); they are never builtins or wrappers here, so a
    solution named `sum` is still the candidate."""
    try:
        tree = parse(line.strip())
    except (SyntaxError, ValueError):
        return None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert):
        return None
    pre, names = import_prelude(prelude)
    return _split_test(tree.body[0].test, line.strip(), _ctx(pre, names, candidate_names=candidate_names))


def defined_names(code: str) -> frozenset[str]:
    """Names a program binds at its top level (functions, classes, assignments, imports)."""
    try:
        tree = parse(code)
    except (SyntaxError, ValueError):
        return frozenset()
    out = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out |= {a.asname or a.name.split(".")[0] for a in node.names}
        else:
            out |= {t.id for t in ast.walk(node) if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)}
    return frozenset(out)


# ------------------------------------------------------------------------------------------------------------
# HumanEval: def check(candidate) -> per-assert tests + the rest (child-side)
# ------------------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class SplitCheck:
    tests: tuple[TestCase, ...]  # parent-graded, in the order of the check's body
    child_check: str | None  # what cannot be split (module code + the remaining body), or None
    child_statements: int  # statements of check's body left child-side (0 when everything split)


def split_check(test_code: str, entry_point: str, check_name: str = "check") -> SplitCheck:
    """Rewrite HumanEval's `test` code: every top-level assert of `check`'s body that has one of the shapes
    becomes a TestCase with `candidate` bound to `entry_point`; `assert True` lines are dropped; everything
    else (loops, helpers, asserts on locals) stays in a child check that still ends with
    `check(entry_point)`."""
    full_child = test_code + f"\n\n{check_name}({entry_point})\n"
    try:
        tree = parse(test_code)
    except (SyntaxError, ValueError):
        return SplitCheck((), full_child, -1)
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == check_name]
    if len(fns) != 1 or len(fns[0].args.args) != 1:
        return SplitCheck((), full_child, -1)
    fn = fns[0]
    param = fn.args.args[0].arg
    prelude, names = import_prelude(test_code)
    bound_names = set()
    for node in tree.body:
        for t in ast.walk(node) if not isinstance(node, (ast.Import, ast.ImportFrom)) else ():
            if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store):
                bound_names.add(t.id)
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound_names.add(node.name)
    # names bound anywhere in check's body (locals) are not candidate-free either: they are not in `allowed`
    ctx = _ctx(prelude, set(names) - bound_names, rename={param: entry_point})
    tests: list[TestCase] = []
    rest: list[ast.stmt] = []
    for stmt in fn.body:
        if isinstance(stmt, ast.Assert):
            ok, value = _literal(stmt.test)
            if ok and value is True:
                continue  # `assert True, "..."`
            if not free_names(stmt.test) & (bound_names - {param}):
                tc = _split_test(stmt.test, ast.unparse(stmt), ctx)
                if tc is not None:
                    tests.append(tc)
                    continue
        if isinstance(stmt, ast.Expr) and (
            isinstance(stmt.value, ast.Constant)
            or (isinstance(stmt.value, ast.Name) and stmt.value.id in BUILTIN_NAMES - bound_names)
        ):
            continue  # a docstring, a bare string, a bare builtin name (HumanEval/129's `print`)
        rest.append(stmt)
    if not rest:
        return SplitCheck(tuple(tests), None, 0)
    fn.body = rest
    child = ast.unparse(tree) + f"\n\n{check_name}({entry_point})\n"
    return SplitCheck(tuple(tests), child, len(rest))
