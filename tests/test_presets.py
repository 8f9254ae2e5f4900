"""Presets (grpo_jax.presets) against GRPO_MATH.md §1.8: every recipe field set, the table's numbers, and
the result a valid RunConfig."""

import pytest

from grpo_jax import presets
from grpo_jax.config import RolloutConfig, RunConfig, from_leaves, get_path, leaves

EXPECTED_NAMES = {
    "deepseekmath",
    "r1",
    "dapo",
    "dr_grpo",
    "gspo",
    "trl_default",
    "seed",
    "cispo",
    "sapo",
    "luspo",
    "vespo",
}
BASE = RunConfig(workdir="/nonexistent", rollout=RolloutConfig(max_new_tokens=24))


def _applied(name, **leaf_overrides):
    """BASE with the preset applied, then `leaf_overrides` ({dotted path: value}) on top."""
    vals = {**leaves(BASE), **dict(presets.get_preset(name).values), **leaf_overrides}
    return from_leaves(vals)


def test_every_preset_sets_every_recipe_field_and_applies():
    assert set(presets.PRESETS) == EXPECTED_NAMES
    for name in EXPECTED_NAMES:
        p = presets.get_preset(name)
        paths = [path for path, _ in p.values]
        assert paths[: len(presets.RECIPE_FIELDS)] == list(presets.RECIPE_FIELDS), name
        assert p.notes and "\n" not in p.notes
        over = {"objective.overlong_cache_len": 4} if name == "dapo" else {}
        cfg = _applied(name, **over)
        if not over:
            assert cfg == p.apply(BASE)
        for path, value in p.values:
            if path not in over:
                assert get_path(cfg, path) == value, (name, path)
        hash(cfg.objective)  # a static jit argument


def test_table_values():
    obj = _applied

    d = obj("deepseekmath")
    o = d.objective
    assert (o.kl_coef, d.rollout.group_size, o.adv_ddof, o.adv_eps) == (0.04, 64, 1, 1e-4)
    assert (o.loss.eps_low, o.loss.eps_high, o.loss.kl_estimator, o.loss.kl_anchor) == (0.2, 0.2, "k3", "ref")
    assert o.loss.aggregation == "seq_mean_token_mean" and o.ref_update == "frozen" and o.uses_reference
    assert "not stated" in presets.get_preset("deepseekmath").notes

    r1 = obj("r1")
    o = r1.objective
    assert (o.kl_coef, o.loss.eps_low, o.loss.eps_high, r1.rollout.group_size) == (0.001, 10.0, 10.0, 16)
    assert (o.ref_update, o.ref_update_every) == ("hard", 400)

    dapo = obj("dapo", **{"objective.overlong_cache_len": 4})
    o = dapo.objective
    assert (o.loss.eps_low, o.loss.eps_high, o.kl_coef, o.uses_reference) == (0.2, 0.28, 0.0, False)
    assert o.loss.aggregation == "token_mean" and dapo.rollout.dynamic_sampling and o.mask_truncated
    assert dict(presets.get_preset("dapo").values)["objective.overlong_cache_len"] == 4096
    assert dapo.rollout.group_size == 16

    dr = obj("dr_grpo")
    o = dr.objective
    assert o.adv_method == "dr_grpo" and o.adv_eps == 0.0 and o.loss.aggregation == "constant"
    assert o.loss.max_len == 24  # Dr. GRPO's L = the configured max completion length (derived)
    assert (o.kl_coef, dr.rollout.group_size) == (0.0, 8)

    g = obj("gspo").objective
    assert (g.loss.eps_low, g.loss.eps_high, g.kl_coef) == (3e-4, 4e-4, 0.0)
    assert g.loss.importance_level == "sequence" and g.loss.aggregation == "seq_mean"

    t = obj("trl_default").objective
    # TRL's use_bias_correction_kl / entropy-bonus form are inert at its β = 0 / entropy coefficient 0: left
    # at canonical GRPO's (a preset sets a sub-setting only with its mechanism on, SUB_SETTINGS), named
    assert (t.kl_coef, t.loss.aggregation, t.loss.kl_bias_correction) == (0.0, "token_mean", False)
    assert (t.loss.eps_low, t.loss.eps_high, t.loss.entropy_bonus, t.loss.objective) == (
        0.2,
        0.2,
        "aggregate",
        "clip",
    )
    for name in ("trl_default", "cispo", "sapo", "luspo", "vespo"):
        assert "add --kl_bias_correction with --kl_coef" in presets.get_preset(name).notes, name
    assert (t.adv_method, t.adv_ddof, t.adv_eps, t.loss.importance_level) == ("grpo", 1, 1e-4, "token")
    for name, objective, aggregation in (
        ("cispo", "cispo", "token_mean"),
        ("sapo", "sapo", "seq_mean_token_mean"),
        ("luspo", "clip", "seq_sum_mean"),
        ("vespo", "vespo", "token_mean"),
    ):
        n = obj(name).objective.loss
        assert (n.objective, n.aggregation) == (objective, aggregation), name
    assert (
        obj("cispo").objective.loss.eps_high == 5.0
        and obj("luspo").objective.loss.importance_level == "sequence"
    )
    assert (obj("sapo").objective.loss.sapo_temp_pos, obj("sapo").objective.loss.sapo_temp_neg) == (1.0, 1.05)

    s = obj("seed")
    o = s.objective
    assert (o.kl_coef, o.loss.kl_anchor, s.pool.capacity, o.baseline) == (0.01, "ref", 16, "pool")
    assert (o.ref_update, o.ref_update_every, o.ref_ema_tau) == ("ema", 1, 0.005)
    assert (o.controller.kind, o.controller.drives, o.controller.target, o.entropy_coef) == (
        "seed_entropy",
        "entropy_coef",
        2.0,
        0.01,
    )
    assert "not from a paper" in presets.get_preset("seed").notes


def test_a_preset_resets_fields_set_before_it():
    # a preset is a complete recipe: an earlier dual clip or β does not leak into it
    before = BASE.objective.__class__(kl_coef=0.5, loss=BASE.objective.loss.__class__(dual_clip=3.0))
    cfg = presets.get_preset("gspo").apply(RunConfig(workdir="/x", objective=before))
    assert cfg.objective.kl_coef == 0.0 and cfg.objective.loss.dual_clip is None


def test_dapo_overlong_cache_must_fit_the_max_length():
    with pytest.raises(ValueError, match="overlong_cache_len=4096: must be < max_new_tokens=24"):
        presets.get_preset("dapo").apply(BASE)


def test_get_preset_error_lists_names():
    with pytest.raises(
        ValueError,
        match="deepseekmath, r1, dapo, dr_grpo, gspo, trl_default, cispo, sapo, luspo, vespo, seed",
    ):
        presets.get_preset("ppo")
