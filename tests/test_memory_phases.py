"""experiments.memory_phases: a main-job run with one line per phase (resident set at its end, the peak during
it, live array bytes), observed through patched loop functions that are restored afterwards."""

import re

import mainjob
import pytest

from grpo_jax.train import loop

PATCHED = ("build", "placed_state", "evaluate", "save", "finish")


def test_a_line_per_phase_with_its_peak_and_the_loop_restored(tmp_path, capsys):
    from experiments import memory_phases
    from grpo_jax.eval import evaluation

    before = {n: getattr(loop, n) for n in PATCHED}
    sample_fn = evaluation.sample_fn
    flags = (mainjob.TINY, "--steps=1", "--checkpoint_every=0", "--eval_samples=0", "--eval_ks=")
    memory_phases.main([*flags, f"--workdir={tmp_path / 'run'}"])
    assert {n: getattr(loop, n) for n in PATCHED} == before and evaluation.sample_fn is sample_fn
    lines = [x for x in capsys.readouterr().out.splitlines() if re.match(r"\[\s*[\d.]+ s\] ", x)]
    rows = {}
    for line in lines:
        m = re.match(r"\[\s*[\d.]+ s\] (.+?)\s+rss\s+([\d.]+)\s+peak\s+([\d.]+)\s+arrays\s+([\d.]+)", line)
        assert m, line
        rows.setdefault(m.group(1).strip(), []).append(tuple(float(x) for x in m.groups()[1:]))
    phases = [
        "build (model, tokenizer, problems)",
        "state placed",
        "evaluate",
        "checkpoint save",
        "rollout",
        "train step",
        "finish",
    ]
    assert all(p in rows for p in phases), sorted(rows)
    assert any(k.startswith("evaluation batch (") for k in rows)
    # the warm start's evaluation and the final one; one rollout and one train step
    assert len(rows["evaluate"]) == 2 and len(rows["rollout"]) == 1 and len(rows["train step"]) == 1
    for rss, peak, arrays in (v for vs in rows.values() for v in vs):
        assert 0 < rss <= peak and arrays >= 0


def test_a_bad_flag_is_one_line_and_exit_status_2(tmp_path, capsys):
    from experiments import memory_phases

    with pytest.raises(SystemExit) as e:
        memory_phases.main([mainjob.TINY, "--steps=-3", f"--workdir={tmp_path / 'run'}"])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == ["error: --steps=-3: must be >= 0"]
    assert not (tmp_path / "run").exists()  # nothing written
