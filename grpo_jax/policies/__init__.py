"""Our own model code, the networks we train: the seed's MLP actor-critic (``mlp``) and the decoder-only LM
(``transformer``, its sampler, chunked log-prob head and LoRA adapters). Loading and saving OTHER people's
checkpoints (Hugging Face, GGUF) is grpo_jax.pretrained.

Each module exposes pure functions over plain parameter pytrees (``init``, ``apply``, ``sample``, ``logp``,
``entropy``) so trainers can jit, vmap and stack them (the policy pool is one stacked pytree).
"""
