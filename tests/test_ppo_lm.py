"""PPO for the language model (--algorithm=ppo; docs/GRPO_MATH.md §2): per-token KL-shaped rewards and GAE
with
literal values, the clipped value loss, the train step (critic and policy both learn, the split step equals
the plain one, GRPO untouched), the refused combinations, and the main job end to end with a resume."""

import dataclasses
import json
import math
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl import flags

from grpo_jax import cli
from grpo_jax.config import ObjectiveConfig, OptimConfig, PPOConfig
from grpo_jax.core.advantages import compute_advantages
from grpo_jax.core.metrics import explained_variance
from grpo_jax.core.value import clipped_value_loss, ppo_token_advantages
from grpo_jax.envs import token_task as tt
from grpo_jax.policies import transformer as tfm
from grpo_jax.pretrained.api import load_pretrained
from grpo_jax.train.state import init_state, make_optimizer
from grpo_jax.train.step import make_train_step
from grpo_jax.types import SampleOutput, batch_from_samples

ROOT = Path(__file__).resolve().parents[1]

# two sequences of T = 4 with padded tails (mask [1,1,1,0] and [1,1,0,0]); garbage at the padding
MASK = jnp.array([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
SCORES = jnp.array([1.0, 0.0])
LOGP_OLD = jnp.array([[-1.0, -0.5, -2.0, -7.0], [-0.3, -0.4, -9.0, -9.0]])
LOGP_REF = jnp.array([[-1.2, -0.5, -1.5, -3.0], [-0.3, -0.2, -1.0, -1.0]])
V_OLD = jnp.array([[0.5, 0.6, 0.7, 9.0], [0.1, -0.2, 4.0, 4.0]])


def test_kl_shaped_rewards_and_gae_over_tokens_literal():
    """By hand, β = 0.05, k1, γ = 0.9, λ = 0.8 (γλ = 0.72), V after the last valid token = 0:
    seq 0: k = [0.2, 0, −0.5] -> r = [−0.01, 0, 0.025 + 1]; δ = [−0.01 + 0.9·0.6 − 0.5, 0.9·0.7 − 0.6,
           1.025 − 0.7] = [0.03, 0.03, 0.325]; Â_2 = 0.325, Â_1 = 0.03 + 0.72·0.325 = 0.264,
           Â_0 = 0.03 + 0.72·0.264 = 0.22008; R̂ = Â + V = [0.72008, 0.864, 1.025].
    seq 1: k = [0, −0.2] -> r = [0, 0.01 + 0]; δ = [0.9·(−0.2) − 0.1, 0.01 + 0.2] = [−0.28, 0.21];
           Â = [−0.28 + 0.72·0.21, 0.21] = [−0.1288, 0.21]; R̂ = [−0.0288, 0.01]."""
    kw = dict(logp_old=LOGP_OLD, logp_ref=LOGP_REF, kl_coef=0.05, kl_kind="k1", gamma=0.9, lam=0.8)
    t = jax.jit(lambda s, v, m: ppo_token_advantages(s, v, m, whiten_advantages=False, **kw))(
        SCORES, V_OLD, MASK
    )
    np.testing.assert_allclose(t.rewards, [[-0.01, 0, 1.025, 0], [0, 0.01, 0, 0]], atol=1e-6)
    adv = np.array([[0.22008, 0.264, 0.325, 0.0], [-0.1288, 0.21, 0.0, 0.0]])
    np.testing.assert_allclose(t.adv, adv, atol=1e-6)
    np.testing.assert_allclose(t.returns, [[0.72008, 0.864, 1.025, 0], [-0.0288, 0.01, 0, 0]], atol=1e-6)
    # whitened over the 5 valid tokens of the batch (mean, Bessel variance, eps 1e-8; TRL masked_whiten),
    # 0 at the padding; the returns keep the un-whitened advantages
    w = ppo_token_advantages(SCORES, V_OLD, MASK, whiten_advantages=True, **kw)
    valid = adv[np.asarray(MASK) > 0]
    want = np.where(np.asarray(MASK) > 0, (adv - valid.mean()) / np.sqrt(valid.var(ddof=1) + 1e-8), 0.0)
    np.testing.assert_allclose(w.adv, want, atol=1e-5)
    np.testing.assert_allclose(w.returns, t.returns, atol=0)
    # no reference model: only the score, at the last valid token
    s = ppo_token_advantages(SCORES, V_OLD, MASK, gamma=0.9, lam=0.8, whiten_advantages=False)
    np.testing.assert_allclose(s.rewards, [[0, 0, 1, 0], [0, 0, 0, 0]], atol=0)


def test_clipped_value_loss_literal():
    """V_old 0.5, ε_v 0.2, R̂ = [1, 1, 0]: V 0.9 -> max(0.01, (0.7 − 1)² = 0.09); V 0.55 inside the range
    -> 0.2025 both; V 0.1 -> max(0.01, (0.3 − 0)² = 0.09). L = 0.5·(0.09 + 0.2025 + 0.09)/3 = 0.06375; the
    clipped error is the larger on 2 of 3 tokens; gradient only where unclipped: 0.5·2·(0.55 − 1)/3."""
    v = jnp.array([[0.9, 0.55, 0.1, 5.0]])
    v_old, ret = jnp.array([[0.5, 0.5, 0.5, 0.0]]), jnp.array([[1.0, 1.0, 0.0, 0.0]])
    m = jnp.array([[1.0, 1.0, 1.0, 0.0]])
    fn = jax.jit(lambda v: clipped_value_loss(v, v_old, ret, m, eps_v=0.2))
    loss, frac = fn(v)
    assert float(loss) == pytest.approx(0.06375, abs=1e-7)
    assert float(frac) == pytest.approx(2 / 3, abs=1e-7)
    g = jax.grad(lambda v: fn(v)[0])(v)
    np.testing.assert_allclose(g, [[0.0, -0.15, 0.0, 0.0]], atol=1e-7)
    # a micro-batch normalised by its whole batch's token count (6 tokens)
    part = clipped_value_loss(v, v_old, ret, m, eps_v=0.2, num_items=6.0)[0]
    assert float(part) == pytest.approx(0.5 * 0.3825 / 6, abs=1e-7)
    # the logged explained variance: target [1, 2, 3], V [1, 2, 2] -> 1 − Var([0, 0, 1]) / Var([1, 2, 3])
    # = 1 − (2/9) / (2/3) = 2/3; a target without variance gives 0 (not NaN)
    ev = explained_variance(jnp.array([1.0, 2.0, 2.0, 7.0]), jnp.array([1.0, 2.0, 3.0, 0.0]), m[0])
    assert float(ev) == pytest.approx(2 / 3, abs=1e-6)
    assert float(explained_variance(jnp.ones(4), jnp.full(4, 0.5), m[0])) == 0.0


# ------------------------------------------------------------------------------------------------------------
# the train step
# ------------------------------------------------------------------------------------------------------------

CFG = tfm.TransformerConfig(
    vocab_size=16,
    d_model=32,
    n_layers=1,
    n_heads=4,
    n_kv_heads=2,
    d_ff=64,
    tie_embeddings=False,
    value_head=True,
)
B, G, P, T = 4, 4, 6, 5


def _batch(seed=0):
    """A synthetic rollout batch (the train step only reads it): random completions of random lengths (EOS
    or truncated), 0/1 rewards with at least one success."""
    rng = np.random.default_rng(seed)
    prompt, pmask = tt.make_prompts(jax.random.PRNGKey(seed), B, P, CFG.vocab_size)
    lengths = rng.integers(1, T + 1, size=(B, G))
    mask = (np.arange(T) < lengths[..., None]).astype(np.float32)
    tokens = np.where(mask > 0, rng.integers(2, CFG.vocab_size, size=(B, G, T)), 0).astype(np.int32)
    out = SampleOutput(
        tokens=jnp.asarray(tokens),
        logp=jnp.zeros((B, G, T)),
        mask=jnp.asarray(mask),
        lengths=jnp.asarray(lengths, jnp.int32),
        truncated=jnp.asarray(lengths == T),
    )
    rewards = (rng.random((B, G)) < 0.3).astype(np.float32)
    rewards[0, 0] = 1.0
    return batch_from_samples(prompt, pmask, out, jnp.asarray(rewards))


def _steps(obj, n=2, micro=1, values=True):
    """[(params, metrics, outputs)] after each of n train steps on the synthetic batches (host arrays)."""
    opt = make_optimizer(OptimConfig(learning_rate=1e-2))
    state = init_state(tfm.init_params(CFG, jax.random.PRNGKey(0)), obj, opt)
    model = CFG if values else dataclasses.replace(CFG, value_head=False)
    step = make_train_step(model, obj, opt, micro_batches=micro)
    out = []
    for i in range(n):
        state, m, o = step(state, _batch(i))
        out.append(jax.device_get((state.params, m, o)))
    return out


PPO = ObjectiveConfig(algorithm="ppo", kl_coef=0.05, ppo=PPOConfig(gamma=0.9, lam=0.8))
CRITIC = ("value/loss", "value/clip_frac", "value/mean", "value/explained_variance", "reward/kl_penalty")


def test_ppo_step_trains_critic_and_policy_and_the_split_step_agrees():
    p0 = tfm.init_params(CFG, jax.random.PRNGKey(0))
    [(p1, m1, o1), (p2, m2, _)] = _steps(PPO)
    for k in (*CRITIC, "loss", "loss/policy", "kl", "Training/AdvantageNorm", "value/return_mean"):
        assert np.isfinite(m1[k]) and np.isfinite(m2[k]), k
    # step 1: the zero-initialised head gives V_old = 0 (the targets are the plain GAE returns); it learns
    assert m1["value/mean"] == 0.0 and m1["value/loss"] > 0 and m1["coef/kl"] == pytest.approx(0.05)
    assert np.all(p1["value_head"]["kernel"] != 0) and m2["value/mean"] != 0.0
    assert m1["ratio/mean"] == pytest.approx(1.0, abs=1e-6)  # on-policy first iteration
    # ... and so does the policy (shared trunk: the layers, the embedding and the LM head)
    for name in ("embed", "lm_head"):
        assert not np.array_equal(p1[name], p0[name]), name
    assert not np.array_equal(p1["layers"]["q_proj"]["kernel"], p0["layers"]["q_proj"]["kernel"])
    assert m2["reward/kl_penalty"] != 0.0  # π_θ left π_ref: the KL-shaped rewards are on
    # step 1 by hand: V_old = 0 and π_old = π_ref (k1 = 0), so Â_t = (γλ)^(L−1−t)·R for a completion of L
    # tokens with reward R, R̂ = Â, then Â whitened over the batch's valid tokens; NaN at the padding
    b0 = _batch(0)
    mask, lengths = np.asarray(b0.completion_mask), np.asarray(b0.completion_mask.sum(-1))
    raw = (0.9 * 0.8) ** (lengths[..., None] - 1 - np.arange(T)) * np.asarray(b0.rewards)[..., None] * mask
    want = (raw - raw[mask > 0].mean()) / np.sqrt(raw[mask > 0].var(ddof=1) + 1e-8)
    adv = o1["advantages"]
    assert adv.shape == (B, G, T) and np.isnan(adv[mask == 0]).all()
    np.testing.assert_allclose(adv[mask > 0], want[mask > 0], atol=1e-5)
    assert m1["value/loss"] == pytest.approx(0.5 * np.mean(raw[mask > 0] ** 2), rel=1e-5)
    # the split step (a no-gradient pre-pass gives π_old and V_old; 2 micro-batches) makes the same updates
    # (step 2: with a trained critic, V_old != 0)
    # (Adam divides each gradient component by its own scale, so the float rounding of near-zero components
    # moves a parameter by up to ~lr: on some CPUs one of the 2048 entries differs by 1.1e-5 after two steps)
    for (q, s, _), (p, m) in zip(_steps(PPO, micro=2), ((p1, m1), (p2, m2)), strict=True):
        for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(q), strict=True):
            np.testing.assert_allclose(a, b, atol=5e-5)
        for k in (*CRITIC, "loss", "loss/policy"):
            assert s[k] == pytest.approx(m[k], abs=1e-5), k


def test_grpo_is_untouched_by_the_critic():
    """algorithm=grpo with the same model: group z-score advantages, no critic metrics, and no gradient
    reaches the value head (it stays exactly zero) while the policy trains."""
    [(p1, m, o)] = _steps(ObjectiveConfig(kl_coef=0.05), n=1, values=False)
    np.testing.assert_array_equal(p1["value_head"]["kernel"], 0.0)
    np.testing.assert_array_equal(p1["value_head"]["bias"], 0.0)
    assert not np.array_equal(p1["embed"], tfm.init_params(CFG, jax.random.PRNGKey(0))["embed"])
    group = compute_advantages(_batch(0).rewards, method="grpo", ddof=1, eps=1e-4)
    assert o["advantages"].shape == (B, G) and "values" not in o
    np.testing.assert_allclose(o["advantages"], group, atol=1e-6)
    assert not any(k.startswith("value/") for k in m)


def test_ppo_step_needs_a_value_head():
    with pytest.raises(ValueError, match="algorithm=ppo needs the critic's values"):
        _steps(PPO, n=1, values=False)


# ------------------------------------------------------------------------------------------------------------
# the configuration
# ------------------------------------------------------------------------------------------------------------


def _resolve(*args):
    fv = flags.FlagValues()
    cli.define_flags(fv)
    argv = ["prog", "--workdir=/tmp/never", *args]
    fv(argv)
    return cli.config_from_flags(fv, fv.read_flags_from_files(argv[1:], force_gnu=False))[0]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--adv_method=rloo"], "--adv_method=rloo: with --algorithm=ppo the advantages are GAE"),
        (["--baseline=pool", "--pool_capacity=2"], "--baseline=pool: with --algorithm=ppo the advantages"),
        (["--multiscale_w_tests=0.5"], "--multiscale_w_tests=0.5: with --algorithm=ppo the advantages"),
        (["--kl_anchor=old", "--num_iterations=2"], "--kl_anchor=old: with --algorithm=ppo the KL is a"),
        (["--importance_level=sequence"], "--importance_level=sequence: with --algorithm=ppo every token"),
        (["--lora_rank=2"], "--lora_rank=2: --algorithm=ppo trains a value head on the policy"),
        (["--dynamic_sampling"], "--dynamic_sampling=true: DAPO's filter drops groups whose rewards"),
        (["--ppo_gamma=1.5"], "--ppo_gamma=1.5: must be in [0, 1]"),
        (["--ppo_cliprange_value=0"], "--ppo_cliprange_value=0.0: must be > 0"),
    ],
)
def test_refused_ppo_combinations_name_the_flag(args, message):
    with pytest.raises(cli.FlagError) as e:
        _resolve("--algorithm=ppo", *args)
    assert str(e.value).startswith(message), str(e.value)


def test_ppo_flags_without_ppo_and_the_flagfile():
    with pytest.raises(cli.FlagError, match=r"^--ppo_lam=0.5: only used with --algorithm=ppo"):
        _resolve("--ppo_lam=0.5")
    with pytest.raises(cli.FlagError, match=r"^--algorithm=a2c: valid: grpo, ppo"):
        _resolve("--algorithm=a2c")
    cfg = _resolve(f"--flagfile={ROOT / 'experiments/flagfiles/ppo.flags'}")
    quick = _resolve(f"--flagfile={ROOT / 'experiments/flagfiles/quickstart.flags'}")
    assert cfg.objective.algorithm == "ppo" and cfg.objective.loss.aggregation == "token_mean"
    ppo = cfg.objective.ppo
    assert (ppo.gamma, ppo.lam, ppo.vf_coef, ppo.cliprange_value, ppo.whiten_advantages) == (
        1,
        0.95,
        0.1,
        0.2,
        True,
    )
    # compute-matched: the same completions per step as the quickstart's GRPO
    assert cfg.rollout == quick.rollout and cfg.model == quick.model and cfg.steps == quick.steps
    # mini-batches and gradient accumulation are supported (the split step)
    assert _resolve("--algorithm=ppo", "--mini_batches=2", "--micro_batches=2").objective.mini_batches == 2


# ------------------------------------------------------------------------------------------------------------
# the main job end to end
# ------------------------------------------------------------------------------------------------------------


def test_main_job_with_ppo_logs_the_critic_and_resumes(tmp_path):
    """A 3-step PPO run of the main job logs finite critic metrics every step; with its step-3 checkpoint
    removed (as if killed during step 3) the same command resumes from step 2 and ends bit-identical; the
    Hugging Face export holds the policy without the value head. It starts from a GRPO run's warm start
    (--steps=0, no value head there), as the sweep's PPO arms do: the policy is taken, the critic added."""
    import mainjob

    eval_args = ("--eval_samples=0", "--eval_ks=")  # greedy pass@1 only: evaluation is not under test here
    warm, wd = tmp_path / "warm", tmp_path / "run"
    args = ("--algorithm=ppo", "--kl_coef=0.05", "--checkpoint_every=1", "--steps=3", *eval_args)
    args += (f"--sft_from={warm}",)
    with mainjob.executor() as ex:
        mainjob.run(mainjob.TINY, "--steps=0", *eval_args, workdir=warm, executor=ex)
        first, out = mainjob.run(mainjob.TINY, *args, workdir=wd, executor=ex)
        assert "PPO: the critic is a value head on the policy's trunk (33 parameters" in out
        assert f"warm start: the post-SFT parameters of {warm}" in out
        # the same post-SFT policy as the GRPO warm start: its greedy held-out evaluation is the same
        same = lambda ev: {k: v for k, v in ev.items() if k != "seconds"}  # noqa: E731
        assert same(first["sft"]) == same(json.loads((warm / "results.json").read_text())["sft"])
        shutil.rmtree(wd / "checkpoints" / "3")
        (wd / "results.json").unlink()
        resumed, out = mainjob.run(mainjob.TINY, *args, "--export_hf", workdir=wd, executor=ex)
    assert f"resumed from {wd / 'checkpoints'} at GRPO step 2" in out
    assert resumed["final_params_sha256"] == first["final_params_sha256"]
    train = mainjob.metrics(wd)
    assert sorted(train) == [1, 2, 3]  # each step once across the resume
    for x in train.values():
        for k in (*CRITIC, "time/train_s"):
            assert math.isfinite(x[k]), (x["step"], k)
    assert train[1]["value/mean"] == 0.0 and train[3]["value/mean"] != 0.0  # the critic trained
    export_cfg, export_params = load_pretrained(str(wd / "hf"))
    assert not export_cfg.value_head and "value_head" not in export_params
