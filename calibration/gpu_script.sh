#!/usr/bin/env bash
# Measured profiles on a CUDA machine, in one command:
#
#     bash calibration/gpu_script.sh                 # qwen3-8b and qwen3-32b
#     MODELS="qwen3-8b" LAYERS=2 bash calibration/gpu_script.sh
#
# Needs kvsim installed with a CUDA build of torch (pip install -e '.[calibration]'). Writes,
# per model, into costmodel/profiles/measured/ (override with OUT=...):
#     <gpu>-<model>.yaml          the profile (use it with any --profile PATH)
#     <gpu>-<model>.json          kvsim calibrate --json: fit quality, the profile
#     <gpu>-<model>.figure1.json  kvsim microbench figure1 with that profile
#     <gpu>-environment.txt       nvidia-smi, torch and CUDA versions, git commit, date
#     <gpu>-<model>.vs-kernels.md  errors of this profile, of the kernel-table profile of the
#                                 same system (SYSTEM, guessed from the GPU name) and of the
#                                 derived one, on the prefill points measured here
# Provenance (device name, torch/CUDA versions, date, model, layers timed, grid, every measured
# point and the fit's errors) is also inside each profile under `details`.
# Time on one H100: about 1-2 minutes per model (bf16, 4 layers timed per model, 5 rounds).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -x .venv/bin/kvsim ]]; then KVSIM=${KVSIM:-.venv/bin/kvsim}; else KVSIM=${KVSIM:-kvsim}; fi
if [[ -x .venv/bin/python ]]; then PY=${PY:-.venv/bin/python}; else PY=${PY:-python3}; fi
OUT=${OUT:-costmodel/profiles/measured}
MODELS=${MODELS:-"qwen3-8b qwen3-32b"}
LAYERS=${LAYERS:-4}
ROUNDS=${ROUNDS:-5}
DATE=$(date -u +%Y-%m-%d)
DEVICE=${DEVICE:-cuda}   # DEVICE=cpu EXTRA=--quick: a dry run of this script without a GPU
EXTRA=${EXTRA:-}

if [[ $DEVICE == cuda ]]; then
  "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device visible to torch')"
  GPU=$("$PY" -c "import re, torch; print(re.sub('[^a-z0-9]+', '-', torch.cuda.get_device_name().lower()).strip('-'))")
else
  GPU=$DEVICE
fi
# The kernel-table system to compare with (kvsim calibrate --from-kernels names).
case "$GPU" in
  *gb200*) GUESS=gb200 ;; *gb300*) GUESS=gb300 ;; *b300*) GUESS=b300_sxm ;;
  *b200*) GUESS=b200_sxm ;; *h200*) GUESS=h200_sxm ;; *a100*) GUESS=a100_sxm ;;
  *l40s*) GUESS=l40s ;; *rtx-pro-6000*) GUESS=rtx_pro_6000_server ;; *) GUESS=h100_sxm ;;
esac
SYSTEM=${SYSTEM:-$GUESS}
mkdir -p "$OUT"
{
  echo "date: $DATE"
  echo "git: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version())"
  [[ $DEVICE == cuda ]] && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv || true
} > "$OUT/$GPU-environment.txt"

for m in $MODELS; do
  base="$OUT/$GPU-$m"
  echo "== $m on $GPU" >&2
  # shellcheck disable=SC2086  # EXTRA is a list of options
  "$KVSIM" calibrate --device "$DEVICE" --model "$m" --layers "$LAYERS" --rounds "$ROUNDS" \
    --date "$DATE" --out "$base.yaml" --json $EXTRA > "$base.json"
  "$KVSIM" microbench figure1 --model "$m" --profile "$base.yaml" --json > "$base.figure1.json"
  "$KVSIM" microbench figure1 --model "$m" --profile "$base.yaml"
  "$PY" - "$base.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
f, d = doc["fit"], doc["profile"]["details"]
print(f"fit: R^2 {f['r2']:.4f}, median |err| {f['median_abs_rel_error']:.1%}, "
      f"max {f['max_abs_rel_error']:.1%}, held-out median {f['holdout_median_abs_rel_error']:.1%}")
for r in d["figure1_measured"]:
    print(f"Figure 1 measured here, {r['context_tokens'] // 1024}K: tail/front "
          f"{r['measured_speedup']:.3f} (fitted profile {r['predicted_speedup']:.3f})")
for h in d["hole_restore"]:
    print(f"hole {h['hole']} + new {h['new']}: batched/apart {h['batched_over_apart']:.4f}")
PY
  if "$PY" -c "import aiconfigurator_core" 2>/dev/null; then
    "$PY" -m calibration.kernels.compare --measured "$base.yaml" --system "$SYSTEM" \
      | tee "$base.vs-kernels.md"
  else
    echo "(pip install 'kvsim[kernels]' to compare with the $SYSTEM kernel-table profile)" >&2
  fi
done
echo "profiles in $OUT" >&2
