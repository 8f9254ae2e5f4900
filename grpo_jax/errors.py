"""The one error type of configuration checks (a neutral module: every layer may import it; no JAX).

A `ConfigError` names the object and the field that is wrong, the value, and what would be valid:

    ObjectiveConfig.kl_coef=-1.0: must be >= 0

It is a ValueError. The command line (grpo_jax.cli) rewrites `owner.field` into the flag that sets the field
(`--kl_coef=-1.0: must be >= 0`), so each check is written once, in the dataclass that owns the field.
"""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """owner: the dataclass name (e.g. "ObjectiveConfig"); field: a field of it, or a dotted path below it
    ("rollout.group_size" from RunConfig); value: the offending value; why: what is valid."""

    def __init__(self, owner: str, field: str, value: Any, why: str):
        self.owner, self.field, self.value, self.why = owner, field, value, why
        super().__init__(f"{owner}.{field}={value!r}: {why}")


def fail(obj: Any, field: str, why: str) -> None:
    """Raise a ConfigError for `obj.field` (a dotted path is followed attribute by attribute)."""
    value = obj
    for part in field.split("."):
        value = getattr(value, part)
    raise ConfigError(type(obj).__name__, field, value, why)


class RunConfigError(ValueError):
    """The run cannot start as configured (e.g. the workdir holds a different run, a dataset file is bad): one
    line, exit status 2, nothing written (experiments/codegen.py)."""
