"""Tiny pure-JAX tasks (deterministic by key) for testing and demonstrating the MLP policy and trainers."""
