"""The persistent compilation cache (grpo_jax.runtime.compile_cache): a second process compiling the same
function loads it from the cache directory (a cache hit, the same result); "none" turns it off."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import json, sys
import jax, jax.numpy as jnp
from grpo_jax.runtime import compile_cache
hits = []
jax.monitoring.register_event_listener(lambda name, **kw: hits.append(name))
where = compile_cache.enable(sys.argv[1], min_compile_s=0.0)
f = jax.jit(lambda x: jnp.tanh(x @ x.T).sum() * 3.0)
y = float(f(jnp.arange(12.0).reshape(3, 4)))
print(json.dumps({"dir": where, "hits": hits.count("/jax/compilation_cache/cache_hits"), "y": y}))
"""


def _run(setting: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, setting], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_process_hits_the_cache_and_none_turns_it_off(tmp_path):
    cache = tmp_path / "xla"
    first, second = _run(str(cache)), _run(str(cache))
    assert first["dir"] == str(cache) and first["hits"] == 0
    assert second["hits"] >= 1 and second["y"] == first["y"]
    assert any(cache.iterdir())
    off = _run("none")
    assert off["dir"] is None and off["hits"] == 0


def test_default_directory_follows_the_cache_env(monkeypatch, tmp_path):
    from grpo_jax.runtime import compile_cache

    monkeypatch.setenv("GRPO_JAX_CACHE_DIR", str(tmp_path))
    assert compile_cache.default_dir() == str(tmp_path / "xla")
