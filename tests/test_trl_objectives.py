"""Every TRL 1.16 objective and option through `policy_loss` / `multi_reward_advantages`, against an oracle.

The oracle below is written from TRL 1.16's documented objective (grpo_trainer.py `_compute_loss`,
`get_off_policy_mask`, `get_gamma_weights`, `get_high_entropy_mask`, the vLLM IS correction of
`_generate_and_score_completions`; grpo_config.py), in float64 torch with autograd — our own code, not TRL's.
Each case maps TRL's arguments to the public PolicyLossConfig (`trl_config`) and compares the loss and its
gradients with respect to the log-probs and the entropies (float32 computation on our side, 1e-6 absolute +
1e-5 relative). Literal vectors pin the new objectives by hand, and padding carries garbage on our side.
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.algorithms.policy_loss import PolicyInputs, policy_loss
from grpo_jax.config import PolicyLossConfig
from grpo_jax.core.advantages import multi_reward_advantages
from grpo_jax.core.metrics import masked_quantile
from grpo_jax.core.surrogates import vespo_weights

torch = pytest.importorskip("torch")
torch.set_default_dtype(torch.float64)

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo", "cispo", "sapo", "vespo")
MAX_LEN = 7


# ------------------------------------------------------------------------------------------------------------
# the oracle (TRL 1.16 semantics, float64)
# ------------------------------------------------------------------------------------------------------------
def oracle(x: dict, o: dict):
    lp = torch.tensor(x["lp"], requires_grad=True)
    ent = torch.tensor(x["ent"], requires_grad=True)
    old, ref, samp = (torch.tensor(x[k]) for k in ("old", "ref", "samp"))
    mask = torch.tensor(x["mask"])
    adv = torch.tensor(x["adv"])[:, None]
    loss_type, level = o["loss_type"], o["level"]
    eps_low, eps_high = o["eps_low"], o["eps_high"]

    is_ratio = None
    if o["is_mode"] is not None:  # vLLM IS correction: exp(old − sampler), per token or summed per sequence
        diff = torch.nan_to_num((old - samp) * mask, nan=0.0)
        if o["is_mode"].startswith("sequence"):
            diff = diff.sum(-1, keepdim=True)
        is_ratio = torch.exp(diff)
        lo = -math.inf if o["is_min"] is None else o["is_min"]
        hi = math.inf if o["is_max"] is None else o["is_max"]
        if o["is_mode"].endswith("truncate"):
            is_ratio = is_ratio.clamp(min=o["is_min"], max=o["is_max"])
        else:
            is_ratio = torch.where((is_ratio < lo) | (is_ratio > hi), torch.zeros_like(is_ratio), is_ratio)

    ent_mask = None
    if o["top_q"] < 1.0:
        valid = ent.detach()[mask.bool()]
        thr = torch.quantile(valid, 1 - o["top_q"])
        ent_mask = ((ent.detach() * mask) >= thr) & mask.bool()

    off_mask = None
    if o["opm"] is not None:
        s = samp if o["is_mode"] is not None else old
        kl = torch.nan_to_num(s - lp.detach(), nan=0.0)
        avg = (kl * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1.0)
        off_mask = ((adv >= 0) | (avg <= o["opm"])).to(mask.dtype)

    log_ratio = lp - old
    if level == "token":
        log_w = log_ratio
    else:
        log_w = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0))[:, None]
    coef_1 = torch.exp(log_w)

    if o["beta"] != 0.0:
        kl = torch.exp(ref - lp) - (ref - lp) - 1
        if o["bias_kl"]:
            kl = kl * coef_1

    if loss_type == "cispo":
        ptl = -torch.clamp(coef_1, max=eps_high).detach() * adv * lp
    elif loss_type == "sapo":
        t = torch.where(adv > 0, torch.tensor(o["sapo_pos"]), torch.tensor(o["sapo_neg"]))
        ptl = -torch.sigmoid(t * (coef_1 - 1)) * 4 / t * adv
    elif loss_type == "vespo":
        with torch.no_grad():
            lower = math.log(1e-8)
            seq = (torch.clamp(log_ratio, -20.0, 20.0) * mask).sum(-1, keepdim=True)
            if is_ratio is not None:
                seq = seq + torch.clamp(torch.log(is_ratio), lower, 20.0).sum(-1, keepdim=True)
            log_w_seq = torch.clamp(seq, lower, 20.0)
            pos = adv >= 0
            k = torch.where(pos, torch.tensor(o["vk_pos"]), torch.tensor(o["vk_neg"]))
            lam = torch.where(pos, torch.tensor(o["vl_pos"]), torch.tensor(o["vl_neg"])).clamp(min=1e-4)
            phi = torch.exp(lam + k * log_w_seq - lam * torch.exp(log_w_seq))
            phi = phi.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
        ptl = -phi * adv * lp
    else:
        coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
        c1 = coef_1 if o["delta"] is None else torch.clamp(coef_1, max=o["delta"])
        ptl = -torch.min(c1 * adv, coef_2 * adv)
    if off_mask is not None:
        ptl = ptl * off_mask
    if ent_mask is not None:
        ptl = ptl * ent_mask
    if is_ratio is not None and loss_type != "vespo":
        ptl = ptl * is_ratio
    if o["beta"] != 0.0:
        ptl = ptl + o["beta"] * kl
    if ptl.shape[1] == 1:
        ptl = ptl.expand_as(mask)

    n_items = o["num_items"] if o["num_items"] is not None else mask.sum()
    if loss_type in ("grpo", "sapo"):
        loss = ((ptl * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif loss_type == "bnpo":
        loss = (ptl * mask).sum() / mask.sum().clamp(min=1.0)
    elif loss_type == "dr_grpo":
        loss = (ptl * mask).sum() / (ptl.size(0) * MAX_LEN)
    elif loss_type in ("cispo", "dapo", "vespo"):
        loss = (ptl * mask).sum() / torch.as_tensor(n_items, dtype=torch.float64).clamp(min=1.0)
    else:  # luspo
        loss = (ptl * mask).sum(-1).mean()
    if o["ent_coef"]:
        eff = mask if ent_mask is None else mask * ent_mask
        loss = loss - o["ent_coef"] * (ent * eff).sum() / eff.sum().clamp(min=1.0)
    loss.backward()
    g_ent = np.zeros_like(x["ent"]) if ent.grad is None else ent.grad.numpy()
    return float(loss.detach()), lp.grad.numpy(), g_ent


# ------------------------------------------------------------------------------------------------------------
# TRL arguments -> the public config
# ------------------------------------------------------------------------------------------------------------
def trl_config(o: dict) -> tuple[PolicyLossConfig, dict]:
    lt = o["loss_type"]
    objective = lt if lt in ("cispo", "sapo", "vespo") else "clip"
    aggregation = {
        "grpo": "seq_mean_token_mean",
        "sapo": "seq_mean_token_mean",
        "bnpo": "token_mean",
        "dapo": "token_mean",
        "cispo": "token_mean",
        "vespo": "token_mean",
        "dr_grpo": "constant",
        "luspo": "seq_sum_mean",
    }[lt]
    tis = {}
    if o["is_mode"] is not None:
        level, mode = o["is_mode"].split("_")
        tis = dict(tis_level=level, tis_mode=mode, tis_min=o["is_min"], tis_cap=o["is_max"])
    cfg = PolicyLossConfig(
        objective=objective,
        aggregation=aggregation,
        max_len=MAX_LEN,
        eps_low=o["eps_low"],
        eps_high=o["eps_high"],
        delta=o["delta"],
        importance_level=o["level"],
        kl_bias_correction=o["bias_kl"],
        top_entropy_quantile=o["top_q"],
        off_policy_mask_threshold=o["opm"],
        entropy_bonus="token_mean",
        sapo_temp_pos=o["sapo_pos"],
        sapo_temp_neg=o["sapo_neg"],
        vespo_k_pos=o["vk_pos"],
        vespo_lambda_pos=o["vl_pos"],
        vespo_k_neg=o["vk_neg"],
        vespo_lambda_neg=o["vl_neg"],
        **tis,
    )
    call = dict(kl_coef=o["beta"], entropy_coef=o["ent_coef"])
    if lt in ("dapo", "cispo", "vespo") and o["num_items"] is not None:
        call["num_items"] = o["num_items"]
    return cfg, call


def ours(x: dict, o: dict):
    cfg, call = trl_config(o)
    m = jnp.asarray(x["mask"], jnp.float32)

    def garbage(v):  # our padding carries NaN: it must not matter
        return jnp.where(m > 0, jnp.asarray(v, jnp.float32), jnp.nan)

    beh = garbage(x["samp"]) if (o["is_mode"] is not None) else None

    def f(lp, ent):
        loss, _ = policy_loss(
            PolicyInputs(
                lp,
                garbage(x["old"]),
                garbage(x["ref"]) if o["beta"] else None,
                jnp.asarray(x["adv"], jnp.float32),
                m,
                entropy=ent,
                logp_behaviour=beh,
            ),
            cfg=cfg,
            **call,
        )
        return loss

    lp, ent = garbage(x["lp"]), garbage(x["ent"])
    val, (g_lp, g_ent) = jax.value_and_grad(f, argnums=(0, 1))(lp, ent)
    return float(val), np.asarray(g_lp) * x["mask"], np.asarray(g_ent) * x["mask"]


def make_inputs(seed: int, b: int = 4, t: int = 6) -> dict:
    rng = np.random.default_rng(seed)
    lp = rng.normal(-1.5, 0.6, (b, t))
    mask = (rng.random((b, t)) < 0.8).astype(np.float64)
    mask[:, 0] = 1.0
    mask[-1, 3:] = 0.0
    return {
        "lp": lp,
        "old": lp + rng.normal(0, 0.25, (b, t)),
        "ref": lp + rng.normal(0, 0.3, (b, t)),
        "samp": lp + rng.normal(0, 0.3, (b, t)),
        "ent": rng.uniform(0.1, 2.5, (b, t)),
        "mask": mask,
        "adv": rng.normal(0, 1, (b,)),
    }


BASE = dict(
    loss_type="dapo",
    level="token",
    eps_low=0.2,
    eps_high=0.28,
    delta=None,
    beta=0.0,
    bias_kl=True,
    top_q=1.0,
    opm=None,
    is_mode=None,
    is_min=None,
    is_max=3.0,
    ent_coef=0.0,
    sapo_pos=1.0,
    sapo_neg=1.05,
    vk_pos=2.0,
    vl_pos=3.0,
    vk_neg=3.0,
    vl_neg=2.0,
    num_items=None,
)


def _cases():
    cases = []
    for lt, level, beta in itertools.product(LOSS_TYPES, ("token", "sequence"), (0.0, 0.04)):
        if lt == "vespo" and level == "sequence":
            continue  # TRL: VESPO computes its own sequence weight; importance_sampling_level stays "token"
        cases.append(
            dict(BASE, loss_type=lt, level=level, beta=beta, eps_high=5.0 if lt == "cispo" else 0.28)
        )
    for lt in LOSS_TYPES:
        cases.append(
            dict(BASE, loss_type=lt, top_q=0.4, ent_coef=0.01, eps_high=5.0 if lt == "cispo" else 0.2)
        )
        cases.append(dict(BASE, loss_type=lt, opm=0.05, beta=0.02, bias_kl=False))
        modes = ("token_truncate", "token_mask") if lt == "vespo" else ("token_truncate", "sequence_mask")
        for mode in modes:
            cases.append(dict(BASE, loss_type=lt, is_mode=mode, is_min=0.5, is_max=1.5, opm=0.1))
    cases.append(dict(BASE, loss_type="grpo", delta=1.3, eps_high=0.2, beta=0.04))
    cases.append(dict(BASE, loss_type="dapo", num_items=37.0, beta=0.04, level="sequence"))
    cases.append(dict(BASE, loss_type="cispo", num_items=50.0, eps_high=1.1))
    cases.append(dict(BASE, loss_type="sapo", sapo_pos=0.7, sapo_neg=2.0, level="sequence"))
    cases.append(
        dict(BASE, loss_type="vespo", vk_pos=1.5, vl_pos=0.5, vk_neg=4.0, vl_neg=1.0, num_items=21.0)
    )
    cases.append(dict(BASE, loss_type="bnpo", is_mode="sequence_truncate", is_min=0.8, is_max=None))
    return cases


CASES = _cases()


@pytest.mark.parametrize("o", CASES, ids=[f"{i}-{c['loss_type']}-{c['level']}" for i, c in enumerate(CASES)])
def test_loss_and_gradients_equal_the_trl_oracle(o):
    for seed in (0, 1):
        x = make_inputs(seed + 7 * len(o["loss_type"]))
        want, g_lp, g_ent = oracle(x, o)
        got, h_lp, h_ent = ours(x, o)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(h_lp, g_lp, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(h_ent, g_ent, rtol=1e-5, atol=1e-6)


def test_every_loss_type_is_covered():
    assert {c["loss_type"] for c in CASES} == set(LOSS_TYPES) and len(CASES) >= 50


# ------------------------------------------------------------------------------------------------------------
# literal vectors (hand-derived)
# ------------------------------------------------------------------------------------------------------------
ONE = dict(kl_coef=0.0, entropy_coef=0.0)


def _one(cfg, lp, old, adv, mask=None, **kw):
    lp, old = jnp.asarray(lp, jnp.float32), jnp.asarray(old, jnp.float32)
    m = jnp.ones_like(lp) if mask is None else jnp.asarray(mask, jnp.float32)
    return policy_loss(
        PolicyInputs(lp, old, None, jnp.asarray(adv, jnp.float32), m), cfg=cfg, **{**ONE, **kw}
    )


def test_cispo_literal():
    # one token: ρ = e^0.5 = 1.6487 capped at ε_high = 1.2; loss = −1.2·A·logp = −1.2·2·(−1) = 2.4
    cfg = PolicyLossConfig(objective="cispo", eps_high=1.2, aggregation="token_mean")
    loss, aux = _one(cfg, [[-1.0]], [[-1.5]], [2.0])
    np.testing.assert_allclose(loss, 2.4, rtol=1e-6)
    g = jax.grad(lambda lp: _one(cfg, lp, [[-1.5]], [2.0])[0])(jnp.asarray([[-1.0]]))
    np.testing.assert_allclose(g, [[-2.4]], rtol=1e-6)  # d/dlogp of −sg(1.2)·2·logp
    assert float(aux.clip_high_frac) == 1.0  # the cap bound (A > 0)


def test_sapo_literal():
    # ρ = 1 (on-policy): σ(0)·4/τ = 2/τ; A = 1 -> τ+ = 1: loss −2; A = −1 -> τ− = 1.05: loss +2/1.05
    cfg = PolicyLossConfig(objective="sapo")
    np.testing.assert_allclose(_one(cfg, [[-1.0]], [[-1.0]], [1.0])[0], -2.0, rtol=1e-6)
    np.testing.assert_allclose(_one(cfg, [[-1.0]], [[-1.0]], [-1.0])[0], 2.0 / 1.05, rtol=1e-6)
    # gradient at ρ = 1: −A·4/τ·σ'(0)·τ·ρ = −A (σ'(0) = 1/4), whatever τ
    g = jax.grad(lambda lp: _one(cfg, lp, [[-1.0]], [-1.0])[0])(jnp.asarray([[-1.0]]))
    np.testing.assert_allclose(g, [[1.0]], rtol=1e-6)


def test_luspo_and_vespo_literals():
    # LUSPO: per-sequence sums, mean over sequences; on-policy clip loss = −A per token
    cfg = PolicyLossConfig(aggregation="seq_sum_mean")
    loss, _ = _one(
        cfg, [[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]], [[-1.0] * 3] * 2, [1.0, 2.0], [[1, 1, 0], [1, 1, 1]]
    )
    np.testing.assert_allclose(loss, (-2.0 - 6.0) / 2, rtol=1e-6)
    # VESPO φ(1) = 1 exactly; w = e^{log w}: log w = 0.5 -> φ = exp(3 + 2·0.5 − 3·e^0.5) for A ≥ 0
    phi = vespo_weights(
        jnp.asarray([[1.0], [-1.0]]), jnp.asarray([[0.25, 0.25], [0.0, 0.0]]), jnp.ones((2, 2))
    )
    np.testing.assert_allclose(phi[:, 0], [math.exp(3 + 2 * 0.5 - 3 * math.exp(0.5)), 1.0], rtol=1e-6)


def test_off_policy_mask_and_top_entropy_literals():
    # sequence 0: A < 0 and mean(sampler − current) = 0.5 > δ = 0.3: dropped; sequence 1: A > 0: kept
    cfg = PolicyLossConfig(off_policy_mask_threshold=0.3, aggregation="token_mean")
    lp = jnp.asarray([[-1.0, -1.0], [-1.0, -1.0]])
    loss, aux = policy_loss(
        PolicyInputs(lp, lp, None, jnp.asarray([-1.0, 1.0]), jnp.ones((2, 2)), logp_behaviour=lp + 0.5),
        cfg=cfg,
        **ONE,
    )
    np.testing.assert_allclose(loss, -2.0 / 4, rtol=1e-6)  # only sequence 1's two tokens (−1 each) of 4
    assert float(aux.off_policy_kept) == 0.5
    # top 50 % of 4 valid entropies [0.1, 0.4, 0.3, 0.2]: threshold = quantile(0.5) = 0.25 -> keep 0.4, 0.3
    assert float(
        masked_quantile(jnp.asarray([0.1, 0.4, 0.3, 0.2, 9.0]), jnp.asarray([1, 1, 1, 1, 0]), 0.5)
    ) == (pytest.approx(0.25))
    cfg = PolicyLossConfig(top_entropy_quantile=0.5, aggregation="token_mean")
    ent = jnp.asarray([[0.1, 0.4], [0.3, 0.2]])
    loss, aux = policy_loss(
        PolicyInputs(lp, lp, None, jnp.asarray([1.0, 1.0]), jnp.ones((2, 2)), entropy=ent), cfg=cfg, **ONE
    )
    np.testing.assert_allclose(loss, -2.0 / 4, rtol=1e-6)
    assert float(aux.entropy_kept) == 0.5


def test_sequence_level_kl_bias_correction_and_metrics():
    # the KL is weighted by the SEQUENCE ratio s_i at importance_level="sequence" (TRL's coef_1 is B x 1)
    lp = jnp.asarray([[-1.0, -2.0]])
    old = jnp.asarray([[-1.2, -1.8]])  # log ratios 0.2, −0.2: s = 1, token ratios e^±0.2
    ref = jnp.asarray([[-1.1, -2.1]])
    k3 = [math.exp(-0.1) + 0.1 - 1, math.exp(-0.1) + 0.1 - 1]
    for level, w in (("sequence", [1.0, 1.0]), ("token", [math.exp(0.2), math.exp(-0.2)])):
        cfg = PolicyLossConfig(importance_level=level, kl_bias_correction=True, aggregation="token_mean")
        _, aux = policy_loss(
            PolicyInputs(lp, old, ref, jnp.asarray([0.0]), jnp.ones((1, 2))),
            cfg=cfg,
            kl_coef=1.0,
            entropy_coef=0.0,
        )
        np.testing.assert_allclose(aux.kl, (k3[0] * w[0] + k3[1] * w[1]) / 2, rtol=1e-5)
    # sequence-level clip metrics are plain means over sequences: 1 clipped sequence (length 1) of 4 -> 0.25
    lp = jnp.asarray([[0.0, 0, 0], [0, 0, 0], [0, 0, 0], [1.0, 0, 0]])
    mask = jnp.asarray([[1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 0, 0]], jnp.float32)
    cfg = PolicyLossConfig(importance_level="sequence")
    _, aux = policy_loss(PolicyInputs(lp, jnp.zeros_like(lp), None, jnp.ones(4), mask), cfg=cfg, **ONE)
    assert (
        float(aux.clip_high_frac) == 0.25
        and float(aux.clip_high_max) == 1.0
        and float(aux.clip_low_min) == 0.0
    )


def test_new_objectives_jit_equals_no_jit():
    x = make_inputs(3)
    for lt in ("cispo", "sapo", "vespo", "luspo"):
        cfg, call = trl_config(
            dict(BASE, loss_type=lt, top_q=0.5, opm=0.1, is_mode="token_truncate", is_min=0.5)
        )
        args = [jnp.asarray(x[k], jnp.float32) for k in ("lp", "old", "ref", "adv", "mask")]

        def f(lp, old, ref, adv, mask, cfg=cfg, call=call):
            return policy_loss(
                PolicyInputs(lp, old, ref, adv, mask, entropy=jnp.asarray(x["ent"]), logp_behaviour=old),
                cfg=cfg,
                **call,
            )[0]

        np.testing.assert_allclose(jax.jit(f)(*args), f(*args), rtol=1e-6)


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="objective"):
        PolicyLossConfig(objective="ppo")
    with pytest.raises(ValueError, match="top_entropy_quantile"):
        PolicyLossConfig(top_entropy_quantile=1.5)
    with pytest.raises(ValueError, match="tis_mode"):
        PolicyLossConfig(tis_mode="clip")
    with pytest.raises(ValueError, match="dual_clip"):
        PolicyLossConfig(objective="sapo", dual_clip=3.0)
    with pytest.raises(ValueError, match="logp_behaviour"):
        _one(PolicyLossConfig(tis_min=0.5), [[-1.0]], [[-1.0]], [1.0])


# ------------------------------------------------------------------------------------------------------------
# several reward functions
# ------------------------------------------------------------------------------------------------------------
def _torch_multi(r, w, agg, scale):
    """TRL's formulas in float64 torch (NaN = None)."""
    r = torch.tensor(r)
    w = torch.tensor(w)
    lead, g, k = r.shape[:-2], r.shape[-2], r.shape[-1]
    flat = r.reshape(-1, k)
    uns = torch.isnan(flat).all(1)

    def nanstd(t, dim=None, keepdim=False):
        mean = torch.nanmean(t, dim=dim, keepdim=True)
        var = torch.nanmean((t - mean) ** 2, dim=dim, keepdim=True)
        n = (~torch.isnan(t)).sum(dim=dim, keepdim=True)
        var = var * torch.where(n > 1, n / (n - 1), torch.full_like(var, float("nan")))
        s = var.sqrt()
        return s if keepdim or dim is None else s.squeeze(dim)

    if agg == "sum_then_normalize":
        rew = (flat * w).nansum(1)
        rew[uns] = float("nan")
        mean = torch.nanmean(rew.view(-1, g), 1).repeat_interleave(g)
        if scale == "batch":
            std = nanstd(rew).expand_as(rew)
        else:
            std = nanstd(rew.view(-1, g), 1).repeat_interleave(g)
        adv = rew - mean
        if scale != "none":
            adv = adv / (std + 1e-4)
    else:
        grouped = flat.view(-1, g, k)
        rk = (grouped - torch.nanmean(grouped, 1, keepdim=True)) / (nanstd(grouped, 1, keepdim=True) + 1e-4)
        rew = (rk.view(-1, k) * w).nansum(1)
        rew[uns] = float("nan")
        adv = (rew - torch.nanmean(rew)) / (nanstd(rew) + 1e-4)
    return torch.nan_to_num(adv, nan=0.0).reshape(*lead, g).numpy()


def test_multi_reward_advantages_equal_the_oracle():
    rng = np.random.default_rng(0)
    r = rng.normal(0, 1, (3, 4, 3))
    r[0, 1, :] = np.nan  # unscorable: every function returned None
    r[1, :, 2] = np.nan  # one function silent for a whole group
    r[2, 0, 0] = np.nan
    r[2, 2, 1] = np.nan
    w = np.array([1.0, 0.5, 2.0])
    for agg, scale in itertools.product(
        ("sum_then_normalize", "normalize_then_sum"), ("group", "batch", "none")
    ):
        got, rew = multi_reward_advantages(jnp.asarray(r), jnp.asarray(w), aggregation=agg, scale=scale)
        np.testing.assert_allclose(got, _torch_multi(r, w, agg, scale), rtol=1e-5, atol=1e-6)
        assert float(got[0, 1]) == 0.0 and np.isnan(rew[0, 1])


def test_multi_reward_literals():
    # two functions, one group of 2: rewards 1 + 0.5·2 = 2 and 0 + 0.5·0 = 0 -> mean 1, std √2 (ddof 1)
    r = jnp.asarray([[[1.0, 2.0], [0.0, 0.0]]])
    adv, rew = multi_reward_advantages(r, jnp.asarray([1.0, 0.5]))
    np.testing.assert_allclose(rew, [[2.0, 0.0]])
    np.testing.assert_allclose(adv, [[1 / (math.sqrt(2) + 1e-4), -1 / (math.sqrt(2) + 1e-4)]], rtol=1e-6)
    # a None reward is excluded from its group's statistics: [1, None, 0] -> mean 0.5, std √0.5
    adv, _ = multi_reward_advantages(jnp.asarray([[[1.0], [jnp.nan], [0.0]]]))
    np.testing.assert_allclose(
        adv, [[0.5 / (math.sqrt(0.5) + 1e-4), 0.0, -0.5 / (math.sqrt(0.5) + 1e-4)]], rtol=1e-6
    )
    with pytest.raises(ValueError, match="aggregation"):
        multi_reward_advantages(r, aggregation="sum")
    # the single-reward advantages take a None reward (NaN) the same way: [1, None, 0]
    from grpo_jax.core.advantages import compute_advantages

    got = compute_advantages(jnp.asarray([[1.0, jnp.nan, 0.0]]), method="grpo")
    np.testing.assert_allclose(
        got, [[0.5 / (math.sqrt(0.5) + 1e-4), 0.0, -0.5 / (math.sqrt(0.5) + 1e-4)]], rtol=1e-6
    )
    np.testing.assert_allclose(
        compute_advantages(jnp.asarray([[1.0, jnp.nan, 0.0]]), method="dr_grpo"), [[0.5, 0, -0.5]]
    )


def test_vespo_phi_seq_mean_is_the_mean_over_sequences():
    """TRL logs vespo/phi_seq_mean as the mean of φ over the sequences (each sequence once, whatever its
    length). Two sequences, A ≥ 0 (k 2, λ 3): one token with log ρ = 0 (w = 1, φ = 1) and three tokens whose
    log ratios sum to ln 2 (w = 2, φ = exp(3 + 2 ln 2 − 6) = 4e^-3 = 0.199148): the sequence mean is
    0.599574 (a token-weighted mean would be (1 + 3 · 0.199148) / 4 = 0.399361)."""
    import math

    lp_old = jnp.zeros((2, 3))
    lp = jnp.array([[0.0, 0.0, 0.0], [math.log(2) / 3] * 3]) - 1.0
    lp_old = lp_old - 1.0
    mask = jnp.array([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    cfg = PolicyLossConfig(objective="vespo", aggregation="token_mean")
    _, aux = policy_loss(
        PolicyInputs(lp, lp_old, None, jnp.ones(2), mask), cfg=cfg, kl_coef=0.0, entropy_coef=0.0
    )
    assert float(aux.phi_seq_mean) == pytest.approx((1.0 + 4 * math.exp(-3)) / 2, abs=1e-6)
