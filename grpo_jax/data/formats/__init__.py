"""One module per dataset format; importing this package registers them all (grpo_jax.data.registry), in
the order detection tries them (the first format whose identifying fields a row has wins).

A new format is one module here (its converter and one `register(Format(...))`), its name in ORDER, a
fixture under tests/fixtures/formats and its section in docs/DATA_FORMATS.md (WORKSPACE.md, "How to extend").
"""

import importlib

ORDER = (
    "humaneval",
    "mbpp",
    "livecodebench",
    "codecontests",
    "codeforces",
    "kodcode",
    "synthetic1",
    "deepcoder",
    "apps",
    "native",
)

for _name in ORDER:
    importlib.import_module(f"{__name__}.{_name}")

from grpo_jax.data import registry as _registry  # noqa: E402

# detection order is ORDER, whatever order the modules imported each other in
_registry.FORMATS.update({n: _registry.FORMATS.pop(n) for n in ORDER})
assert tuple(_registry.FORMATS) == ORDER, "a format module is missing from ORDER"
