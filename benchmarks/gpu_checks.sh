#!/usr/bin/env bash
# Real-size checks for one short GPU lease, in priority order, each under its own time limit so
# that one hang cannot eat the rest. Nothing here is a test: tests never need a GPU. Results are
# written to $OUT (default /tmp/gpu_checks): gpu_checks.log and one JSON per benchmark; the
# numbers are quoted in benchmarks/README.md ("GPU checks").
#
#   OUT=/tmp/gpu bash benchmarks/gpu_checks.sh          # from the repository root, on a CUDA machine
#
# 1. precision.py: SD3-Medium-shaped transformer (24 layers x 1536, ~2B), 4,096 tokens: torchao
#    fp8 vs bf16 rollout time, and Sol-RL preview ranking (bf16 / fp8 / simulated NVFP4 at fewer steps)
# 2. rollout_realsize.py: SD 1.5-sized pipeline, fp16: policy.rollout vs the pipeline (<= 1.10);
#    the random pipeline is saved for 3
# 3. train_step.py on configs/sd15/ddpo_aesthetic.yaml at that size (LoRA 4, fp16, 50 DDIM steps):
#    the update's on-policy ratios at fp16 against DDPO's clip range 1e-4, trainer / bare time,
#    peak memory
# 4. astrolabe_memory.py --device cuda: peak training memory by video length
# 5. the tiny Sol-RL recipe end to end with fp8 previews through the trainer
# 6. the CUDA reward test and the trainer-precision tests on the GPU
# BACKGROUND="command": run after the timing parts (1-3), beside 4-6, and waited for (e.g. training
# the toy video teacher on the GPU: benchmarks/README.md, "gpu_checks.sh")
set -u
OUT=${OUT:-/tmp/gpu_checks}
mkdir -p "$OUT"
LOG="$OUT/gpu_checks.log"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1
PY=${PYTHON:-python3}

part() {  # part NAME SECONDS command...
    local name=$1 limit=$2
    shift 2
    echo "== $(date +%T) $name (limit ${limit}s): $*" | tee -a "$LOG"
    timeout "$limit" "$@" 2>&1 | grep -v -E "it/s\]|s/it\]|Loading" | tee -a "$LOG"
    echo "== $name rc=${PIPESTATUS[0]}" | tee -a "$LOG"
}

part env 60 bash -c "nvidia-smi -L; $PY -c 'import torch, diffusers, transformers, torchao; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(), torch.cuda.get_device_capability(), \"diffusers\", diffusers.__version__, \"transformers\", transformers.__version__, \"torchao\", torchao.__version__)'"
part fp8_smoke 60 "$PY" -c "
import torch
from genalign.policies.precision import quantize_denoiser
m = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)).cuda()
q, report = quantize_denoiser(m, 'fp8')
x = torch.randn(64, 256, device='cuda')
with torch.no_grad():
    d = (q(x.bfloat16()).float() - m(x)).abs().max().item()
print('fp8 smoke:', report.backend, len(report.quantized), 'layers, max|d| vs fp32', round(d, 4))
"
# session 29: the timing half takes about 50 s; the ranking half (five previews of 16 samples, the
# simulated NVFP4 one in fp32) did not finish in 110 s at pool 8, so it gets the longest limit
part precision 240 "$PY" benchmarks/precision.py --device cuda --layers 24 --heads 24 --head-dim 64 \
    --size 512 --batch 4 --steps 10 --preview-steps 6 --prompts 2 --pool 8 --repeats 3 --json "$OUT/precision.json"
part rollout_realsize 100 "$PY" benchmarks/rollout_realsize.py --batch-size 8 --steps 20 --repeats 5 \
    --json "$OUT/rollout_realsize.json" --save /tmp/sd15-random
part train_step_sd15 150 "$PY" benchmarks/train_step.py --recipe configs/sd15/ddpo_aesthetic.yaml --repeats 3 \
    --profile off --json "$OUT/train_step_sd15.json" model.path=/tmp/sd15-random reward.name=jpeg_compressibility \
    "logging.trackers=[]" train.prompts_per_step=32 train.gradient_accumulation_steps=4 train.timestep_fraction=0.2
# The timing parts are done: a job that needs the GPU for a while (BACKGROUND, a shell command) may
# share it with the functional parts below, whose results do not depend on time; it is waited for.
BG=
if [ -n "${BACKGROUND:-}" ]; then
    echo "== $(date +%T) background: $BACKGROUND" | tee -a "$LOG"
    bash -c "$BACKGROUND" >"$OUT/background.log" 2>&1 &
    BG=$!
fi
part astrolabe_memory 60 "$PY" benchmarks/astrolabe_memory.py --device cuda --batch 4 --out "$OUT/astrolabe_memory.json"
part sol_rl_fp8 50 "$PY" -m genalign.cli train configs/tiny/sol_rl_jpeg.yaml train.sol_rl.preview_precision=fp8 \
    logging.run_dir=/tmp/sol_rl_fp8
part pytest_cuda 80 "$PY" -m pytest -q -p no:cacheprovider tests/rewards/test_protocol.py::test_cuda_matches_cpu_and_runs_in_bfloat16 \
    tests/trainers/test_trainer_fidelity.py
if [ -n "$BG" ]; then
    wait "$BG"
    echo "== background rc=$? (its output: $OUT/background.log)" | tee -a "$LOG"
    tail -n 30 "$OUT/background.log"
fi
echo "== $(date +%T) done" | tee -a "$LOG"
