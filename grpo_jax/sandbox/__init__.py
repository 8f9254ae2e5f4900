"""Sandboxed execution of untrusted generated code (host side; never imports JAX)."""
