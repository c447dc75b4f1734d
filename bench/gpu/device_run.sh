#!/usr/bin/env bash
# Every GPU figure of `make bench-gpu`, in one call on a lent GPU machine (one H100 or H200), within
# BUDGET seconds (default 470: the lease's call is planned at 8 minutes). Run from the repository root:
#
#     bash bench/gpu/device_run.sh          (the device tool's command; carry [".whl"])
#
# The machine's python3 (3.12, torch 2.11+cu130, transformers, numpy, pyarrow...) is used as it is;
# what our code imports on these paths and the image lacks travels as wheels in .whl/ (ignored by git:
# pydantic, fastapi/starlette/uvicorn, opentelemetry api/sdk/fastapi instrumentation, tenacity, crc32c,
# warcio, datasketch, torchao, pyzmq and msgspec for the serving engine's process split). Our packages
# are not installed: services/*/src go on PYTHONPATH
# (lmforge is a namespace package, so the directories combine).
#
# Parts, most important first; each under `timeout` (never past the budget), its results written into
# $OUT as they come (the training bench rewrites its JSON after every row):
#   A  training MFU, bf16, FSDP on 1 GPU, torch.compile: 350m, llama-350m, llama-1b  -> train-throughput-gpu.json
#   B  serving: lmforge-serve 350m, 1/16/64 clients (1 round)                        -> serve-gpu.json, serve-server.log
#   B2 serving baseline: transformers generate, static cache, same model and prompts,  -> hf-generate-gpu.json,
#      64/16/1 clients (1 round), then the table lmforge vs HF (bench/serve/serve_vs_hf.py) serve-vs-hf-gpu.json/.md
#   C  training memory: DDP vs FSDP2, 350m, 1 rank                                     -> train-memory.json
#   D1 llama-1b Float8 (tensorwise) and activation checkpointing, against A's bf16 row -> train-throughput-gpu-float8-ac.json
#   D2 350m fp32 (against A's 350m bf16 row)                                           -> train-throughput-gpu-fp32.json
#   E  a 32k-token stage: llama-350m forward+backward with document masking (flex)    -> document-masking.json
#      against causal SDPA on the same tokens
# Everything printed also goes to $OUT/device_run.log.
#
# Shortened against `make bench-gpu`: 30 training steps per row instead of 60 (medians over steps
# 10..29), one serving round instead of two. BENCH_DEVICE=cpu runs the same parts on CPU with tiny
# models (a check of the code paths and of this script, no figure); PY picks the interpreter;
# HF_COMPILE=off runs B2's generate eagerly (default auto: transformers compiles the decoding step
# with a static cache, about one compilation per client count, in the warm-up).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-bench/out/device}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/device_run.log") 2>&1
START=$(date +%s)
BUDGET=${BUDGET:-470}
PY=${PY:-python3}
DEVICE=${BENCH_DEVICE:-cuda}

# Wheels for what the image lacks; our sources on the path.
WHL=${WHL:-.whl}  # the wheels folder (a local check on another Python points it at wheels for that one)
if ls "$WHL"/*.whl >/dev/null 2>&1; then
  SITE=${SITE:-/tmp/site}
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHL"/*.whl \
    || { echo "wheel install failed"; exit 1; }
  PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
fi
for src in "$PWD"/services/*/src; do  # every service: lmforge.model and lmforge.pages live apart since issue 32
  PYTHONPATH=$src${PYTHONPATH:+:$PYTHONPATH}
done
export PYTHONPATH PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

echo "### $(date -u +%FT%TZ) device_run.sh, budget ${BUDGET}s, device $DEVICE"
nvidia-smi 2>&1 | head -20
"$PY" - <<'EOF'
import importlib.metadata as md, platform, torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "available", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
for name in ("transformers", "tokenizers", "numpy", "pyarrow", "triton", "torchao", "pydantic", "fastapi",
             "starlette", "uvicorn", "safetensors", "prometheus-client", "protobuf", "nvidia-ml-py"):
    try:
        print(f"  {name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"  {name} MISSING")
import lmforge.inference.api, lmforge.trainer.train, lmforge.trainer.float8, torchao.float8  # noqa: F401,E401
print("imports ok")
EOF

# part NAME SECONDS COMMAND...: run COMMAND for at most SECONDS, and never past the budget.
part() {
  local name=$1 want=$2 left t0 rc
  shift 2
  left=$((BUDGET - ($(date +%s) - START)))
  ((left < want)) && want=$left
  if ((want < 30)); then
    echo "### $name: skipped, ${left}s of the budget left"
    return
  fi
  echo "### $(date -u +%T) $name: up to ${want}s: $*"
  t0=$(date +%s)
  timeout -k 10 "$want" "$@"
  rc=$?
  echo "### $(date -u +%T) $name: exit $rc after $(($(date +%s) - t0))s$([ $rc = 124 ] && echo ' (timed out)')"
}

if [ "$DEVICE" = cuda ]; then
  TRAIN=(--seq-len 1024 --batch 16 --gpu-steps 30 --row-timeout 170)
  A_PRESETS=350m,llama-350m,llama-1b F8=llama-1b FP32=350m
  SERVE=(--suite gpu --rounds 1)
  HF=(--clients 64 16 1 --rounds 1 --compile "${HF_COMPILE:-auto}")  # the goal's row first
  MEMORY=(--device cuda --preset 350m --ranks 1)
  MASKING=()
else  # the same code paths on CPU, tiny models
  TRAIN=(--device cpu --seq-len 32 --batch 4 --gpu-steps 6 --no-compile --row-timeout 120)
  A_PRESETS=tiny,llama-debug F8=llama-debug FP32=tiny
  SERVE=(--suite gpu --device cpu --preset tiny --clients 1 4 --requests 4 --max-tokens 8 --rounds 1)
  HF=(--device cpu --preset tiny --clients 4 1 --requests 4 --max-tokens 8 --rounds 1)
  MEMORY=(--device cpu --preset tiny --ranks 1)
  MASKING=(--smoke)
fi

part "A training bf16" 230 "$PY" bench/train_throughput.py --suite gpu "${TRAIN[@]}" --preset "$A_PRESETS" \
  --runs plain --out "$OUT"
part "B serving" 130 "$PY" bench/serve/serve_bench.py "${SERVE[@]}" --out "$OUT/serve-gpu.json"
for log in bench/out/serve/server-gpu-running*.log; do  # one per preset
  [ -f "$log" ] && cp "$log" "$OUT/serve-$(basename "$log")"
done
part "B2 serving baseline: HF generate" 150 "$PY" bench/serve/hf_generate_bench.py "${HF[@]}" \
  --out "$OUT/hf-generate-gpu.json"
if [ -f "$OUT/serve-gpu.json" ] && [ -f "$OUT/hf-generate-gpu.json" ]; then  # seconds; both JSONs hold what finished
  "$PY" bench/serve/serve_vs_hf.py --serve "$OUT/serve-gpu.json" --hf "$OUT/hf-generate-gpu.json" \
    --out "$OUT/serve-vs-hf-gpu.json"
fi
part "C training memory" 60 "$PY" bench/train_memory.py "${MEMORY[@]}" --out "$OUT"
BASELINE=()  # A's llama-1b bf16 row, for the ratios (the JSON is there once A finished a row)
[ -f "$OUT/train-throughput-gpu.json" ] && BASELINE=(--baseline "$OUT/train-throughput-gpu.json")
part "D1 training float8 + act. ckpt" 170 "$PY" bench/train_throughput.py --suite gpu "${TRAIN[@]}" --preset "$F8" \
  --float8-preset "$F8" --runs float8,ac "${BASELINE[@]}" --tag float8-ac --out "$OUT"
part "D2 training fp32" 120 "$PY" bench/train_throughput.py --suite gpu "${TRAIN[@]}" --preset "$FP32" \
  --runs fp32 --tag fp32 --out "$OUT"
part "E document masking at 32k" 120 "$PY" bench/train_document_masking.py "${MASKING[@]}" --out "$OUT"
echo "### $(date -u +%T) done after $(($(date +%s) - START))s"
ls -l "$OUT"
sleep 1  # let tee write the last lines into device_run.log
