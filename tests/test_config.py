"""The config tree (grpo_jax.config) and the command line derived from it (grpo_jax.cli): one flag per
field, the precedence rule (last setting wins, a preset counts where it appears), errors that name the flag,
and every shipped flagfile resolving to the preset it names."""

import dataclasses
from pathlib import Path

import pytest
from absl import flags

from grpo_jax import cli, presets
from grpo_jax import config as C
from grpo_jax.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
FLAGFILES = ROOT / "experiments" / "flagfiles"
PRETRAINED = "--init_from=smollm2-135m-instruct"


def resolve(*args, workdir="/tmp/never"):
    """(RunConfig, notes) for a command line, parsed into a fresh FlagValues."""
    fv = flags.FlagValues()
    cli.define_flags(fv)
    argv = ["prog", f"--workdir={workdir}", *args]
    fv(argv)
    return cli.config_from_flags(fv, fv.read_flags_from_files(argv[1:], force_gnu=False))


def _resume_check():
    """(check_resumable, RunConfigError) of the main job's resume (grpo_jax.train.resume)."""
    from grpo_jax.train.build import RunConfigError
    from grpo_jax.train.resume import check_resumable

    return check_resumable, RunConfigError


def test_every_field_is_one_flag_with_help():
    table = cli.flag_table()
    leaves = set(C.leaves(C.RunConfig(workdir="x")))
    assert {s.path for s in table} == leaves - {"objective.loss.max_len"}  # the one derived field
    for s in table:
        assert s.owner.__dataclass_fields__[s.field].metadata.get("help"), s.path
    # the flag names users know survived the redesign
    names = {s.flag for s in table}
    for old in ("kl_coef", "pool_capacity", "curriculum", "controller", "sft_steps", "eval_ks", "log_every",
                "sample_log_every", "keep_checkpoints", "checkpoint_every", "sandbox_workers", "tis_cap",
                "replay_fraction", "lora_targets", "pool_k_schedule", "dual_clip", "delta",
                "kl_bias_correction", "overlong_cache_len", "kl_schedule", "controller_horizon"):  # fmt: skip
        assert old in names, old


def test_defaults_equal_the_tree_defaults():
    cfg, notes = resolve()
    assert cfg == C.RunConfig(workdir="/tmp/never") and notes == []


def test_types_lists_schedules_and_none():
    args = [
        "--eval_ks=1,4",
        "--baseline=pool",
        "--pool_capacity=8",
        "--pool_k_schedule=0:2,10:8",
        "--dual_clip=3",
    ]
    args += ["--kl_coef=0.03", "--kl_schedule=0:0.03,100:0.01", "--noqkv_bias", "--tis_cap=none"]
    cfg, _ = resolve(*args)
    assert cfg.eval.ks == (1, 4) and cfg.pool.k_schedule == ((0, 2), (10, 8))
    assert cfg.objective.loss.dual_clip == 3.0 and cfg.objective.loss.tis_cap is None
    assert cfg.objective.kl_schedule == ((0, 0.03), (100, 0.01)) and cfg.model.qkv_bias is False


def test_preset_after_a_flagfile_wins_and_says_so():
    # the bug: quickstart.flags' --kl_coef=0.0 silently beat --preset=deepseekmath
    cfg, notes = resolve(f"--flagfile={FLAGFILES / 'quickstart.flags'}", "--preset=deepseekmath")
    assert cfg.objective.kl_coef == 0.04 and cfg.objective.uses_reference
    assert any("--kl_coef=0.0 (given before --preset) replaced by the preset's 0.04" in n for n in notes)


def test_flag_after_the_preset_wins_and_says_so():
    cfg, notes = resolve("--preset=r1", "--kl_coef=0.01")
    assert cfg.objective.kl_coef == 0.01 and cfg.objective.ref_update == "hard"
    assert any("kl_coef=0.001 replaced by --kl_coef=0.01 (given after --preset)" in n for n in notes)
    # the same flag before the preset is overridden by it
    cfg, _ = resolve("--kl_coef=0.01", "--preset=r1")
    assert cfg.objective.kl_coef == 0.001


def test_trl_default_keeps_its_recipe_over_the_quickstart():
    cfg, notes = resolve(f"--flagfile={FLAGFILES / 'trl_default.flags'}")
    assert cfg.objective.loss.aggregation == "token_mean" and cfg.objective.kl_coef == 0.0
    # TRL's bias-corrected KL is inert at its β = 0 (a sub-setting of a switched-off KL): named in the notes,
    # and taken with a β
    assert cfg.objective.loss.kl_bias_correction is False and "add --kl_bias_correction" in notes[-1]
    cfg, _ = resolve(
        f"--flagfile={FLAGFILES / 'trl_default.flags'}", "--kl_coef=0.05", "--kl_bias_correction"
    )
    assert cfg.objective.loss.kl_bias_correction is True and cfg.objective.uses_reference


@pytest.mark.parametrize(
    "args, message",
    [
        (["--kl_coef=-1"], "--kl_coef=-1.0: must be >= 0"),
        (["--group_size=1"], "--group_size=1: must be >= 2"),
        (["--kl_anchor=old", "--kl_coef=0.04"], "--kl_anchor=old: with num_iterations=1"),
        (
            ["--controller=seed_entropy", "--controller_horizon=5"],
            "--controller_horizon=5: only used with --controller=ziegler_kl (a parameter of those "
            "controllers); this run has --controller=seed_entropy",
        ),
        (["--controller=ziegler_kl", "--kl_coef=0"], "--kl_coef=0.0: controller 'ziegler_kl' scales"),
        (["--kl_schedule=0:0.03,10:0.01"], "--kl_schedule=0:0.03,10:0.01: its step-0 value must equal"),
        (["--kl_schedule=5:0.04"], "--kl_schedule=5:0.04: steps must start at 0"),
        (["--baseline=pool"], "--baseline=pool: needs a policy pool"),
        (["--async_rewards"], "--async_rewards=true: replayed and asynchronous rollouts are off-policy"),
        (["--mesh_data=0"], "--mesh_data=0: must be >= 1, or -1 for every device"),
        (["--mesh_tensor=0"], "--mesh_tensor=0: must be > 0"),
        (["--mesh_cpu_devices=-1"], "--mesh_cpu_devices=-1: must be >= 0"),
        (["--dist_num_processes=2"], "--dist_num_processes=2: needs --dist_coordinator=HOST:PORT"),
        (["--dist_coordinator=localhost"], "--dist_coordinator=localhost: must be HOST:PORT"),
        (
            ["--dist_coordinator=h:1", "--dist_num_processes=2", "--dist_process_id=2"],
            "--dist_process_id=2: must be in 0..1",
        ),
        (["--micro_batches=3"], "--micro_batches=3: mini_batches x micro_batches = 1 x 3 must divide"),
        (["--remat=yes"], "--remat=yes: "),
        (["--rollout_dtype=float16"], "--rollout_dtype=float16: valid: float32, bfloat16"),
        (["--adv_method=zscore"], "--adv_method=zscore: valid: grpo, dr_grpo, rloo, batch_std"),
        (["--preset=ppo"], "--preset=ppo: unknown preset 'ppo'; valid presets are deepseekmath"),
        (["--preset=dapo"], "--overlong_cache_len=4096: must be < max_new_tokens=24"),
        (["--curriculum_start_level=3"], "--curriculum_start_level=3: an index into rl_levels"),
        (
            ["--pack_tokens=23"],
            "--pack_tokens=23: a packed row must hold the longest completion: >= the completion length 24",
        ),
        (
            ["--pack_tokens=100", "--max_turns=2", "--feedback_tokens=64"],
            "--pack_tokens=100: a packed row must hold the longest completion: >= the completion length 112",
        ),
        (["--pack_tokens=24", "--pack_rows_per_doubling=0"], "--pack_rows_per_doubling=0: must be > 0"),
    ],
)
def test_bad_values_name_the_flag(args, message):
    with pytest.raises(cli.FlagError) as e:
        resolve(*args)
    assert str(e.value).startswith(message), str(e.value)


def test_config_errors_name_the_field_in_library_use():
    with pytest.raises(ConfigError, match=r"ObjectiveConfig.kl_coef=-1: must be >= 0"):
        C.ObjectiveConfig(kl_coef=-1)
    with pytest.raises(ConfigError, match=r"RunConfig.rollout.prompts_per_step=999"):
        C.RunConfig(workdir="x", rollout=C.RolloutConfig(prompts_per_step=999))
    # the KL to π_old is legal when μ > 1 makes it non-zero
    C.ObjectiveConfig(num_iterations=2, loss=C.PolicyLossConfig(kl_anchor="old"))


def test_derived_max_len_follows_max_new_tokens():
    cfg = C.RunConfig(workdir="x", rollout=C.RolloutConfig(max_new_tokens=17))
    assert cfg.objective.loss.max_len == 17
    cfg2 = dataclasses.replace(cfg, rollout=C.RolloutConfig(max_new_tokens=9))
    assert cfg2.objective.loss.max_len == 9


def test_controller_resolution():
    for kind, drives in (("seed_entropy", "entropy_coef"), ("skywork_entropy", "entropy_coef"),
                         ("ppo_adaptive_kl", "kl_coef"), ("ziegler_kl", "kl_coef")):  # fmt: skip
        assert C.ControllerConfig(kind=kind).drives == drives
    assert (
        C.ControllerConfig(kind="seed_entropy", acts_on="kl_coef").drives == "kl_coef"
    )  # the seed's reading
    assert C.ControllerConfig().drives is None
    cfg, _ = resolve("--controller=ziegler_kl", "--controller_target=0.02", "--controller_horizon=500")
    assert cfg.objective.controller.params() == {"target": 0.02, "horizon": 500}


def _documented_changes(path: Path, preset) -> tuple[set[str], str]:
    """Flags of the preset's fields set after --preset in a flagfile, and the text of its comments."""
    lines = path.read_text().splitlines()
    comment = " ".join(ln for ln in lines if ln.startswith("#"))
    after = lines[next(i for i, ln in enumerate(lines) if ln.startswith("--preset=")) + 1 :]
    paths = {p for p, _ in preset.values}
    recipe_flags = {s.flag for s in cli.flag_table() if s.path in paths}
    given = {ln[2:].split("=")[0] for ln in after if ln.startswith("--")}
    return given & recipe_flags, comment


@pytest.mark.parametrize("path", sorted(FLAGFILES.glob("*.flags")), ids=lambda p: p.name)
def test_every_flagfile_resolves_and_preset_flagfiles_keep_their_preset(path):
    cfg, _ = resolve(f"--flagfile={path}")
    text = path.read_text()
    if "--preset=" not in text:
        return
    name = text.split("--preset=")[1].split()[0]
    preset = presets.get_preset(name)
    changed, comment = _documented_changes(path, preset)
    assert "Changes to the preset" in comment, path.name
    by_path = {s.path: s.flag for s in cli.flag_table()}
    for p, value in preset.values:
        flag = by_path.get(p)
        if flag in changed:
            assert flag in comment, (
                f"{path.name}: --{flag} changes the preset but its comment does not say so"
            )
            continue
        assert C.get_path(cfg, p) == value, f"{path.name}: {p} = {C.get_path(cfg, p)!r}, preset {value!r}"


def test_pretrained_model_flags():
    cfg, _ = resolve("--init_from=smollm2-135m-instruct", "--prompt_format=chat", "--logp_chunk=256")
    assert cfg.model.init_from == "smollm2-135m-instruct" and cfg.tasks.prompt.kind == "chat"
    # the checkpoint decides the shape: a shape flag next to --init_from is an error, not silently ignored
    with pytest.raises(cli.FlagError, match=r"--d_model=64: the model's shape comes from --init_from"):
        resolve("--init_from=smollm2-135m-instruct", "--d_model=64")
    with pytest.raises(
        cli.FlagError, match=r"--init_from=no/such/dir: not a Hugging Face checkpoint directory"
    ):
        resolve("--init_from=no/such/dir")
    with pytest.raises(cli.FlagError, match=r"--chat_instruction=Solve it.: must contain \{prompt\}"):
        resolve("--chat_instruction=Solve it.")
    cfg, _ = resolve("--eval_samples=0", "--eval_ks=", "--eval_mbpp=20", "--eval_humaneval")
    assert (cfg.eval.samples, cfg.eval.ks, cfg.eval.mbpp, cfg.eval.humaneval) == (0, (), 20, True)
    with pytest.raises(cli.FlagError, match=r"--eval_ks=1,8: must be empty with samples=0"):
        resolve("--eval_samples=0")


def test_a_run_saved_before_the_scale_out_fields_still_resumes():
    """Saved configs from before mesh/dist/mini/micro-batches and the remat policies (migrate_saved): new
    fields at their defaults, the remat bool and the removed mesh.model are not differences; a real one is."""
    from grpo_jax.config import RunConfig

    _check_resumable, RunConfigError = _resume_check()
    cfg = RunConfig(workdir="w")
    saved = cfg.to_json()
    del saved["objective"]["mini_batches"], saved["optim"]["micro_batches"], saved["dist"]
    saved["model"]["remat"] = False
    saved["mesh"] = {"data": 1, "model": 1}
    _check_resumable(cfg, saved)
    saved["objective"]["kl_coef"] = 0.5
    with pytest.raises(RunConfigError, match=r"different configuration \(objective.kl_coef\)"):
        _check_resumable(cfg, saved)
    saved["objective"]["kl_coef"] = cfg.objective.kl_coef
    saved["model"]["remat"] = True  # was full remat; the default is now dots_no_batch: remat may change
    _check_resumable(cfg, saved)
    saved["model"]["d_model"] = cfg.model.d_model * 2
    with pytest.raises(RunConfigError, match=r"model.d_model"):
        _check_resumable(cfg, saved)


def test_a_pretrained_model_gets_pretrained_model_defaults_and_says_so():
    """--init_from: no SFT and chat prompts unless given (issue 23 item 9; before: 300 SFT steps at lr 3e-3 on
    the procedural suite and plain prompts, silently); the line is printed and kept in run.json's notes."""
    cfg, notes = resolve(PRETRAINED)
    assert (cfg.sft.steps, cfg.tasks.prompt_format, cfg.tasks.prompt.kind) == (0, "chat", "chat")
    shown = cfg.to_json()  # what --dry_run prints: the resolved values
    assert (shown["sft"]["steps"], shown["tasks"]["prompt_format"]) == (0, "chat")
    assert notes == [
        "init_from: pretrained-model defaults: --sft_steps=0 (no SFT), --prompt_format=chat "
        "(give them to override)"
    ]
    # an explicit value wins wherever it is written (last setting wins), and the note leaves it out
    cfg, notes = resolve("--sft_steps=50", PRETRAINED, "--prompt_format=plain")
    assert (cfg.sft.steps, cfg.tasks.prompt_format, notes) == (50, "plain", [])
    cfg, notes = resolve(PRETRAINED, "--sft_steps=0")
    assert notes == ["init_from: pretrained-model default: --prompt_format=chat (give it to override)"]
    cfg, notes = resolve("--sft_steps=7", "--sft_steps=auto", PRETRAINED)  # auto: the model decides
    assert cfg.sft.steps == 0 and "--sft_steps=0 (no SFT)" in notes[0]
    # from scratch: the from-scratch defaults, no note
    cfg, notes = resolve()
    assert (cfg.sft.steps, cfg.tasks.prompt_format, notes) == (300, "plain", [])
    # library use: the same resolution (RunConfig._derive)
    cfg = C.RunConfig(workdir="x", model=C.ModelConfig(init_from="smollm2-135m-instruct"))
    assert (cfg.sft.steps, cfg.tasks.prompt_format) == (0, "chat")
    # an SFT setting next to the no-SFT default would silently do nothing: refused, saying what to give
    with pytest.raises(
        cli.FlagError, match=r"^--sft_lr=1e-05: a pretrained model \(--init_from\) gets no SFT"
    ):
        resolve(PRETRAINED, "--sft_lr=1e-5")
    cfg, _ = resolve(PRETRAINED, "--sft_steps=20", "--sft_lr=1e-5")
    assert (cfg.sft.steps, cfg.sft.lr) == (20, 1e-5)
    # "none" / "off" would read as "no SFT": only a number or auto
    with pytest.raises(flags.IllegalFlagValueError):
        resolve("--sft_steps=none")


def test_pretrained_defaults_resume_and_keep_the_sft_inputs_check():
    """A run saved with the resolved values resumes; the auto default and the same value given explicitly
    are the same run (config.SFT_INPUTS, --sft_from); a run saved with the old from-scratch defaults is a
    different run and resumes only with those values given."""
    _check_resumable, RunConfigError = _resume_check()
    cfg, _ = resolve(PRETRAINED)
    _check_resumable(cfg, cfg.to_json())
    explicit, _ = resolve(PRETRAINED, "--sft_steps=0", "--prompt_format=chat")
    assert explicit == cfg
    a, b = C.flat_dict(cfg.to_json()), C.flat_dict(explicit.to_json())
    assert [k for k in a if C.is_sft_input(k) and a[k] != b[k]] == []
    scratch, _ = resolve(PRETRAINED, "--sft_steps=300", "--prompt_format=plain")
    c = C.flat_dict(scratch.to_json())
    assert [k for k in a if C.is_sft_input(k) and a[k] != c[k]] == ["tasks.prompt_format", "sft.steps"]
    old = (
        scratch.to_json()
    )  # what a pretrained run saved before this change (it got 300 steps, plain prompts)
    with pytest.raises(RunConfigError, match=r"different configuration \(sft.steps, tasks.prompt_format\)"):
        _check_resumable(cfg, old)
    _check_resumable(scratch, old)
    # a saved config read back (export.open_checkpoint): its explicit values, not the auto defaults
    from grpo_jax.train.export import config_from_saved

    back = config_from_saved(old)
    assert (back.sft.steps, back.tasks.prompt_format) == (300, "plain") and back == scratch


def test_runs_saved_before_the_issue_23_defaults_still_resume():
    """The exploration noise's default (0.02 -> 0.2) and the TRL presets' inert KL / entropy-bonus forms
    changed: where the saved run had that mechanism off, the saved value had no effect and reads as today's
    (config.migrate_saved), so the run resumes; where it was on, the value was real and the run differs."""
    check, RunConfigError = _resume_check()
    cfg, _ = resolve(f"--flagfile={FLAGFILES / 'trl_default.flags'}")
    saved = cfg.to_json()
    saved["pool"]["explore_noise"] = 0.02  # the old default; no exploration members: no effect
    saved["objective"]["loss"]["kl_bias_correction"] = True  # the old trl_default preset, at β = 0
    saved["objective"]["loss"]["entropy_bonus"] = "token_mean"  # ... and entropy_coef = 0
    check(cfg, saved)
    noisy = ("--pool_explore_fraction=0.2", "--pool_explore_mode=param_noise")
    cfg, _ = resolve(f"--flagfile={FLAGFILES / 'ablate_pool.flags'}", *noisy)
    saved = cfg.to_json()
    saved["pool"]["explore_noise"] = 0.02  # parameter-noise members at 0.02: that run had them
    with pytest.raises(RunConfigError, match=r"different configuration \(pool.explore_noise\)"):
        check(cfg, saved)
    again, _ = resolve(f"--flagfile={FLAGFILES / 'ablate_pool.flags'}", *noisy, "--pool_explore_noise=0.02")
    check(again, saved)
