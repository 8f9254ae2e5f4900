"""What every section of the config is built from: `opt` (a field with its flag's help), the shared value
checks, `get_path`, and the ONE rule for sub-settings of optional mechanisms (`Mechanism`, issue 23).

Each section module lists its own mechanisms next to its class (a tuple `SUB_SETTINGS` of Mechanism) and
checks them in the class's `__post_init__` with `_check_sub_settings(self, scope, SUB_SETTINGS)`; the run's
whole table is grpo_jax.config.SUB_SETTINGS.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable
from typing import Any

from grpo_jax.errors import fail


def opt(
    default: Any,
    help: str,
    *,
    flag: str | None = None,
    choices: tuple | None = None,
    none_word: str | None = None,
) -> Any:
    """A config field with its command-line help (and flag name when it is not FLAG_PREFIX + name).
    none_word: for an optional field, the one word the command line reads as None (default: none / off)."""
    meta: dict[str, Any] = {"help": help}
    if flag is not None:
        meta["flag"] = flag
    if choices is not None:
        meta["choices"] = choices
    if none_word is not None:
        meta["none_word"] = none_word
    return dataclasses.field(default=default, metadata=meta)


def _positive(obj, names, strict=True):
    for n in names:
        v = getattr(obj, n)
        if (strict and not v > 0) or (not strict and not v >= 0):
            fail(obj, n, "must be > 0" if strict else "must be >= 0")


def _choice(obj, name, valid):
    if getattr(obj, name) not in valid:
        fail(obj, name, f"valid: {', '.join(valid)}")


def _schedule_ok(obj, name, what):
    sched = getattr(obj, name)
    steps = [s for s, _ in sched]
    if sched and (steps[0] != 0 or steps != sorted(set(steps))):
        fail(obj, name, f"steps must start at 0 and increase strictly, e.g. {what}")


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def get_path(cfg: Any, path: str) -> Any:
    """The value at dotted `path` below a config object."""
    for part in path.split("."):
        cfg = getattr(cfg, part)
    return cfg


# ------------------------------------------------------------------------------------------------------------
# sub-settings of optional mechanisms: ONE rule (issue 23)
# ------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Mechanism:
    """An optional mechanism of a run and the fields that only matter while it is on.

    The rule: a field of `fields` that differs from its default while `on` is false is refused (ConfigError
    naming the field: "only used with {needs} ({what}); this run has {state}: {fix}"). A value equal to
    the default is never refused, so a preset or a flagfile that leaves a field alone never trips it. A field
    may be a sub-setting of several mechanisms (each must be on). The rule is checked by the section at
    `scope` ("" = RunConfig, else a dotted path such as "objective"), in its __post_init__ after that
    section's own checks: the smallest section that holds the switch and the fields and that by itself
    ignores them. The loss's own config mirrors TRL's, which carries ε, the SAPO temperatures and VESPO's
    k / λ whatever the loss type, so the objective refuses those; the curriculum's functions read all of its
    fields whatever the kind, so the run refuses those.
    """

    key: str  # a short name (tests, docs)
    scope: str
    needs: str  # the switch, as flags
    what: str  # what the mechanism is (and why the fields need it)
    on: Callable[[Any], bool]  # over the section at `scope`
    state: Callable[[Any], str]  # how this run has it, as flags
    fields: tuple[str, ...]  # dotted paths below `scope`, in the order they are reported
    fix: str = ""  # what to do; default "drop it, or use {needs}"

    @property
    def paths(self) -> tuple[str, ...]:
        """The fields as dotted RunConfig paths."""
        return tuple(f"{self.scope}.{f}" if self.scope else f for f in self.fields)

    def why(self, section: Any) -> str:
        fix = self.fix or f"drop it, or use {self.needs}"
        return f"only used with {self.needs} ({self.what}); this run has {self.state(section)}: {fix}"


def _field_default(section: Any, path: str) -> Any:
    """The declared default of the field at dotted `path` below the section instance `section`."""
    *parents, leaf = path.split(".")
    for p in parents:
        section = getattr(section, p)
    return type(section).__dataclass_fields__[leaf].default


def _check_sub_settings(section: Any, scope: str, mechanisms: tuple[Mechanism, ...]) -> None:
    """The rule of Mechanism for those of `mechanisms` checked at `scope` (`section` is the instance there),
    in their order: the first refused field is reported."""
    for m in mechanisms:
        if m.scope != scope or m.on(section):
            continue
        for f in m.fields:
            if get_path(section, f) != _field_default(section, f):
                fail(section, f, m.why(section))
