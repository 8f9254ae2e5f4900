"""Training: state, steps, rollouts and loops (device side is pure and jitted; host side does I/O)."""
