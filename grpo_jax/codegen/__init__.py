"""Code-generation tasks: problems, datasets, tokenizer, rewards (host side, no JAX)."""
