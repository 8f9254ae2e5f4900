"""DPPO (--algorithm=dppo; grpo_jax.core.surrogates.dppo, grpo_jax.algorithms.dppo; docs/GRPO_MATH.md §1.17)
against literal values of the reference implementations: prime-rl's default loss (`default_loss_fn` +
`compute_loss`: per-token −K·A·r + τ_KL·(log r)², summed over the step's tokens / their count) and SkyRL's
binary-KL mask, each value and gradient computed by a float64 numpy transcription of the reference code
(cross-checked with torch autograd) and written here as numbers. Then the train step (the trust region acts
on the later updates of a step, not the first) and the refused combinations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.algorithms.policy_loss import PolicyInputs, policy_loss
from grpo_jax.config import DPPOConfig, ObjectiveConfig, OptimConfig, PolicyLossConfig
from grpo_jax.core.surrogates import ALGORITHM_TERMS
from grpo_jax.errors import ConfigError
from grpo_jax.policies import transformer as tfm
from grpo_jax.train.state import init_state, make_optimizer
from grpo_jax.train.step import make_train_step

ATOL = 2e-6
TERM = ALGORITHM_TERMS["dppo"]
TOKEN_MEAN = PolicyLossConfig(aggregation="token_mean")

# prime-rl case 1: two sequences of 4 tokens, the last token of the second is padding (7 valid tokens)
LP = np.array([[-0.10, -1.50, -0.30, -2.00], [-0.05, -0.70, -3.00, -0.40]], np.float32)
MU = np.array([[-0.60, -1.40, -0.30, -2.50], [-1.30, -0.20, -2.90, -0.45]], np.float32)
ADV = np.array([1.0, -0.5], np.float32)  # one advantage per sequence
MASK = np.array([[1, 1, 1, 1], [1, 1, 1, 0]], np.float32)
# case 2: per-token advantages with zeros (prime-rl adv_tau = 0.5 folded in), asymmetric thresholds
LP2 = np.array([[-0.20, -0.05, -2.30, -0.90], [-1.60, -0.01, -0.50, -4.00]], np.float32)
MU2 = np.array([[-0.90, -0.15, -2.00, -0.40], [-0.35, -1.20, -0.50, -3.50]], np.float32)
ADV2 = np.array([[0.8, 0.0, -1.2, -0.3], [-1.0, 0.6, 0.0, 2.0]], np.float32)
MASK2 = np.array([[1, 1, 1, 1], [1, 1, 0, 1]], np.float32)


def _loss(lp, mu, adv, mask, params, jit=False):
    def f(logp):
        return policy_loss(
            PolicyInputs(logp, logp, None, adv, mask, logp_behaviour=mu),  # π_old is not DPPO's anchor: μ is
            cfg=TOKEN_MEAN,
            kl_coef=0.0,
            entropy_coef=0.0,
            term=TERM,
            term_params=params,
        )

    fn = jax.value_and_grad(f, has_aux=True)
    return (jax.jit(fn) if jit else fn)(jnp.asarray(lp))


@pytest.mark.parametrize("jit", [False, True])
def test_prime_rl_default_loss_case1(jit):
    params = dict(mask_low=0.2, mask_high=0.2, divergence="tv", kl_coef=1e-3)
    (loss, aux), grad = _loss(LP, MU, ADV, MASK, params, jit)
    assert float(loss) == pytest.approx(-0.19337657157, abs=ATOL)
    np.testing.assert_allclose(
        grad,
        [
            [1.428571429e-04, -1.292910597e-01, -1.428571429e-01, -2.353887530e-01],
            [2.496673541e-01, -1.428571429e-04, 6.460267272e-02, 0.0],
        ],
        atol=ATOL,
    )
    # dropped: seq 0 token 0 (A > 0, π − μ = 0.356 > 0.2) and seq 1 token 1 (A < 0, π − μ = −0.322 < −0.2)
    assert float(aux.clip_high_frac) == pytest.approx(1 / 7) and float(aux.clip_low_frac) == pytest.approx(
        1 / 7
    )


def test_without_the_kl_term_prime_rl_and_skyrl_agree_case1b():
    params = dict(mask_low=0.2, mask_high=0.2, divergence="tv", kl_coef=0.0)
    (loss, _), grad = _loss(LP, MU, ADV, MASK, params)
    assert float(loss) == pytest.approx(-0.193709785855, abs=ATOL)
    np.testing.assert_allclose(
        grad,
        [[0.0, -0.129262488, -0.142857143, -0.235531610], [0.249310211, 0.0, 0.064631244, 0.0]],
        atol=ATOL,
    )


def test_prime_rl_per_token_advantages_and_asymmetric_thresholds_case2():
    params = dict(mask_low=0.1, mask_high=0.3, divergence="tv", kl_coef=1e-2)
    (loss, _), grad = _loss(LP2, MU2, 0.5 * ADV2, MASK2, params)
    assert float(loss) == pytest.approx(-0.0173362467577, abs=ATOL)
    np.testing.assert_allclose(
        grad,
        [
            [0.002000000, 0.000285714, 0.062641562, -0.001428571],
            [-0.003571429, 0.003400000, 0.0, -0.088075809],
        ],
        atol=ATOL,
    )


def test_binary_kl_divergence_matches_skyrl_case3():
    params = dict(mask_low=0.05, mask_high=0.05, divergence="kl", kl_coef=0.0)
    (loss, aux), grad = _loss(LP2, MU2, ADV2, MASK2, params)
    assert float(loss) == pytest.approx(-0.0462970649439, abs=ATOL)
    np.testing.assert_allclose(grad, [[0.0, 0.0, 0.126997409, 0.0], [0.0, 0.0, 0.0, -0.173294474]], atol=ATOL)
    # SkyRL's clip_ratio: 4 of the 7 valid tokens dropped (2 on each side)
    assert float(aux.clip_region_frac) == pytest.approx(4 / 7)


def test_the_mask_needs_the_samplers_logprobs():
    with pytest.raises(ValueError, match="logp_behaviour"):
        policy_loss(
            PolicyInputs(jnp.asarray(LP), jnp.asarray(LP), None, ADV, MASK), cfg=TOKEN_MEAN, kl_coef=0.0,
            entropy_coef=0.0, term=TERM,
            term_params=dict(mask_low=0.2, mask_high=0.2, divergence="tv", kl_coef=0.0),
        )  # fmt: skip


# ------------------------------------------------------------------------------------------------------------
# the train step
# ------------------------------------------------------------------------------------------------------------

CFG = tfm.TransformerConfig(vocab_size=16, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=64)
B, G, P, T = 4, 4, 6, 5


def _step_metrics(mu: int) -> dict:
    from grpo_jax.envs import token_task as tt
    from grpo_jax.policies import sampling
    from grpo_jax.types import batch_from_samples

    # thresholds 0.01: this tiny model's token probabilities move by a few percent in three updates
    dppo = DPPOConfig(mask_low=0.01, mask_high=0.01)
    obj = ObjectiveConfig(algorithm="dppo", kl_coef=0.0, num_iterations=mu, adv_method="dr_grpo", dppo=dppo)
    opt = make_optimizer(OptimConfig(learning_rate=5e-2))
    state = init_state(tfm.init_params(CFG, jax.random.PRNGKey(0)), obj, opt, seed=0)
    prompt, pmask = tt.make_prompts(jax.random.PRNGKey(1), B, P, CFG.vocab_size)
    out = sampling.make_sampler(CFG, group=G, max_new=T, eos_id=1, pad_id=0)(
        state.params, prompt, pmask, jax.random.PRNGKey(2), sampling.sampling_params(1.0)
    )
    batch = batch_from_samples(prompt, pmask, out, tt.rewards(prompt, out.tokens, CFG.vocab_size))
    _, m, _ = make_train_step(CFG, obj, opt)(state, batch)
    return {k: float(v) for k, v in m.items()}


def test_train_step_trust_region_acts_on_later_updates():
    """The sampler is π_old here (same parameters): the first update drops nothing and its ratio is 1; by the
    third update at a high learning rate some tokens have left the trust region and are dropped (the
    step's diagnostics combine every update)."""
    one, three = _step_metrics(1), _step_metrics(3)
    assert one["dppo/masked_low"] + one["dppo/masked_high"] == 0.0
    assert one["dppo/mismatch_kl"] < 1e-5 and one["ratio/mean"] == pytest.approx(1.0, abs=1e-5)
    assert three["dppo/masked_low"] + three["dppo/masked_high"] > 0.0
    assert np.isfinite(three["loss"]) and "value/loss" not in three


def test_refused_combinations():
    with pytest.raises(ConfigError, match="objective"):
        ObjectiveConfig(algorithm="dppo", loss=PolicyLossConfig(objective="cispo"))
    with pytest.raises(ConfigError, match="tis_cap"):
        ObjectiveConfig(algorithm="dppo", loss=PolicyLossConfig(tis_cap=2.0))
    with pytest.raises(ConfigError, match="importance_level"):
        ObjectiveConfig(algorithm="dppo", loss=PolicyLossConfig(importance_level="sequence"))
    with pytest.raises(ConfigError, match=r"dppo\.mask_high.*--algorithm=dppo"):
        ObjectiveConfig(algorithm="grpo", dppo=DPPOConfig(mask_high=0.3))
    with pytest.raises(ConfigError, match="divergence"):
        DPPOConfig(divergence="js")
