"""The config package against the registries its choices come from, saved run.json files against today's
config, and the recipe for a new algorithm (one module under grpo_jax/config/algorithms) end to end.

* choices: --algorithm (the config's algorithm registry, equal to grpo_jax.algorithms.ALGORITHMS, which
  imports the config and so cannot be imported by it), --data_format (grpo_jax.data.registry),
  --rollout_engine (grpo_jax.rollout.engines.ENGINES);
* tests/fixtures/run_json/*.json: the "config" of run.json files written by the code of 2026-12 (before the
  config became a package), one per algorithm: they load, read back equal, and resume (RESUMABLE_CHANGES);
* no help text carries a measurement (figures belong in docs/ and WORKSPACE.md, with their command).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from grpo_jax import config as C
from grpo_jax.config import algorithms as config_algorithms

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = sorted((ROOT / "tests" / "fixtures" / "run_json").glob("*.json"))


def _choices(cls: type, name: str) -> tuple:
    return cls.__dataclass_fields__[name].metadata["choices"]


def test_algorithm_choices_are_the_algorithm_registry():
    from grpo_jax.algorithms import ALGORITHMS

    assert C.ALGORITHMS == tuple(ALGORITHMS) == tuple(s.name for s in config_algorithms.specs())
    assert _choices(C.ObjectiveConfig, "algorithm") == C.ALGORITHMS


def test_each_algorithm_section_is_an_objective_field_a_section_and_a_sub_settings_rule():
    fields = [f.name for f in dataclasses.fields(C.ObjectiveConfig)]
    own = [s for s in config_algorithms.specs() if s.section is not None]
    assert [s.name for s in own] == ["ppo", "dppo"]
    # right after `algorithm`, in registration order (the order of run.json and of the flags)
    assert fields[: 1 + len(own)] == ["algorithm", *(s.name for s in own)]
    for s in own:
        assert C.field_types(C.ObjectiveConfig)[s.name] is s.section
        assert s.section in C.SECTIONS and s.section.FLAG_PREFIX == f"{s.name}_"
        (m,) = [m for m in C.SUB_SETTINGS if m.key == s.name]
        assert m.paths == tuple(f"objective.{s.name}.{f.name}" for f in dataclasses.fields(s.section))
    assert (C.PPOConfig, C.DPPOConfig) == tuple(s.section for s in own)


def test_data_format_and_rollout_engine_choices_are_their_registries():
    from grpo_jax.data import registry
    from grpo_jax.rollout.engines import ENGINES

    assert _choices(C.TaskConfig, "data_format") == C.DATA_FORMATS == ("auto", *registry.names())
    assert _choices(C.RolloutConfig, "engine") == ENGINES


def test_no_help_text_carries_a_measurement():
    figure = re.compile(
        r"\b\d+(?:\.\d+)?\s?(?:ms|s|MB|GB|MiB|GiB|%|minutes?|seconds?|hours?|tokens/s|GFLOP/s)(?![\w/])"
        r"|\b\d+(?:\.\d+)?x\b"
    )
    for cls in C.SECTIONS:
        for name, f in cls.__dataclass_fields__.items():
            found = figure.findall(f.metadata.get("help", ""))
            assert not found, f"{cls.__name__}.{name}: a figure in its help text ({found}): move it to docs/"


# ------------------------------------------------------------------------------------------------------------
# run.json files written before the config became a package
# ------------------------------------------------------------------------------------------------------------
def _saved(path: Path) -> dict:
    return json.loads(path.read_text())["config"]


def test_the_fixtures_cover_every_algorithm():
    assert sorted(_saved(p)["objective"]["algorithm"] for p in FIXTURES) == sorted(C.ALGORITHMS)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_a_saved_run_json_loads_reads_back_equal_and_resumes(path):
    from grpo_jax.train.build import RunConfigError
    from grpo_jax.train.export import config_from_saved
    from grpo_jax.train.resume import check_resumable

    saved = _saved(path)
    cfg = config_from_saved(saved)
    now, then = C.flat_dict(cfg.to_json()), C.flat_dict(saved)
    assert {k: now[k] for k in then} == then  # every saved field reads back equal ...
    assert [k for k in now if k in then] == list(then)  # ... in the same order
    defaults = C.flat_dict(C.RunConfig(workdir="d").to_json())
    assert {k: now[k] for k in now if k not in then} == {k: defaults[k] for k in now if k not in then}
    check_resumable(cfg, saved)
    for field in C.RESUMABLE_CHANGES:  # each may change when the run resumes
        assert field in C.flat_dict(saved), field
    moved = config_from_saved(saved, steps=saved["steps"] + 10, **{"checkpoint.every": 5, "mesh.fsdp": 2})
    check_resumable(moved, saved)
    other = config_from_saved(saved, **{"objective.kl_coef": saved["objective"]["kl_coef"] + 0.01})
    with pytest.raises(RunConfigError, match=r"different configuration \(objective\.kl_coef\)"):
        check_resumable(other, saved)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_an_older_form_of_a_saved_run_json_still_loads_and_resumes(path):
    """The forms migrate_saved reads: the remat bool, the removed mesh.model, fields added since (absent)."""
    from grpo_jax.train.export import config_from_saved
    from grpo_jax.train.resume import check_resumable

    saved = _saved(path)
    old = json.loads(json.dumps(saved))
    old["model"]["remat"] = True
    old["mesh"]["model"] = 1
    del old["rollout"]["engine"], old["optim"]["pack_tokens"], old["tasks"]["difficulty"]
    cfg = config_from_saved(old)
    assert cfg.model.remat == "full" and cfg.rollout.engine == "static" and cfg.tasks.difficulty == ""
    check_resumable(config_from_saved(saved), old)


# ------------------------------------------------------------------------------------------------------------
# the recipe: a new algorithm's config is one module
# ------------------------------------------------------------------------------------------------------------
TOY = '''
"""--algorithm=toy (a test of the recipe)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from grpo_jax.config.algorithms.registry import AlgorithmSpec, register
from grpo_jax.config.base import _positive, opt
from grpo_jax.errors import fail


@dataclasses.dataclass(frozen=True)
class ToyConfig:
    FLAG_PREFIX: ClassVar[str] = "toy_"
    alpha: float = opt(0.5, "--algorithm=toy: its one knob.")

    def __post_init__(self):
        _positive(self, ("alpha",))


def _check(o) -> None:
    if o.loss.objective != "clip":
        fail(o, "loss.objective", "with --algorithm=toy: leave --objective at clip")


register(
    AlgorithmSpec(
        name="toy", order=3, help="toy (a test)", section=ToyConfig, what="the toy", check=_check,
        without_group_advantages="the toy has none",
    )
)
'''

PROBE = """
import dataclasses
import json
from absl import flags
from grpo_jax import cli
from grpo_jax import config as C

def resolve(*args):
    fv = flags.FlagValues()
    cli.define_flags(fv)
    argv = ["prog", "--workdir=/tmp/never", *args]
    fv(argv)
    try:
        return cli.config_from_flags(fv, fv.read_flags_from_files(argv[1:], force_gnu=False))[0]
    except cli.FlagError as e:
        return str(e)

out = {
    "algorithms": C.ALGORITHMS,
    "fields": [f.name for f in dataclasses.fields(C.ObjectiveConfig)][:4],
    "toy": resolve("--algorithm=toy", "--toy_alpha=0.25").objective.toy.alpha,
    "refused": resolve("--toy_alpha=0.25"),
    "checked": resolve("--algorithm=toy", "--objective=cispo"),
    "adv": resolve("--algorithm=toy", "--adv_ddof=0"),
    "help": C.ObjectiveConfig.__dataclass_fields__["algorithm"].metadata["help"][-40:],
}
print(json.dumps(out))
"""


def test_a_new_algorithm_is_one_module(tmp_path):
    shutil.copytree(ROOT / "grpo_jax", tmp_path / "grpo_jax", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "grpo_jax" / "config" / "algorithms" / "toy.py").write_text(textwrap.dedent(TOY))
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    r = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["algorithms"] == ["grpo", "ppo", "dppo", "toy"]
    assert out["fields"] == ["algorithm", "ppo", "dppo", "toy"]
    assert out["toy"] == 0.25
    assert out["refused"].startswith("--toy_alpha=0.25: only used with --algorithm=toy (the toy)")
    assert out["checked"] == "--objective=cispo: with --algorithm=toy: leave --objective at clip"
    assert out["adv"].startswith("--adv_ddof=0: only used with --algorithm=grpo|dppo (group-relative ")
    assert "the toy has none" in out["adv"]
    assert out["help"].endswith("; --dppo_* flags) or toy (a test).")
