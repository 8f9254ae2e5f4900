"""--algorithm=grpo, the default: group-relative advantages, no critic. Its knobs are the objective's own
(ObjectiveConfig: --adv_method, --baseline, ...) and the loss's (PolicyLossConfig)."""

from grpo_jax.config.algorithms.registry import AlgorithmSpec, register

register(AlgorithmSpec(name="grpo", order=0, help="grpo (group-relative advantages, no critic)"))
