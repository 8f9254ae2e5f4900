"""Procedural Python function-synthesis suite with difficulty levels, deterministic by seed.

Every problem is a `Problem` (source="synthetic", completion_mode="append"): the prompt is a signature line
plus a docstring (one templated sentence and 2-3 doctest examples) that ends where the body starts; the
completion is the body, e.g.

    def f(x, y):
        \"\"\"Return x plus 3 times y.
        >>> f(1, 2)
        7
        \"\"\"
        return x + 3 * y

Levels (60 template families, a small controlled vocabulary, so that a tiny from-scratch policy can learn the
description -> code mapping):

    0  one arithmetic operation of arguments and constants   x + 3, x - 2 * y, x // 4
    1  two operations / a comparison / a conditional         3 * x + 1, x % 4 == 0, 5 if x > 0 else 2
    2  one comprehension or aggregate over a list of ints    sum(v * v for v in xs), [v + 2 for v in xs]
    3  string transformations; list maps with a condition    s[::-1], s.replace('a', 'o'), [3 if v < 3 ...]
    4  composed filter / map / aggregate (lists, words)      [w[::-1] for w in s.split() if len(w) > 2]

Train / held-out split by construction. A problem's *signature* is (template name, *constant values); the
function name, argument names and example/test inputs are surface variation drawn per problem. Within each
template, the ceil(HELDOUT_FRACTION * n) signatures with the smallest fixed hash are held out
(seed-independent, so every template with constants has both splits), and generation for a split draws only
that split's signatures. Templates without constants (e.g. "Return s reversed.") are train-only, so the
held-out split measures generalisation to unseen (template, constants) combinations, never a train task
with renamed arguments. The description is an injective function of (signature, argument names), so no
prompt text can occur in both splits.

task_id is "synthetic/L{level}/{split}/{index}", with "/s{seed}" appended when seed != 0.

The docstring's examples are the problem's `public_tests` (what the model sees: multi-turn execution
feedback shows them, never a hidden test). Hidden tests (5-8 per problem) are parent-graded `TestCase`s whose
expected values come from running the trusted reference program in-process; they always include edge cases
(zero, negatives, empty list/string) and never reuse an input shown in the prompt.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import itertools
import math
import random
from collections.abc import Callable, Sequence
from typing import Any

from grpo_jax.problem import Problem, TestCase

LEVELS: tuple[int, ...] = (0, 1, 2, 3, 4)
SPLITS: tuple[str, ...] = ("train", "heldout")
HELDOUT_FRACTION = 0.2
FUNCTION_NAMES: tuple[str, ...] = ("f", "g", "solve")

# Argument slots used by the templates, their kind and the names a problem may give them (chosen jointly).
_SLOT_KIND = {"x": "int", "y": "int", "xs": "list", "s": "str"}
ARG_NAMES: dict[tuple[str, ...], tuple[tuple[str, ...], ...]] = {
    ("x",): (("x",), ("n",), ("a",)),
    ("x", "y"): (("x", "y"), ("a", "b"), ("m", "n")),
    ("xs",): (("xs",), ("nums",), ("arr",)),
    ("s",): (("s",), ("t",), ("text",)),
}

# Words the string inputs are made of (lowercase, single-spaced sentences of 0-4 words).
WORDS: tuple[str, ...] = (
    "a", "an", "to", "it", "on", "up", "is",
    "cat", "dog", "sun", "sky", "red", "tea", "ant", "egg", "ice", "ink", "owl", "oak", "one", "net", "nut",
    "log", "tin", "tree", "blue", "moon", "star", "fish", "bird", "rain", "note", "lion", "salt", "iron",
    "rose", "lake", "east", "apple", "river", "green", "stone", "light", "train", "ocean", "table",
)  # fmt: skip
LETTERS: tuple[str, ...] = ("a", "e", "i", "o", "s", "t", "n", "r")
SEPARATORS: tuple[str, ...] = ("-", "+", "_", ",", ".", ":", "/", "*")

_INT_LO, _INT_HI = -9, 9
_PLAIN_TYPES = (int, bool, str, type(None))


@dataclasses.dataclass(frozen=True)
class Template:
    """One task family: a description and a body, `str.format` templates over argument slots and constants.

    Slots `{x}`, `{y}` (ints), `{xs}` (list of ints), `{s}` (string) become the problem's argument names;
    constants are rendered with `repr` in both the description and the body.
    """

    name: str
    level: int
    args: tuple[str, ...]
    description: str
    body: str
    consts: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    where: Callable[..., bool] | None = None  # constraint on the constants (keyword arguments)
    max_words: int = 3  # longest sentence drawn for a string argument

    def constant_space(self) -> list[tuple[Any, ...]]:
        """All allowed constant tuples, in a fixed order."""
        names = [n for n, _ in self.consts]
        out = []
        for values in itertools.product(*(v for _, v in self.consts)):
            if self.where is None or self.where(**dict(zip(names, values, strict=True))):
                out.append(tuple(values))
        return out

    def render(self, names: Sequence[str], values: Sequence[Any]) -> tuple[str, str]:
        """(description, body line without indentation) for argument names and constant values."""
        fields = dict(zip(self.args, names, strict=True))
        fields.update({n: repr(v) for (n, _), v in zip(self.consts, values, strict=True)})
        return self.description.format(**fields), self.body.format(**fields)


def _r(lo: int, hi: int) -> tuple[int, ...]:
    return tuple(range(lo, hi + 1))


_T = Template
TEMPLATES: tuple[Template, ...] = (
    # ---- level 0: one arithmetic operation ----
    _T("add_const", 0, ("x",), "Return {x} plus {c}.", "return {x} + {c}", (("c", _r(1, 9)),)),
    _T("sub_const", 0, ("x",), "Return {x} minus {c}.", "return {x} - {c}", (("c", _r(1, 9)),)),
    _T("mul_const", 0, ("x",), "Return {x} times {c}.", "return {x} * {c}", (("c", _r(2, 9)),)),
    _T("rsub_const", 0, ("x",), "Return {c} minus {x}.", "return {c} - {x}", (("c", _r(1, 9)),)),
    _T("floordiv_const", 0, ("x",), "Return {x} divided by {c}, rounded down.", "return {x} // {c}",
       (("c", _r(2, 9)),)),
    _T("mod_const", 0, ("x",), "Return the remainder of {x} divided by {c}.", "return {x} % {c}",
       (("c", _r(2, 9)),)),
    _T("add_scaled", 0, ("x", "y"), "Return {x} plus {c} times {y}.", "return {x} + {c} * {y}",
       (("c", _r(2, 9)),)),
    _T("sub_scaled", 0, ("x", "y"), "Return {x} minus {c} times {y}.", "return {x} - {c} * {y}",
       (("c", _r(2, 9)),)),
    _T("add_args", 0, ("x", "y"), "Return {x} plus {y}.", "return {x} + {y}"),
    _T("sub_args", 0, ("x", "y"), "Return {x} minus {y}.", "return {x} - {y}"),
    _T("mul_args", 0, ("x", "y"), "Return {x} times {y}.", "return {x} * {y}"),
    # ---- level 1: two operations, comparisons, conditional expressions ----
    _T("affine", 1, ("x",), "Return {a} times {x} plus {b}.", "return {a} * {x} + {b}",
       (("a", _r(2, 9)), ("b", _r(1, 9)))),
    _T("square_plus", 1, ("x",), "Return {x} squared plus {c}.", "return {x} * {x} + {c}",
       (("c", _r(1, 9)),)),
    _T("sum_times", 1, ("x", "y"), "Return {x} plus {y}, all times {c}.", "return ({x} + {y}) * {c}",
       (("c", _r(2, 9)),)),
    _T("divisible", 1, ("x",), "Return True if {x} is divisible by {c}.", "return {x} % {c} == 0",
       (("c", _r(2, 9)),)),
    _T("greater_const", 1, ("x",), "Return True if {x} is greater than {c}.", "return {x} > {c}",
       (("c", _r(0, 9)),)),
    _T("less_const", 1, ("x",), "Return True if {x} is less than {c}.", "return {x} < {c}",
       (("c", _r(0, 9)),)),
    _T("max_const", 1, ("x",), "Return the larger of {x} and {c}.", "return max({x}, {c})",
       (("c", _r(0, 9)),)),
    _T("min_const", 1, ("x",), "Return the smaller of {x} and {c}.", "return min({x}, {c})",
       (("c", _r(0, 9)),)),
    _T("if_positive", 1, ("x",), "Return {a} if {x} is positive, else {b}.", "return {a} if {x} > 0 else {b}",
       (("a", _r(0, 9)), ("b", _r(0, 9))), lambda a, b: a != b),
    _T("max_args", 1, ("x", "y"), "Return the larger of {x} and {y}.", "return max({x}, {y})"),
    _T("abs_value", 1, ("x",), "Return the absolute value of {x}.", "return abs({x})"),
    _T("is_even", 1, ("x",), "Return True if {x} is even.", "return {x} % 2 == 0"),
    _T("distance", 1, ("x", "y"), "Return the distance between {x} and {y}.", "return abs({x} - {y})"),
    # ---- level 2: one comprehension / aggregate over a list ----
    _T("sum_list", 2, ("xs",), "Return the sum of {xs}.", "return sum({xs})"),
    _T("sum_squares", 2, ("xs",), "Return the sum of the squares of {xs}.",
       "return sum(v * v for v in {xs})"),
    _T("count_even", 2, ("xs",), "Return how many numbers in {xs} are even.",
       "return len([v for v in {xs} if v % 2 == 0])"),
    _T("count_greater", 2, ("xs",), "Return how many numbers in {xs} are greater than {c}.",
       "return len([v for v in {xs} if v > {c}])", (("c", _r(0, 7)),)),
    _T("keep_greater", 2, ("xs",), "Return the numbers in {xs} greater than {c}.",
       "return [v for v in {xs} if v > {c}]", (("c", _r(0, 7)),)),
    _T("keep_less", 2, ("xs",), "Return the numbers in {xs} less than {c}.",
       "return [v for v in {xs} if v < {c}]", (("c", _r(0, 7)),)),
    _T("add_each", 2, ("xs",), "Return {xs} with {c} added to each number.", "return [v + {c} for v in {xs}]",
       (("c", _r(1, 9)),)),
    _T("times_each", 2, ("xs",), "Return {xs} with each number times {c}.", "return [v * {c} for v in {xs}]",
       (("c", _r(2, 9)),)),
    _T("count_value", 2, ("xs",), "Return how many times {c} appears in {xs}.", "return {xs}.count({c})",
       (("c", _r(0, 9)),)),
    _T("max_or", 2, ("xs",), "Return the largest number in {xs}, or {c} if {xs} is empty.",
       "return max({xs}, default={c})", (("c", _r(0, 9)),)),
    _T("sum_plus", 2, ("xs",), "Return the sum of {xs} plus {c}.", "return sum({xs}) + {c}",
       (("c", _r(1, 9)),)),
    # ---- level 3: strings; list maps with a condition ----
    _T("reverse", 3, ("s",), "Return {s} reversed.", "return {s}[::-1]"),
    _T("upper", 3, ("s",), "Return {s} in upper case.", "return {s}.upper()"),
    _T("count_words", 3, ("s",), "Return the number of words in {s}.", "return len({s}.split())"),
    _T("count_char", 3, ("s",), "Return how many times {a} appears in {s}.", "return {s}.count({a})",
       (("a", LETTERS),)),
    _T("replace_char", 3, ("s",), "Return {s} with each {a} replaced by {b}.", "return {s}.replace({a}, {b})",
       (("a", LETTERS), ("b", LETTERS)), lambda a, b: a != b),
    _T("join_words", 3, ("s",), "Return the words of {s} joined by {sep}.", "return {sep}.join({s}.split())",
       (("sep", SEPARATORS),)),
    _T("first_chars", 3, ("s",), "Return the first {k} characters of {s}.", "return {s}[:{k}]",
       (("k", _r(1, 9)),)),
    _T("last_chars", 3, ("s",), "Return the last {k} characters of {s}.", "return {s}[-{k}:]",
       (("k", _r(1, 9)),)),
    _T("repeat", 3, ("s",), "Return {s} repeated {k} times.", "return {s} * {k}", (("k", _r(2, 5)),),
       max_words=1),
    _T("starts_with", 3, ("s",), "Return True if {s} starts with {a}.", "return {s}.startswith({a})",
       (("a", LETTERS),)),
    _T("ends_with", 3, ("s",), "Return True if {s} ends with {a}.", "return {s}.endswith({a})",
       (("a", LETTERS),)),
    _T("replace_even", 3, ("xs",), "Return {xs} with each even number replaced by {c}.",
       "return [{c} if v % 2 == 0 else v for v in {xs}]", (("c", _r(0, 9)),)),
    _T("raise_to", 3, ("xs",), "Return {xs} with each number less than {c} replaced by {c}.",
       "return [{c} if v < {c} else v for v in {xs}]", (("c", _r(0, 9)),)),
    # ---- level 4: composed filter / map / aggregate ----
    _T("sum_squares_even", 4, ("xs",), "Return the sum of the squares of the even numbers in {xs}.",
       "return sum(v * v for v in {xs} if v % 2 == 0)"),
    _T("keep_add", 4, ("xs",), "Return the numbers in {xs} greater than {c}, each plus {d}.",
       "return [v + {d} for v in {xs} if v > {c}]", (("c", _r(0, 5)), ("d", _r(1, 9)))),
    _T("keep_times", 4, ("xs",), "Return the numbers in {xs} less than {c}, each times {d}.",
       "return [v * {d} for v in {xs} if v < {c}]", (("c", _r(0, 5)), ("d", _r(2, 9)))),
    _T("sum_greater", 4, ("xs",), "Return the sum of the numbers in {xs} greater than {c}.",
       "return sum(v for v in {xs} if v > {c})", (("c", _r(0, 7)),)),
    _T("count_between", 4, ("xs",), "Return how many numbers in {xs} are between {a} and {b}.",
       "return len([v for v in {xs} if {a} <= v <= {b}])", (("a", _r(-4, 3)), ("b", _r(0, 8))),
       lambda a, b: a < b),
    _T("max_even_or", 4, ("xs",), "Return the largest even number in {xs}, or {c} if there is none.",
       "return max([v for v in {xs} if v % 2 == 0], default={c})", (("c", _r(0, 9)),)),
    _T("long_words", 4, ("s",), "Return the words of {s} longer than {k} letters.",
       "return [w for w in {s}.split() if len(w) > {k}]", (("k", _r(1, 4)),)),
    _T("long_words_rev", 4, ("s",), "Return the words of {s} longer than {k} letters, each reversed.",
       "return [w[::-1] for w in {s}.split() if len(w) > {k}]", (("k", _r(1, 4)),)),
    _T("long_words_upper", 4, ("s",), "Return the words of {s} longer than {k} letters, each in upper case.",
       "return [w.upper() for w in {s}.split() if len(w) > {k}]", (("k", _r(1, 4)),)),
    _T("count_words_start", 4, ("s",), "Return how many words of {s} start with {a}.",
       "return len([w for w in {s}.split() if w.startswith({a})])", (("a", LETTERS),)),
    _T("initials", 4, ("s",), "Return the first letter of each word of {s}, joined by {sep}.",
       "return {sep}.join(w[0] for w in {s}.split())", (("sep", SEPARATORS),)),
    _T("join_long", 4, ("s",), "Return the words of {s} longer than {k} letters, joined by {sep}.",
       "return {sep}.join(w for w in {s}.split() if len(w) > {k})", (("k", _r(1, 4)), ("sep", SEPARATORS))),
)  # fmt: skip
del _T

_BY_NAME: dict[str, Template] = {t.name: t for t in TEMPLATES}
Signature = tuple[Any, ...]  # (template name, *constant values)


@dataclasses.dataclass(frozen=True)
class TaskSuiteConfig:
    """Which levels, how many problems per level and split, and the generation seed."""

    levels: tuple[int, ...] = LEVELS
    seed: int = 0
    train_per_level: int = 2000
    heldout_per_level: int = 100

    def __post_init__(self):
        bad = [lv for lv in self.levels if lv not in LEVELS]
        if not self.levels or bad:
            raise ValueError(
                f"TaskSuiteConfig.levels={self.levels!r}: levels must be a non-empty subset of {LEVELS}"
            )
        if self.train_per_level < 0 or self.heldout_per_level < 0:
            raise ValueError("TaskSuiteConfig: train_per_level and heldout_per_level must be >= 0")


# --------------------------------------------------------------------------------------------- introspection


def all_templates() -> tuple[Template, ...]:
    return TEMPLATES


def templates_for_level(level: int) -> tuple[Template, ...]:
    _check_level(level)
    return tuple(t for t in TEMPLATES if t.level == level)


def _hash_int(*parts: Any) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "big")


_HELDOUT_CACHE: dict[str, frozenset[Signature]] = {}


def _heldout_signatures(template: Template) -> frozenset[Signature]:
    """The ceil(HELDOUT_FRACTION * n) signatures of a template with the smallest split hashes."""
    if template.name not in _HELDOUT_CACHE:
        sigs = [(template.name, *values) for values in template.constant_space()]
        held: frozenset[Signature] = frozenset()
        if template.consts and len(sigs) >= 2:
            ranked = sorted(sigs, key=lambda s: _hash_int("grpo_jax.tasks.split", *s))
            held = frozenset(ranked[: math.ceil(HELDOUT_FRACTION * len(sigs))])
        _HELDOUT_CACHE[template.name] = held
    return _HELDOUT_CACHE[template.name]


def split_of(signature: Signature) -> str:
    """The split a signature belongs to, fixed by a hash of it (ranked within its template), seed-independent.

    Within each template with constants, the ceil(HELDOUT_FRACTION * n) signatures with the smallest hash are
    held out (so every such template has both splits); templates without constants are train-only.
    """
    template = _BY_NAME[signature[0]]
    return "heldout" if tuple(signature) in _heldout_signatures(template) else "train"


_SIGNATURE_CACHE: dict[tuple[str, str], tuple[Signature, ...]] = {}


def signatures(template_name: str, split: str | None = None) -> tuple[Signature, ...]:
    """All signatures of a template (optionally only those of one split), in a fixed order."""
    key = (template_name, split or "all")
    if key not in _SIGNATURE_CACHE:
        template = _BY_NAME[template_name]
        sigs = tuple((template.name, *values) for values in template.constant_space())
        if split is not None:
            _check_split(split)
            sigs = tuple(s for s in sigs if split_of(s) == split)
        _SIGNATURE_CACHE[key] = sigs
    return _SIGNATURE_CACHE[key]


def _check_level(level: int) -> None:
    if level not in LEVELS:
        raise ValueError(f"level={level!r} is not a task level; valid levels are {LEVELS}")


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is not a task split; valid splits are {SPLITS}")


# --------------------------------------------------------------------------------------------- input sampling


def _hot_ints(values: Sequence[Any]) -> list[int]:
    hot: set[int] = set()
    for c in values:
        if isinstance(c, int) and not isinstance(c, bool):
            hot.update({c - 1, c, c + 1, 2 * c, -c})
    return sorted(h for h in hot if -20 <= h <= 20)


def _rand_int(rng: random.Random, hot: list[int]) -> int:
    if hot and rng.random() < 0.3:
        return rng.choice(hot)
    return rng.randint(_INT_LO, _INT_HI)


def _rand_list(rng: random.Random, hot: list[int]) -> list[int]:
    return [_rand_int(rng, hot) for _ in range(rng.randint(1, 5))]


def _rand_str(rng: random.Random, hot_letters: list[str], max_words: int) -> str:
    words = []
    for _ in range(rng.randint(1, max_words)):
        if hot_letters and rng.random() < 0.5:
            letter = rng.choice(hot_letters)
            pool = [w for w in WORDS if letter in w]
            words.append(rng.choice(pool))
        else:
            words.append(rng.choice(WORDS))
    return " ".join(words)


def _edge_inputs(template: Template, values: Sequence[Any], rng: random.Random) -> list[tuple[Any, ...]]:
    kinds = [_SLOT_KIND[a] for a in template.args]
    if kinds == ["int"]:
        return [(0,), (-rng.randint(1, 9),)]
    if kinds == ["int", "int"]:
        return [(0, 0), (-rng.randint(1, 9), rng.randint(1, 9))]
    if kinds == ["list"]:
        return [([],), ([0],), ([-rng.randint(1, 9), -rng.randint(1, 9)],)]
    if kinds == ["str"]:
        return [("",), (rng.choice(WORDS),)]
    raise AssertionError(f"no edge inputs for {kinds}")


def _rand_inputs(template: Template, values: Sequence[Any], rng: random.Random) -> tuple[Any, ...]:
    hot = _hot_ints(values)
    hot_letters = [v for v in values if isinstance(v, str) and len(v) == 1 and v.isalpha()]
    out: list[Any] = []
    for slot in template.args:
        kind = _SLOT_KIND[slot]
        if kind == "int":
            out.append(_rand_int(rng, hot))
        elif kind == "list":
            out.append(_rand_list(rng, hot))
        else:
            out.append(_rand_str(rng, hot_letters, template.max_words))
    return tuple(out)


def _is_plain(value: Any) -> bool:
    if isinstance(value, _PLAIN_TYPES):
        return True
    if isinstance(value, list | tuple):
        return all(_is_plain(v) for v in value)
    return False


# ------------------------------------------------------------------------------------------------- generation


def _n_examples(level: int) -> int:
    return 2 if level <= 1 else 3


def _build(level: int, index: int, seed: int, split: str) -> tuple[Problem, Signature]:
    _check_level(level)
    _check_split(split)
    if index < 0:
        raise ValueError(f"index={index!r} must be >= 0")
    rng = random.Random(_hash_int("grpo_jax.tasks.generate", level, index, seed, split))
    pool = [t for t in templates_for_level(level) if signatures(t.name, split)]
    template = rng.choice(pool)
    signature = rng.choice(signatures(template.name, split))
    values = signature[1:]
    fn = rng.choice(FUNCTION_NAMES)
    names = rng.choice(ARG_NAMES[template.args])
    description, body_line = template.render(names, values)

    # The trusted reference runs in-process to compute every expected value.
    body = f"    {body_line}\n"
    namespace: dict[str, Any] = {}
    exec(compile(f"def {fn}({', '.join(names)}):\n{body}", f"<{template.name}>", "exec"), namespace)
    func = namespace[fn]

    def run(args: tuple[Any, ...]) -> Any:
        result = func(*copy.deepcopy(args))
        if not _is_plain(result):
            raise AssertionError(f"template {template.name} returned non-plain {result!r}")
        return result

    n_tests = rng.randint(5, 8)
    seen: set[str] = set()
    test_inputs: list[tuple[Any, ...]] = []
    for args in _edge_inputs(template, values, rng):
        if repr(args) not in seen:
            seen.add(repr(args))
            test_inputs.append(args)
    for _ in range(200):
        if len(test_inputs) >= n_tests:
            break
        args = _rand_inputs(template, values, rng)
        if repr(args) not in seen:
            seen.add(repr(args))
            test_inputs.append(args)

    # Examples: fresh inputs, preferring outputs not shown yet (so a boolean task shows True and False).
    candidates: list[tuple[Any, ...]] = []
    for _ in range(200):
        if len(candidates) >= 12:
            break
        args = _rand_inputs(template, values, rng)
        if repr(args) not in seen:
            seen.add(repr(args))
            candidates.append(args)
    examples: list[tuple[tuple[Any, ...], Any]] = []
    shown: set[str] = set()
    for args in candidates:
        out = run(args)
        if repr(out) not in shown:
            shown.add(repr(out))
            examples.append((args, out))
        if len(examples) == _n_examples(level):
            break
    for args in candidates:
        if len(examples) == _n_examples(level):
            break
        if all(args is not a for a, _ in examples):
            examples.append((args, run(args)))

    def call(args: tuple[Any, ...]) -> str:
        return f"{fn}({', '.join(repr(a) for a in args)})"

    lines = [f"def {fn}({', '.join(names)}):", f'    """{description}']
    for args, out in examples:
        lines += [f"    >>> {call(args)}", f"    {out!r}"]
    lines.append('    """')
    prompt = "\n".join(lines) + "\n"

    tests = []
    for args in test_inputs:
        expected = run(args)
        source = f"assert {call(args)} == {expected!r}"
        tests.append(TestCase(call=call(args), expected=expected, source=source))

    # the docstring's examples: visible to the model, so they are the public tests (execution feedback)
    public = tuple(
        TestCase(call=call(args), expected=out, source=f"assert {call(args)} == {out!r}")
        for args, out in examples
    )
    problem = Problem(
        task_id=f"synthetic/L{level}/{split}/{index}" + (f"/s{seed}" if seed else ""),
        prompt=prompt,
        entry_point=fn,
        reference=prompt + body,
        tests=tuple(tests),
        public_tests=public,
        completion_mode="append",
        level=level,
        split=split,
        source="synthetic",
        description=description,
    )
    return problem, signature


def generate(level: int, index: int, *, seed: int = 0, split: str = "train") -> Problem:
    """Problem number `index` of `level` in `split`; a pure function of (level, index, seed, split)."""
    return _build(level, index, seed, split)[0]


def problem_signature(level: int, index: int, *, seed: int = 0, split: str = "train") -> Signature:
    """The (template name, *constants) signature behind `generate(level, index, seed=seed, split=split)`."""
    return _build(level, index, seed, split)[1]


def reference_body(problem: Problem) -> str:
    """The reference completion (the body after the prompt)."""
    assert problem.reference.startswith(problem.prompt)
    return problem.reference[len(problem.prompt) :]


def make_split(
    split: str, *, levels: Sequence[int] = LEVELS, n_per_level: int, seed: int = 0
) -> list[Problem]:
    """`n_per_level` problems per level of one split, ordered by level then index."""
    _check_split(split)
    return [generate(lv, i, seed=seed, split=split) for lv in levels for i in range(n_per_level)]


def make_suite(config: TaskSuiteConfig) -> dict[str, list[Problem]]:
    """{"train": [...], "heldout": [...]} for a config."""
    return {
        "train": make_split(
            "train", levels=config.levels, n_per_level=config.train_per_level, seed=config.seed
        ),
        "heldout": make_split(
            "heldout", levels=config.levels, n_per_level=config.heldout_per_level, seed=config.seed
        ),
    }
