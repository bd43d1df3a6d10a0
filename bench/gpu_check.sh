#!/usr/bin/env bash
# The GPU path on a machine that has one (issue 14, part 5), in under 8 minutes:
#   1. the CPU/CUDA agreement tests (streamed states, embedding output, next-token
#      probabilities; the spectra on CUDA), which skip where torch sees no GPU;
#   2. the per-job timings of a Mistral-7B-shaped bf16 checkpoint (published width,
#      8 of its 32 layers, projected to 32) on CUDA, every figure printed;
#   3. the step time of each series of config/training.yaml trained on CUDA
#      (bench/bench_training.py: 64 steps beside 8).
# Usage: bash bench/gpu_check.sh [scratch folder, default $TMPDIR]   (from the repo root)
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MPLBACKEND=Agg
python - <<'PY'
import torch
if not torch.cuda.is_available():
    raise SystemExit("gpu_check: torch sees no CUDA device; nothing to check")
print("device:", torch.cuda.get_device_name(0), "torch", torch.__version__)
PY
start=$(date +%s)
python -m pytest -q -rs tests/transformers/test_streaming.py -k cuda
python -m pytest -q -rs tests/transformers/test_weights.py -k cuda
python bench/bench_streamed.py --shape mistral-7b --layers 8 --device cuda --threads "$(nproc)" \
    ${1:+--tmp "$1"}
python bench/bench_training.py --device cuda
echo "gpu_check: $(( $(date +%s) - start )) s"
