"""The one rule for sub-settings of a switched-off mechanism (grpo_jax.config.SUB_SETTINGS): a field that only
matters while its mechanism is on, set to a value other than its default while the mechanism is off, is
refused with one error naming its flag and the switch it needs; with the switch on it is accepted; a value
equal to the default is never refused; no preset and no shipped flagfile trips it."""

from pathlib import Path

import pytest
from absl import flags

from grpo_jax import cli, presets
from grpo_jax import config as C
from grpo_jax.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
PRETRAINED = "--init_from=smollm2-135m-instruct"


def resolve(*args):
    fv = flags.FlagValues()
    cli.define_flags(fv)
    argv = ["prog", "--workdir=/tmp/never", *args]
    fv(argv)
    return cli.config_from_flags(fv, fv.read_flags_from_files(argv[1:], force_gnu=False))


# mechanism key -> (flags that turn it on, flags that turn it off); a mechanism on by default has on = []
MECHANISMS = {
    "from_scratch": ([], [PRETRAINED]),
    "procedural": ([], ["--source=mbpp"]),
    "file_source": (["--train_data=problems.jsonl"], ["--source=procedural"]),
    "problem_files": (["--eval_data=problems.jsonl"], []),
    "codeio_source": (["--source=codeio"], []),
    "chat": (["--prompt_format=chat"], []),
    "chat_function_problems": ([], ["--source=mbpp"]),
    "chat_program_problems": (["--eval_mbpp=5"], []),
    "ppo": (["--algorithm=ppo"], []),
    "dppo": (["--algorithm=dppo"], []),
    "group_advantages": ([], ["--algorithm=ppo"]),
    "pool_baseline_scale": (["--baseline=pool", "--pool_capacity=4"], []),
    "mix_baseline": (["--baseline=mix", "--pool_capacity=4"], []),
    "kl": ([], ["--kl_coef=0"]),
    "loss_kl": ([], ["--algorithm=ppo"]),
    "entropy_bonus": (["--entropy_coef=0.01"], []),
    "reference_updates": (["--ref_update=hard"], []),
    "ema_reference": (["--ref_update=ema"], []),
    "multiscale": (["--multiscale_w_tests=0.5"], []),
    "ratio_policy_term": ([], ["--algorithm=dppo"]),
    "clip_range": ([], ["--objective=cispo"]),
    "clip_or_cispo_cap": ([], ["--objective=sapo"]),
    "sapo": (["--objective=sapo"], []),
    "vespo": (["--objective=vespo"], []),
    "clip": ([], ["--objective=cispo"]),
    "is_correction": (["--tis_cap=2"], []),
    "adaptive_controller": (["--controller=seed_entropy", "--entropy_coef=0.01"], []),
    "controller:target": (["--controller=ppo_adaptive_kl"], []),
    "controller:horizon": (["--controller=ziegler_kl"], []),
    "controller:delta": (["--controller=skywork_entropy"], []),
    "controller:min_coef": (["--controller=skywork_entropy"], []),
    "controller:max_coef": (["--controller=skywork_entropy"], []),
    "controller:low": (["--controller=seed_entropy", "--entropy_coef=0.01"], []),
    "controller:high": (["--controller=seed_entropy", "--entropy_coef=0.01"], []),
    "controller:up": (["--controller=seed_entropy", "--entropy_coef=0.01"], []),
    "controller:down": (["--controller=seed_entropy", "--entropy_coef=0.01"], []),
    "dynamic_sampling": (["--dynamic_sampling"], []),
    "pool_baseline": (["--baseline=pool", "--pool_capacity=4"], []),
    "exploration": (["--baseline=pool", "--pool_capacity=4", "--pool_explore_fraction=0.2"], []),
    "explore_temperature": (["--baseline=pool", "--pool_capacity=4", "--pool_explore_fraction=0.2"], []),
    "explore_noise": (
        [
            "--baseline=pool",
            "--pool_capacity=4",
            "--pool_explore_fraction=0.2",
            "--pool_explore_mode=param_noise",
        ],
        [],
    ),
    "lora": (["--lora_rank=2"], []),
    "replay": (["--replay_fraction=0.25", "--tis_cap=2"], []),
    "pass_rate_estimates": (["--curriculum=levels"], []),
    "pass_rate_curriculum": (["--curriculum=pass_rate"], []),
    "level_curriculum": (["--curriculum=levels"], []),
    "reference_time_limits": ([], ["--sandbox_time_limits=fixed"]),
    "resume": ([], ["--noresume"]),
    "length_reward": (["--rewards=tests,length:0.5"], []),
}

# every sub-setting (dotted RunConfig path) -> (a value other than its default as a flag value, mechanisms)
SUB_SETTINGS = {
    "model.d_model": ("256", ("from_scratch",)),
    "model.n_layers": ("3", ("from_scratch",)),
    "model.n_heads": ("8", ("from_scratch",)),
    "model.n_kv_heads": ("4", ("from_scratch",)),
    "model.d_ff": ("256", ("from_scratch",)),
    "model.qkv_bias": ("false", ("from_scratch",)),
    "model.tie_embeddings": ("false", ("from_scratch",)),
    "tasks.sft_levels": ("0", ("procedural",)),
    "tasks.rl_levels": ("0", ("procedural",)),
    "tasks.eval_levels": ("0", ("procedural",)),
    "tasks.train_per_level": ("100", ("procedural",)),
    "tasks.train_data": ("problems.jsonl", ("file_source",)),
    "tasks.grade_tests": ("private", ("file_source",)),
    "tasks.codeio_tasks": ("20", ("codeio_source",)),
    "tasks.data_format": ("apps", ("problem_files",)),
    "tasks.visible_tests": ("2", ("problem_files",)),
    "tasks.max_tests": ("3", ("problem_files",)),
    "tasks.max_problems": ("10", ("problem_files",)),
    "tasks.difficulty": ("easy", ("problem_files",)),
    "tasks.system_prompt": ("Be brief.", ("chat",)),
    "tasks.chat_instruction": ("Complete: {prompt}", ("chat", "chat_function_problems")),
    "tasks.program_instruction": ("Solve: {prompt}", ("chat", "chat_program_problems")),
    "objective.ppo.gamma": ("0.9", ("ppo",)),
    "objective.ppo.lam": ("0.9", ("ppo",)),
    "objective.ppo.vf_coef": ("0.2", ("ppo",)),
    "objective.ppo.cliprange_value": ("0.3", ("ppo",)),
    "objective.ppo.whiten_advantages": ("false", ("ppo",)),
    "objective.ppo.kl_estimator": ("k3", ("ppo", "kl")),
    "objective.dppo.mask_low": ("0.1", ("dppo",)),
    "objective.dppo.mask_high": ("0.1", ("dppo",)),
    "objective.dppo.divergence": ("kl", ("dppo",)),
    "objective.dppo.kl_coef": ("0.01", ("dppo",)),
    "objective.adv_ddof": ("0", ("group_advantages",)),
    "objective.adv_eps": ("0.001", ("group_advantages",)),
    "objective.baseline_std_floor": ("0.5", ("pool_baseline_scale",)),
    "objective.baseline_mix": ("0.3", ("mix_baseline",)),
    "objective.loss.kl_estimator": ("k1", ("kl", "loss_kl")),
    "objective.loss.kl_anchor": ("old", ("kl",)),
    "objective.loss.kl_bias_correction": ("true", ("kl", "loss_kl")),
    "objective.loss.entropy_bonus": ("token_mean", ("entropy_bonus",)),
    "objective.ref_update_every": ("5", ("reference_updates",)),
    "objective.ref_ema_tau": ("0.1", ("ema_reference",)),
    "objective.multiscale_mode": ("fraction", ("multiscale",)),
    "objective.loss.eps_low": ("0.1", ("ratio_policy_term", "clip_range")),
    "objective.loss.eps_high": ("0.3", ("ratio_policy_term", "clip_or_cispo_cap")),
    "objective.loss.dual_clip": ("3", ("ratio_policy_term", "clip")),
    "objective.loss.delta": ("2", ("ratio_policy_term", "clip")),
    "objective.loss.sapo_temp_pos": ("0.5", ("sapo",)),
    "objective.loss.sapo_temp_neg": ("2", ("sapo",)),
    "objective.loss.vespo_k_pos": ("1.5", ("vespo",)),
    "objective.loss.vespo_lambda_pos": ("2.5", ("vespo",)),
    "objective.loss.vespo_k_neg": ("2.5", ("vespo",)),
    "objective.loss.vespo_lambda_neg": ("1.5", ("vespo",)),
    "objective.loss.tis_level": ("sequence", ("is_correction",)),
    "objective.loss.tis_mode": ("mask", ("is_correction",)),
    "objective.controller.acts_on": ("kl_coef", ("adaptive_controller",)),
    "objective.controller.target": ("0.5", ("controller:target",)),
    "objective.controller.horizon": ("100", ("controller:horizon",)),
    "objective.controller.delta": ("0.01", ("controller:delta",)),
    "objective.controller.min_coef": ("0.001", ("controller:min_coef",)),
    "objective.controller.max_coef": ("0.1", ("controller:max_coef",)),
    "objective.controller.low": ("0.7", ("controller:low",)),
    "objective.controller.high": ("1.3", ("controller:high",)),
    "objective.controller.up": ("1.5", ("controller:up",)),
    "objective.controller.down": ("0.5", ("controller:down",)),
    "rollout.dynamic_max_rounds": ("1", ("dynamic_sampling",)),
    "pool.capacity": ("4", ("pool_baseline",)),
    "pool.k_schedule": ("0:1", ("pool_baseline",)),
    "pool.push_every": ("5", ("pool_baseline",)),
    "pool.eval_members": ("2", ("pool_baseline",)),
    "pool.samples_per_member": ("2", ("pool_baseline",)),
    "pool.explore_fraction": ("0.2", ("pool_baseline",)),
    "pool.explore_mode": ("param_noise", ("exploration",)),
    "pool.explore_temperature": ("2.0", ("explore_temperature",)),
    "pool.explore_noise": ("0.3", ("explore_noise",)),
    "lora.alpha": ("8", ("lora",)),
    "lora.targets": ("q_proj,v_proj", ("lora",)),
    "replay.capacity": ("64", ("replay",)),
    "replay.alpha": ("0.5", ("replay",)),
    "curriculum.ema": ("0.8", ("pass_rate_estimates",)),
    "curriculum.prior": ("0.2", ("pass_rate_estimates",)),
    "curriculum.floor": ("0.1", ("pass_rate_curriculum",)),
    "curriculum.start_level": ("1", ("level_curriculum",)),
    "curriculum.promote": ("0.5", ("level_curriculum",)),
    "curriculum.demote": ("0.2", ("level_curriculum",)),
    "curriculum.min_attempts": ("8", ("level_curriculum",)),
    "sandbox.time_limit_floor_s": ("1.0", ("reference_time_limits",)),
    "sandbox.time_limit_factor": ("3.0", ("reference_time_limits",)),
    "resume_from": ("2", ("resume",)),
    "rewards.length_cache": ("4", ("length_reward",)),
}
# what a sub-setting needs besides its mechanisms to be a valid value at all
CONTEXT = {"objective.loss.kl_anchor": ["--num_iterations=2"], "pool.eval_members": ["--pool_capacity=4"]}
FLAG = {s.path: s.flag for s in cli.flag_table()}
PAIRS = [(m, p) for p, (_, ms) in SUB_SETTINGS.items() for m in ms]


def _arg(path: str) -> str:
    value = SUB_SETTINGS[path][0]
    kind = next(s.kind for s in cli.flag_table() if s.path == path)
    if kind == "bool":
        return f"--{FLAG[path]}" if value == "true" else f"--no{FLAG[path]}"
    return f"--{FLAG[path]}={value}"


def _on(path: str) -> list[str]:
    return [a for m in SUB_SETTINGS[path][1] for a in MECHANISMS[m][0]]


@pytest.mark.parametrize("mechanism, path", PAIRS, ids=[f"{m}-{p}" for m, p in PAIRS])
def test_a_sub_setting_of_a_switched_off_mechanism_is_refused_naming_its_flag(mechanism, path):
    # every other mechanism of the field on, this one off (its default, or its off flags)
    others = [a for m in SUB_SETTINGS[path][1] if m != mechanism for a in MECHANISMS[m][0]]
    args = [*others, *MECHANISMS[mechanism][1], *CONTEXT.get(path, []), _arg(path)]
    with pytest.raises(cli.FlagError) as e:
        resolve(*args)
    msg = str(e.value)
    assert msg.startswith(f"--{FLAG[path]}="), (args, msg)
    if mechanism != "from_scratch":  # there the command line's own rule speaks first (shape flags)
        assert "only used with" in msg, (args, msg)


@pytest.mark.parametrize("path", list(SUB_SETTINGS))
def test_a_sub_setting_with_its_switch_on_is_accepted(path):
    if "from_scratch" in SUB_SETTINGS[path][1]:
        args = [_arg(path)]
    else:
        args = [*_on(path), *CONTEXT.get(path, []), _arg(path)]
    cfg, _ = resolve(*args)
    default = C.get_path(C._defaults(C.RunConfig), path)
    assert C.get_path(cfg, path) != default, (path, args)


def test_values_equal_to_the_default_are_never_refused():
    args = [f"--{FLAG[p]}={cli.format_value(C.get_path(C._defaults(C.RunConfig), p))}" for p in SUB_SETTINGS]
    args = [a for a in args if "=none" not in a]  # optional fields: none is their default
    cfg, _ = resolve(*args)
    assert cfg.pool.capacity == 0 and cfg.objective.algorithm == "grpo"


def test_the_table_covers_exactly_these_sub_settings():
    table = {(m.key, f"{m.scope}.{f}" if m.scope else f) for m in C.SUB_SETTINGS for f in m.fields}
    assert table == set(PAIRS)
    assert set(MECHANISMS) == {m.key for m in C.SUB_SETTINGS}
    for m in C.SUB_SETTINGS:  # each a real field of its scope
        scope = C.get_path(C._defaults(C.RunConfig), m.scope) if m.scope else C._defaults(C.RunConfig)
        for f in m.fields:
            C.get_path(scope, f)


def test_library_use_refuses_at_the_class_that_owns_the_rule():
    with pytest.raises(ConfigError, match=r"^ObjectiveConfig\.ppo\.lam=0\.5: only used with --algorithm=ppo"):
        C.ObjectiveConfig(ppo=C.PPOConfig(lam=0.5))
    with pytest.raises(
        ConfigError, match=r"^PolicyLossConfig\.dual_clip=3\.0: only used with --objective=clip"
    ):
        C.PolicyLossConfig(objective="sapo", dual_clip=3.0)
    with pytest.raises(
        ConfigError, match=r"^RunConfig\.pool\.capacity=8: only used with --baseline=pool\|mix"
    ):
        C.RunConfig(workdir="x", pool=C.PoolConfig(capacity=8))
    with pytest.raises(ConfigError, match=r"^ReplayConfig\.capacity=8: only used with --replay_fraction > 0"):
        C.ReplayConfig(capacity=8)
    # the loss alone mirrors TRL's config, which carries every objective's parameters: no refusal there
    C.PolicyLossConfig(objective="sapo", eps_high=0.28)
    # the curriculum's functions read every field whatever the kind (test_curriculum.py): the run refuses
    C.CurriculumConfig(kind="uniform", promote=0.5)
    with pytest.raises(
        ConfigError, match=r"^RunConfig\.curriculum\.promote=0\.5: only used with --curriculum="
    ):
        C.RunConfig(workdir="x", curriculum=C.CurriculumConfig(promote=0.5))


def test_a_pool_without_a_pool_baseline_is_refused_with_what_to_do():
    # nothing but the pool baseline samples the pool's members (train/rollout.py, train/pool_host.py): a pool
    # with --baseline=group only stores snapshots and logs pool/size, pool/diversity
    with pytest.raises(cli.FlagError) as e:
        resolve("--pool_capacity=8", "--pool_eval_members=4")
    assert str(e.value).startswith("--pool_eval_members=4: only used with --baseline=pool|mix"), str(e.value)
    assert "this run has --baseline=group" in str(e.value)
    cfg, _ = resolve("--baseline=mix", "--pool_capacity=8", "--pool_eval_members=4")
    assert cfg.pool.members_per_step == 4
    # the exploration members' settings need exploration members, and the mode they belong to
    with pytest.raises(cli.FlagError, match=r"^--pool_explore_noise=0.3: only used with "):
        resolve(
            "--baseline=pool", "--pool_capacity=4", "--pool_explore_fraction=0.2", "--pool_explore_noise=0.3"
        )


def test_the_replay_also_turns_on_the_pass_rate_estimates():
    cfg, _ = resolve(
        "--replay_fraction=0.25", "--tis_cap=2", "--curriculum_ema=0.8"
    )  # replay priorities use s(q)
    assert cfg.curriculum.ema == 0.8


@pytest.mark.parametrize("name", presets.PRESET_NAMES)
def test_no_preset_trips_the_rule(name):
    # the quickstart's β = 0 and entropy_coef = 0 under the preset: a preset sets a sub-setting only with its
    # mechanism on (the TRL presets leave TRL's inert KL / entropy-bonus forms at their defaults)
    cfg, _ = resolve(f"--flagfile={ROOT / 'experiments/flagfiles/quickstart.flags'}", f"--preset={name}",
                     "--overlong_cache_len=4")  # fmt: skip
    assert cfg.preset == name
    presets.get_preset(name).apply(C.RunConfig(workdir="x", rollout=C.RolloutConfig(max_new_tokens=8192)))
