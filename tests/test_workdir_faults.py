"""Faults of the main job's surroundings: a second run on a workdir in use is refused by the workdir's lock
(grpo_jax.train.workdir; one line, exit 2), and an unusable or damaged compilation cache
(grpo_jax.runtime.compile_cache) costs one warning line, never the run."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import mainjob
import pytest

from grpo_jax.runtime import compile_cache
from grpo_jax.train import workdir
from grpo_jax.train.build import RunConfigError, build

ROOT = Path(__file__).resolve().parents[1]


def test_a_held_workdir_refuses_a_second_lock_until_released(tmp_path):
    first = workdir.lock(str(tmp_path))
    assert (tmp_path / ".lock").read_text() == f"pid {os.getpid()} on {os.uname().nodename}\n"
    with pytest.raises(workdir.WorkdirBusy) as e:
        workdir.lock(str(tmp_path))
    assert str(e.value) == (
        f"--workdir={tmp_path} is in use by another run (pid {os.getpid()} on {os.uname().nodename}), which "
        f"holds its lock {tmp_path / '.lock'}; wait for it to end or stop it, or give another --workdir"
    )
    first.release()
    workdir.lock(str(tmp_path)).release()  # released: the next run takes it (the file stays, no stale lock)


def test_build_of_a_training_run_refuses_a_held_workdir_and_a_reader_does_not(tmp_path):
    cfg, _ = mainjob.config(mainjob.TINY, workdir=tmp_path)
    quiet = dict(print_fn=lambda _: None)
    held = workdir.lock(str(tmp_path))
    with mainjob.executor() as ex:
        try:
            with pytest.raises(RunConfigError, match=r"^--workdir=.* is in use by another run \(pid "):
                build(cfg, ex, **quiet)
            assert sorted(p.name for p in tmp_path.iterdir()) == [".lock"]  # nothing written
            build(cfg, None, **quiet).close()  # the evaluator / export: no lock taken
        finally:
            held.release()
        run = build(cfg, ex, **quiet)  # a training run holds it until Run.close()
        with pytest.raises(workdir.WorkdirBusy):
            workdir.lock(str(tmp_path))
        run.close()
    workdir.lock(str(tmp_path)).release()


def test_a_second_main_job_on_a_workdir_in_use_exits_2_with_one_line(tmp_path):
    wd = tmp_path / "busy"
    args = (
        mainjob.TINY,
        f"--workdir={wd}",
        "--steps=1000",
        "--sft_steps=0",
        "--eval_samples=0",
        "--eval_ks=",
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    log = tmp_path / "first.err"
    with open(log, "w") as err:  # a file, not a pipe: nothing blocks the first run's writes
        first = subprocess.Popen(
            mainjob.command(*args), cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err
        )
    try:
        deadline = time.monotonic() + 60
        while not (wd / ".lock").exists() or not (wd / ".lock").read_text():
            assert first.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.05)
        second = subprocess.run(
            mainjob.command(*args), cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
        assert second.returncode == 2, second.stderr[-2000:]
        (line,) = second.stderr.splitlines()
        assert line.startswith(f"error: --workdir={wd} is in use by another run (pid {first.pid} on ")
        assert line.endswith(
            f"holds its lock {wd / '.lock'}; wait for it to end or stop it, or give another --workdir"
        )
        assert first.poll() is None  # the first run goes on
    finally:
        first.send_signal(signal.SIGTERM)
        try:
            first.wait(timeout=60)
        except subprocess.TimeoutExpired:
            first.kill()
            first.wait()


@pytest.fixture
def cache_config():
    """The session's compilation-cache settings, restored after a test that changes them."""
    names = ("jax_enable_compilation_cache", "jax_compilation_cache_dir")
    saved = {n: getattr(jax.config, n) for n in names}
    state = dict(compile_cache._STATE)
    yield
    for n, v in saved.items():
        jax.config.update(n, v)
    compile_cache._STATE.update(state)


@pytest.mark.parametrize("fault", ["file in its place", "below a file", "read-only", "no permission"])
def test_an_unusable_cache_directory_is_one_warning_and_the_cache_off(
    fault, tmp_path, capsys, monkeypatch, cache_config
):
    path = tmp_path / "xla"
    if fault == "file in its place":
        path.write_text("x")
        why = "a file is there, not a directory"
    elif fault == "below a file":
        (tmp_path / "f").write_text("x")
        path, why = tmp_path / "f" / "xla", "Not a directory"
    else:  # root ignores permissions and this test may not mount: the OS's answer, as the probe would get it
        path.mkdir()
        errno_, why = (30, "Read-only file system") if fault == "read-only" else (13, "Permission denied")

        def refuse(*a, **k):
            raise OSError(errno_, why)

        monkeypatch.setattr(compile_cache.tempfile, "mkstemp", refuse)
    assert compile_cache.enable(str(path)) is None
    assert not jax.config.jax_enable_compilation_cache
    out, err = capsys.readouterr()
    assert out == "" and err == (
        f"warning: compilation cache directory {path}: {why}; running without the cache (everything is "
        "compiled); give a writable directory with --compilation_cache=DIR, or none\n"
    )


DAMAGED = """
import sys, jax, jax.numpy as jnp
from pathlib import Path
from jax._src import compilation_cache as cc
from grpo_jax.runtime import compile_cache
d = Path(sys.argv[1])
assert compile_cache.enable(str(d), min_compile_s=0.0) == str(d)
fs = [jax.jit(lambda x: jnp.tanh(x @ x.T).sum()), jax.jit(lambda x: jnp.sin(x).sum() * 2)]
first = [float(f(jnp.ones((3, 4)))) for f in fs]
for i, p in enumerate(sorted(d.glob("*-cache"))):  # every entry damaged: garbage, or cut short
    p.write_bytes(b"garbage" * 9 if i % 2 else p.read_bytes()[:40])
cc.reset_cache()  # as a new process would: the cache opened again, nothing compiled in memory
jax.clear_caches()
fs = [jax.jit(lambda x: jnp.tanh(x @ x.T).sum()), jax.jit(lambda x: jnp.sin(x).sum() * 2)]
again = [float(f(jnp.ones((3, 4)))) for f in fs]
assert again == first, (first, again)
print("ok", len(list(d.glob("*-cache"))))
"""


def test_damaged_cache_entries_are_compiled_instead_with_one_warning_line(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", DAMAGED, str(tmp_path / "xla")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stderr[-2000:]
    assert int(out.stdout.split()[1]) >= 2  # several damaged entries were read
    (line,) = out.stderr.splitlines()
    assert line.startswith(
        f"warning: compilation cache {tmp_path / 'xla'}: error reading persistent compilation"
    )
    assert line.endswith(
        "compiled instead (delete the directory to clear a damaged entry); later cache errors of this "
        "process are not shown"
    )
