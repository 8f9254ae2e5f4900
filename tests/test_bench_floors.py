"""experiments.bench_phases.decode_floor_s: the roofline floor of one decode step that `experiments.bench`
prints beside the measured decode time (every size), checked on the tiny model with hand-computed values."""

import dataclasses

import pytest

from experiments.bench_phases import decode_floor_s
from grpo_jax.policies import transformer as tfm

RATES = {"matmul_gflops": 300.0, "matmul_bf16_gflops": 1500.0, "bandwidth_gbs": 8.0}


def test_tiny_decode_floor_is_its_bytes_at_the_bandwidth():
    # TINY (untied head): 4 461 824 parameters, of which the 512 x 256 embedding table (131 072) is gathered
    # by rows, not read; 8 prompts of 32 tokens x G = 8, 64 decode steps. bf16: weights 4 330 752 x 2 =
    # 8 661 504 B; KV 2 x 4 layers x 4 heads x 64 x 2 B x (8 x 32 + 64 x 32 mean completion positions) =
    # 9 437 184 B; 18 098 688 B / 8e9 B/s = 2.262336 ms, above the FLOPs: 64 rows x 8 912 896 (context 64)
    # / 1.5e12 = 0.380 ms
    assert decode_floor_s(tfm.TINY, 8, 8, 32, 64, "bfloat16", RATES) == pytest.approx(0.002262336, rel=1e-9)
    # float32: 17 323 008 + 18 874 368 B at 8e9 B/s = 4.524672 ms (FLOPs at 300 GFLOP/s: 1.90 ms)
    assert decode_floor_s(tfm.TINY, 8, 8, 32, 64, "float32", RATES) == pytest.approx(0.004524672, rel=1e-9)


def test_a_tied_head_is_the_embedding_table_read_once():
    # the same model tied: 4 461 824 - 131 072 (no separate head) = 4 330 752 parameters, all read
    tied = dataclasses.replace(tfm.TINY, tie_embeddings=True)
    assert tied.num_params() == 4330752
    assert decode_floor_s(tied, 8, 8, 32, 64, "bfloat16", RATES) == pytest.approx(0.002262336, rel=1e-9)


def test_decode_floor_is_the_flops_when_the_matmul_rate_is_the_limit():
    slow = dict(RATES, matmul_bf16_gflops=0.1)  # 570 425 344 FLOPs per step at 0.1 GFLOP/s
    assert decode_floor_s(tfm.TINY, 8, 8, 32, 64, "bfloat16", slow) == pytest.approx(5.70425344, rel=1e-9)
