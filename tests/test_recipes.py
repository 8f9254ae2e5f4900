"""The cold-start study's flagfiles and the accelerator recipe resolve (dry-run checked here: no device was
lent), and the recipe's cost floors come from the bench's roofline model (experiments.recipe_cost)."""

from __future__ import annotations

import json
import shutil

import pytest

from grpo_jax import cli
from grpo_jax.pretrained.hf import config_from_hf

QWEN = "experiments/recipes/qwen2.5-coder-0.5b-instruct.config.json"


@pytest.fixture
def qwen_dir(tmp_path):
    shutil.copy(QWEN, tmp_path / "config.json")
    return tmp_path


def test_the_study_and_recipe_flagfiles_resolve(qwen_dir, tmp_path):
    cfg, _ = cli.resolve(["codegen", "--flagfile=experiments/flagfiles/smollm2_cold_start.flags"])
    assert cfg.tasks.source == "mbpp+codeio" and cfg.rollout.max_new_tokens == 512 and cfg.sft.steps == 200
    assert cfg.rollout.engine == "continuous" and cfg.optim.pack_tokens == 512 and cfg.eval.codeio == 194
    flagfile = "experiments/recipes/qwen_coder_0.5b_cold_start.flags"
    cfg, _ = cli.resolve(["codegen", f"--flagfile={flagfile}", f"--init_from={qwen_dir}"])
    assert cfg.tasks.prompt_format == "chat" and cfg.rollout.max_new_tokens == 1024
    assert cfg.rollout.prompts_per_step * cfg.rollout.group_size == 256


def test_the_qwen_shapes_are_the_published_0_5b_model():
    model = config_from_hf(json.load(open(QWEN, encoding="utf-8")))
    assert (model.n_layers, model.d_model, model.n_heads, model.n_kv_heads, model.d_ff) == (
        24,
        896,
        14,
        2,
        4864,
    )
    assert round(model.num_params() / 1e6) == 494  # Qwen2.5-0.5B: 494 M parameters (tied embeddings)


def test_recipe_cost_floors(qwen_dir):
    from experiments import recipe_cost

    flagfile = "experiments/recipes/qwen_coder_0.5b_cold_start.flags"
    cfg, _ = cli.resolve(["codegen", f"--flagfile={flagfile}", f"--init_from={qwen_dir}"])
    model = config_from_hf(json.load(open(QWEN, encoding="utf-8")))
    slow = recipe_cost.floors(
        cfg, model, {"matmul_gflops": 400e3, "matmul_bf16_gflops": 400e3, "bandwidth_gbs": 2000}, 0.5, 0.4
    )
    fast = recipe_cost.floors(
        cfg, model, {"matmul_gflops": 800e3, "matmul_bf16_gflops": 800e3, "bandwidth_gbs": 4000}, 0.5, 0.4
    )
    assert fast["train_s"] == pytest.approx(slow["train_s"] / 2)  # compute-bound: half at twice the rate
    assert fast["sampling_s"] == pytest.approx(slow["sampling_s"] / 2)
    assert slow["grpo_step_s"] == pytest.approx(slow["sampling_s"] + slow["train_s"])
    # 4 forward passes (beta 0: no reference) of 32 prompts x (410 prompt + 8 x 512 reply tokens)
    assert 1.0 < slow["train_s"] < 2.0
    out = recipe_cost.report(flagfile, QWEN, 400.0, 2000.0, 0.5, 0.4)
    assert "qwen2 494 M parameters; 32 prompts x G = 8" in out and "grpo_step_s  >=" in out
