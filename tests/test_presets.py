"""Tests for grpo_jax.core.presets against GRPO_MATH.md §1.8."""

import dataclasses

import pytest

from grpo_jax.core import advantages, controllers, losses, presets

EXPECTED_NAMES = {"deepseekmath", "r1", "dapo", "dr_grpo", "gspo", "trl_default", "seed"}


def test_all_presets_present_and_valid():
    assert set(presets.PRESETS) == EXPECTED_NAMES
    for name in EXPECTED_NAMES:
        p = presets.get_preset(name)
        assert p.name == name
        assert isinstance(p.loss, losses.GRPOLossConfig)
        assert p.adv_method in advantages.ADV_METHODS
        assert p.notes and "\n" not in p.notes
        hash(p.loss)  # usable as a static jit argument
        # re-validating via dataclasses.replace must succeed
        dataclasses.replace(p)
        dataclasses.replace(p.loss)
        if p.entropy_controller is not None:
            controllers.make_controller(p.entropy_controller)


def test_spot_checks_against_table():
    d = presets.get_preset("deepseekmath")
    assert (d.kl_coef, d.group_size, d.adv_ddof, d.adv_eps) == (0.04, 64, 1, 1e-4)
    assert (d.loss.eps_low, d.loss.eps_high, d.loss.kl_estimator) == (0.2, 0.2, "k3")
    assert d.loss.aggregation == "seq_mean_token_mean"
    assert "not stated" in d.notes

    r1 = presets.get_preset("r1")
    assert (r1.kl_coef, r1.loss.eps_low, r1.loss.eps_high, r1.group_size, r1.ref_reset_every) == (
        0.001,
        10.0,
        10.0,
        16,
        400,
    )

    dapo = presets.get_preset("dapo")
    assert (dapo.loss.eps_low, dapo.loss.eps_high, dapo.kl_coef) == (0.2, 0.28, 0.0)
    assert dapo.loss.aggregation == "token_mean" and dapo.dynamic_sampling and dapo.mask_truncated
    assert dapo.overlong == (20480, 4096) and dapo.group_size == 16

    dr = presets.get_preset("dr_grpo")
    assert dr.adv_method == "dr_grpo" and dr.loss.aggregation == "constant" and dr.loss.max_len == 3000
    assert (dr.kl_coef, dr.group_size) == (0.0, 8)

    gspo = presets.get_preset("gspo")
    assert (gspo.loss.eps_low, gspo.loss.eps_high, gspo.kl_coef) == (3e-4, 4e-4, 0.0)
    assert gspo.loss.importance_level == "sequence" and gspo.loss.aggregation == "seq_mean"

    trl = presets.get_preset("trl_default")
    assert (trl.kl_coef, trl.group_size, trl.loss.aggregation, trl.loss.max_len) == (
        0.0,
        8,
        "token_mean",
        512,
    )

    seed = presets.get_preset("seed")
    assert (seed.kl_coef, seed.loss.kl_anchor, seed.pool_size, seed.ref_ema_tau) == (0.01, "ref", 16, 0.005)
    assert seed.entropy_controller == "seed_entropy"
    assert "seed document" in seed.notes and "not from a paper" in seed.notes


def test_get_preset_error_lists_names():
    with pytest.raises(ValueError, match="deepseekmath.*r1.*dapo.*dr_grpo.*gspo.*trl_default.*seed"):
        presets.get_preset("ppo")


@pytest.mark.parametrize(
    "field, value",
    [
        ("adv_method", "zscore"),
        ("adv_ddof", 2),
        ("adv_eps", -1.0),
        ("kl_coef", -0.1),
        ("entropy_coef", -0.1),
        ("group_size", 1),
        ("overlong", (100, 200)),
        ("ref_reset_every", 0),
        ("entropy_controller", "sac"),
        ("pool_size", -1),
        ("ref_ema_tau", 2.0),
    ],
)
def test_preset_validation(field, value):
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(presets.get_preset("deepseekmath"), **{field: value})
