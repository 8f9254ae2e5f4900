"""Code-generation tasks: task suite, datasets, tokenizer, rewards, sandbox jobs, pass@k (host side, no JAX).

The problem type itself is `grpo_jax.problem.Problem` (neutral: shared with the sandbox and the trainer).
"""
