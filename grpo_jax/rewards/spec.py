"""The `--rewards` syntax and the names of the built-in rewards (no imports: the config checks it).

    --rewards=tests:1.0,format:0.1          built-in rewards and their weights
    --rewards=tests,mypkg.rewards:style:0.2  a user's function by import path ("module:function"), weight 0.2

An item is `NAME[:WEIGHT]` (weight 1.0 when left out); NAME is a built-in reward (BUILTIN) or
`module:function`, a callable importable from the run's Python path (grpo_jax.rewards.registry resolves it).
Weights are finite floats (0: logged only; negative: a penalty).
"""

from __future__ import annotations

import math
import re

# the built-in rewards, name -> what it scores (grpo_jax.rewards.builtin holds the functions; a test holds the
# two equal)
BUILTIN: dict[str, str] = {
    "tests": "the sandbox's test result: 1 when every test passes, else 0 (with --max_turns: the "
    "trajectory's discounted reward); --multiscale_w_tests adds per-test partial credit to the advantage",
    "tests_fraction": "the fraction of the problem's tests that passed (partial credit as a reward)",
    "format": "1 when the reply is in the prompt format's form (chat: exactly one fenced code block) and the "
    "program parses (checked by ruff in a subprocess, never imported), else 0",
    "lint": "1 / (1 + n) for n ruff diagnostics (pyflakes + pycodestyle errors: E4, E7, E9, F) of the "
    "program, 0 when it does not parse (ruff in a subprocess, never imported)",
    "length": "DAPO's soft overlong punishment: 0 up to L_max - L_cache tokens, then linear down to -1 at "
    "L_max (L_max = max_new_tokens x max_turns, L_cache = --reward_length_cache)",
}
AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")
DEFAULT = "tests"

_WEIGHT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")  # a finite decimal (not nan / inf)
_USER = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")


class SpecError(ValueError):
    """A malformed --rewards value (the message says what is wrong and what is valid)."""


def parse(text: str) -> tuple[tuple[str, float], ...]:
    """((name, weight), ...) of a --rewards value; SpecError naming the bad item."""
    items = [s.strip() for s in text.split(",")]
    if not text.strip() or any(not s for s in items):
        raise SpecError(f"an empty item; give NAME[:WEIGHT] items separated by commas, e.g. {DEFAULT}")
    out: list[tuple[str, float]] = []
    for item in items:
        name, weight = item, 1.0
        head, sep, tail = item.rpartition(":")
        if sep and _WEIGHT.match(tail):  # else "module:function" without a weight
            weight, name = float(tail), head
        if not math.isfinite(weight):  # e.g. 1e999
            raise SpecError(f"{item!r}: the weight must be a finite number")
        if name not in BUILTIN and not _USER.match(name):
            raise SpecError(
                f"{item!r}: unknown reward {name!r}; valid: {', '.join(BUILTIN)}, or module:function (a user "
                "reward by import path), each with an optional :WEIGHT"
            )
        if name in (n for n, _ in out):
            raise SpecError(f"{name!r} is given twice")
        out.append((name, weight))
    return tuple(out)


def is_default(text: str) -> bool:
    """Whether a --rewards value is today's reward alone (tests with weight 1): the run's numbers are the
    single-reward path's, bit for bit."""
    try:
        return parse(text) == ((DEFAULT, 1.0),)
    except SpecError:
        return False
