"""One module per `--algorithm` (its config section, its checks and one `register(AlgorithmSpec(...))`,
grpo_jax.config.algorithms.registry); importing this package imports every module in it, so a new algorithm's
config is one module here. The objective section (grpo_jax.config.objective) reads the registry.
"""

import importlib
import pkgutil

from grpo_jax.config.algorithms.registry import AlgorithmSpec, register, spec, specs

for _m in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _m != "registry":
        importlib.import_module(f"{__name__}.{_m}")

__all__ = ["AlgorithmSpec", "register", "spec", "specs"]
