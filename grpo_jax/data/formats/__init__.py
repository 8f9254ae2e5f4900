"""One module per dataset format; importing this package imports every module in it, and each registers its
`Format` (grpo_jax.data.registry). Detection tries the formats in the order of their `order` field (the first
format whose identifying fields a row has wins: a format whose signature contains another's comes first).

A new format is one module here (its converter and one `register(Format(...))`), a fixture under
tests/fixtures/formats and its section in docs/DATA_FORMATS.md (WORKSPACE.md, "How to extend").
"""

import importlib
import pkgutil

from grpo_jax.data import registry as _registry

for _m in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_m}")
_registry.sort()
