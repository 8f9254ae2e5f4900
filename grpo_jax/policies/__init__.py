"""Policies: the seed's MLP actor-critic (``mlp``) and the decoder-only LM (transformer modules).

Each module exposes pure functions over plain parameter pytrees (``init``, ``apply``, ``sample``, ``logp``,
``entropy``) so trainers can jit, vmap and stack them (the policy pool is one stacked pytree).
"""
