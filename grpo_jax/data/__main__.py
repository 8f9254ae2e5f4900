"""`python -m grpo_jax.data`: the formats table of docs/DATA_FORMATS.md, from the registry."""

from grpo_jax.data import registry

print(registry.docs_table())
