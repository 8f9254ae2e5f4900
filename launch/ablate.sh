#!/usr/bin/env bash
# One ablation arm over seeds: experiments/flagfiles/ablate_<mechanism>.flags (or quickstart.flags for the
# arm without any mechanism, mechanism "baseline"), one run per seed in runs/ablate/<mechanism>_s<seed>,
# then a one-line summary per seed (held-out pass@1 / pass@8 after SFT and after GRPO, median step time).
#   bash launch/ablate.sh replay 0 1 2
#   bash launch/ablate.sh baseline 0 1 2
# Runs resume if interrupted (same workdir). Uses .venv/bin/python if present, else python3.
# Studies (many seeds, several arms, one shared SFT warm start per seed, intervals and plots) use the sweep
# runner instead: python -m experiments.sweep --grid=experiments/sweeps/seed_claims.json --runs_dir=DIR,
# then python -m experiments.report DIR (which also reads this script's runs/ablate/<mechanism>_s<seed>).
set -euo pipefail
cd "$(dirname "$0")/.."
mech="${1:?usage: launch/ablate.sh <mechanism|baseline> <seed>...}"; shift
flags="experiments/flagfiles/ablate_${mech}.flags"
[[ "$mech" == baseline ]] && flags="experiments/flagfiles/quickstart.flags"
[[ -f "$flags" ]] || { echo "error: no flagfile $flags" >&2; exit 2; }
py=python3; [[ -x .venv/bin/python ]] && py=.venv/bin/python
for seed in "${@:-0}"; do
  wd="runs/ablate/${mech}_s${seed}"
  mkdir -p runs/ablate
  echo "== $mech seed $seed -> $wd"
  "$py" -m experiments.codegen --flagfile="$flags" --seed="$seed" --workdir="$wd" > "$wd.log" 2>&1 \
    || { echo "error: run failed, see $wd.log" >&2; exit 1; }
  "$py" - "$wd" "$mech" "$seed" <<'PY'
import json, sys
wd, mech, seed = sys.argv[1:]
r = json.load(open(f"{wd}/results.json"))
print(f"{mech:<18} seed {seed}  pass@1 {r['sft']['pass@1']:.3f} -> {r['grpo']['pass@1']:.3f}  "
      f"pass@8 {r['sft']['pass@8']:.3f} -> {r['grpo']['pass@8']:.3f}  "
      f"median step {r.get('median_step_s_this_process', float('nan')):.2f} s")
PY
done
