#!/usr/bin/env bash
# The GPU check: one command, on a machine with an NVIDIA GPU and PyTorch 2.11.0+cu130 in its
# python3, run from the repository root with .gpu-bundle/sluice-gpu.tar.xz (scripts/gpu-bundle.sh)
# beside it. docs/GPU.md says how to run it.
#
#  1. nvidia-smi;
#  2. resnet18_gpu exported for this GPU (tools/export_models.py --device cuda);
#  3. `sluice serve` with the three variants on the GPU, their answers checked against PyTorch
#     eager fp32 (tools/gpu_agreement.py: one batch, then 1,024 requests 64 at once, every answer
#     against its own images' eager logits), `sluice bench --url` at 64 connections of binary UINT8
#     images against two of them;
#  4. batch 1 with one request in flight;
#  5. in process (`sluice sweep`): batch 1, 32, 128, 256 x {fp32, fp16 + CUDA graphs, AOTInductor
#     fp16} x instances 1, 2, 4: samples/s, p50/p99, GPU utilisation;
#  6. Python's torch.compile(mode="reduce-overhead") loop on the same model and work;
#  7. language models (LLM_SHAPES, default smollm2-135m and qwen2.5-0.5b; random weights from
#     tools/random_llm.py): Sluice's device executor (bf16, int8, then int4 weights) against its
#     CPU decoder (fp32) on fixed prompts (same next token >= 90%; int4 70%), its decoding at 1
#     and 64 streams (TPOT, ITL p99, tokens/s; bf16 also with llm.cuda_graphs: false), a
#     960-token prompt's prefill alone, and
#     benchmarks/gpu_llm_baseline.py's PyTorch loop
#     beside it (eager, static cache + torch.compile(mode="reduce-overhead"), int8 weights) at
#     batch 1.
# LLM_ONLY=1 runs only step 7 (with steps 1 and the bundle's unpacking).
# Everything goes under $OUT (default results/gpu-check-<time>): check.log, inprocess.csv,
# python_baseline.csv, agreement.json, served_<model>.json, report.html, metrics.txt.
# Without a GPU it exits 2 with one line saying so. Each step is bounded by a timeout and a failed
# step does not stop the others; the exit status is 1 when any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no NVIDIA GPU on this machine (nvidia-smi finds none); nothing to check" >&2
  exit 2
fi
OUT=${OUT:-results/gpu-check-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/check.log") 2>&1
PY=${PYTHON:-python3}
BUNDLE=${BUNDLE:-.gpu-bundle/sluice-gpu.tar.xz}
WORK=${WORK:-/tmp/sluice-gpu-check}
QUICK=${QUICK:-0}  # 1: instances 1 only, fewer iterations (a rerun that must be short).
LLM_ONLY=${LLM_ONLY:-0}
LLM_SHAPES=${LLM_SHAPES:-smollm2-135m qwen2.5-0.5b}
[ "$QUICK" = 1 ] && LLM_SHAPES=${LLM_SHAPES_QUICK:-smollm2-135m}
failed=()
step() { echo; echo "=== $1 ($(date +%T))"; }

step "nvidia-smi"
nvidia-smi
lscpu 2>/dev/null | grep -E "^Model name|^CPU\(s\)"  # The host CPU, to name beside the figures.

step "unpack the bundle"
rm -rf "$WORK" && mkdir -p "$WORK" || exit 1
tar -C "$WORK" -xJf "$BUNDLE" || { echo "gpu-check: cannot unpack $BUNDLE (scripts/gpu-bundle.sh)"; exit 1; }
TORCH_DIR=$($PY -c 'import torch; print(torch.__path__[0])')
$PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'
NV_LIBS=$(ls -d "$(dirname "$TORCH_DIR")"/nvidia/*/lib 2>/dev/null | tr '\n' ':')
# Only Sluice sees the bundle's libraries; python3 keeps its own.
SLUICE_LD="$WORK/sluice-gpu/lib:$TORCH_DIR/lib:${NV_LIBS}${LD_LIBRARY_PATH:-}"
sluice() { LD_LIBRARY_PATH="$SLUICE_LD" "$WORK/sluice-gpu/sluice" "$@"; }
if ! sluice --help >/dev/null; then
  echo "gpu-check: the bundled sluice does not start"
  LD_LIBRARY_PATH="$SLUICE_LD" ldd "$WORK/sluice-gpu/sluice" | grep "not found"
  exit 1
fi

MODELS="$WORK/models"
if [ "$LLM_ONLY" != 1 ]; then
step "export resnet18_gpu for this GPU"
if ! timeout 420 $PY tools/export_models.py --device cuda --out "$MODELS"; then
  failed+=(export)
fi

# A model directory per variant: the exported files linked, the config written for it.
variant_dir() {  # name precision backend cuda_graphs
  local d="$MODELS/$1"
  mkdir -p "$d"
  for f in model.pt model_fp16.pt2; do
    [ -e "$MODELS/resnet18_gpu/$f" ] && ln -sf "$MODELS/resnet18_gpu/$f" "$d/$f"
  done
  $PY - "$d" "$2" "$3" "$4" <<'PYEOF'
import sys
sys.path.insert(0, "tools")
import export_models
d, precision, backend, graphs = sys.argv[1:]
with open(f"{d}/config.yaml", "w") as f:
    f.write(export_models.gpu_config(precision, backend, graphs == "true"))
PYEOF
}
variant_dir gpu_fp32 fp32 torchscript false
variant_dir gpu_fp16_graphs fp16 torchscript true
variant_dir gpu_aoti fp16 aotinductor false

step "served: the three variants in one sluice serve; their answers against eager fp32; sluice bench --url at 64 connections of binary UINT8 images"
PORT=${PORT:-18080}
LD_LIBRARY_PATH="$SLUICE_LD" "$WORK/sluice-gpu/sluice" serve --model-repository "$MODELS" \
  --model gpu_fp32 --model gpu_fp16_graphs --model gpu_aoti \
  --port "$PORT" --io-threads 4 > "$WORK/serve.log" 2>&1 &
SERVER=$!
listening=0
for _ in $(seq 1 360); do
  grep -q "Sluice listening" "$WORK/serve.log" && { listening=1; break; }
  kill -0 $SERVER 2>/dev/null || break
  sleep 0.5
done
grep -E "loaded model|failed to load" "$WORK/serve.log" | cut -c1-400
if [ $listening = 1 ]; then
  timeout 240 $PY tools/gpu_agreement.py --url "http://127.0.0.1:$PORT" --out "$OUT/agreement.json" \
    --models gpu_fp32:fp32 gpu_fp16_graphs:fp16 gpu_aoti:fp16 --concurrency 64 --requests 1024 \
    || failed+=(agreement)
  DURATION=15; [ "$QUICK" = 1 ] && DURATION=6
  for m in gpu_fp16_graphs gpu_aoti; do
    grep -q "loaded model '$m'" "$WORK/serve.log" || { failed+=("served-$m"); continue; }
    rm -rf "$WORK/served" && mkdir -p "$WORK/served"
    # /metrics while the load runs: the GPU's utilisation as the server reports it.
    (sleep $((DURATION / 2 + 3)); $PY -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$PORT/metrics').read().decode())" > "$OUT/metrics.txt" 2>&1) &
    SCRAPER=$!
    if timeout 120 env LD_LIBRARY_PATH="$SLUICE_LD" "$WORK/sluice-gpu/sluice" bench \
        --url "http://127.0.0.1:$PORT" --model "$m" --binary --concurrency 64 \
        --duration "$DURATION" --warmup 3 --results-dir "$WORK/served"; then
      dir=$(ls -d "$WORK"/served/*/ | head -1)
      cp "$dir/summary.json" "$OUT/served_$m.json" 2>/dev/null
      [ $m = gpu_fp16_graphs ] && cp "$dir/report.html" "$OUT/report.html" 2>/dev/null
    else
      failed+=("served-$m")
    fi
    wait $SCRAPER
    grep -E "^sluice_gpu" "$OUT/metrics.txt"
  done
else
  echo "gpu-check: the server did not start"; failed+=(served)
fi
kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null
tail -5 "$WORK/serve.log"

step "batch 1, one request in flight (latency)"
for m in gpu_fp16_graphs gpu_aoti; do
  timeout 90 env LD_LIBRARY_PATH="$SLUICE_LD" "$WORK/sluice-gpu/sluice" bench --in-process \
    --model-dir "$MODELS/$m" -b 1 --max-in-flight 1 --iters 2000 --no-results \
    | grep -E "samples/s|p50|p99|Latency|latency|Throughput" || failed+=("latency-$m")
done

step "in process: batch 1, 32, 128, 256 x variants x instances"
INSTANCES="1 2 4"; ITERS=300
[ "$QUICK" = 1 ] && INSTANCES="1" && ITERS=200
echo "variant,instances,$(echo 'batch_size,backend,precision,requests,errors,samples_per_s,requests_per_s,latency_mean_s,latency_std_s,latency_min_s,latency_max_s,p50_s,p90_s,p95_s,p99_s,warmup_latency_s,machine_cpu_pct,process_cpu_pct,model_load_s,optimize_s,gpu_util_pct,gpu_mem_mib')" > "$OUT/inprocess.csv"
for variant in gpu_fp32 gpu_fp16_graphs gpu_aoti; do
  case $variant in
    gpu_fp32) args=(--backends torchscript+freeze --precisions fp32) ;;
    gpu_fp16_graphs) args=(--backends torchscript+freeze --precisions fp16) ;;
    gpu_aoti) args=(--backends aotinductor --precisions fp16) ;;
  esac
  for n in $INSTANCES; do
    echo "--- $variant, $n instance(s)"
    rm -rf "$WORK/sweep" && mkdir -p "$WORK/sweep"
    if timeout 150 env LD_LIBRARY_PATH="$SLUICE_LD" "$WORK/sluice-gpu/sluice" sweep --model-dir "$MODELS/$variant" \
        --workers "$n" "${args[@]}" --batch-sizes 1,32,128,256 --iters "$ITERS" \
        --results-dir "$WORK/sweep" | grep -vE "^(Results|Plots|Report| +/)"; then
      csv=$(ls "$WORK"/sweep/*/summary.csv 2>/dev/null | head -1)
      [ -n "$csv" ] && tail -n +2 "$csv" | sed "s/^/$variant,$n,/" >> "$OUT/inprocess.csv"
    else
      failed+=("inprocess-$variant-$n")
    fi
  done
done

step "Python: torch.compile(mode=\"reduce-overhead\") on the same model and work"
PY_SECONDS=2; [ "$QUICK" = 1 ] && PY_SECONDS=1
if timeout 300 $PY benchmarks/gpu_python_baseline.py --out "$WORK/python" --seconds "$PY_SECONDS"; then
  cp "$WORK/python/python_baseline.csv" "$OUT/"
else
  failed+=(python)
fi

fi  # LLM_ONLY

step "language models: the device executor against the CPU decoder; 1 and 64 streams; PyTorch's loop"
echo "llm,shape,line" > "$OUT/llm.csv"
for shape in $LLM_SHAPES; do
  d="$WORK/llm/$shape"
  echo "--- $shape"
  if ! timeout 300 $PY tools/random_llm.py --shape "$shape" \
      --tokenizer "$WORK/sluice-gpu/llm-tokenizer" --out "$d"; then
    failed+=("llm-make-$shape"); continue
  fi
  printf 'instance_group: [{kind: KIND_GPU}]\nllm:\n  slots: 64\n  context_length: 1024\n' \
    > "$d/config.yaml"
  # int8: weight-only, a scale per row; int4: groups of 128 with a scale and offset each.
  for precision in bf16 int8 int4; do
    if timeout 300 env LD_LIBRARY_PATH="$SLUICE_LD" "$WORK/sluice-gpu/sluice" bench --llm \
        --in-process --model-dir "$d" --llm-device cpu --precision fp32 \
        --agreement "$precision@cuda:0" --output-tokens 32 | tee "$WORK/agreement.txt"; then
      same=$(grep -oE "same next token [0-9.]+" "$WORK/agreement.txt" | grep -oE "[0-9.]+$")
      # int4's rounding moves random weights' near-tied choices more: 70% for it.
      floor=90; [ "$precision" = int4 ] && floor=70
      awk -v s="${same:-0}" -v f="$floor" 'BEGIN { exit !(s >= f) }' ||
        failed+=("llm-agreement-$precision-$shape")
      grep -E "same next token|identical" "$WORK/agreement.txt" |
        sed "s/^/agreement-$precision,$shape,/" >> "$OUT/llm.csv"
    else
      failed+=("llm-agreement-$precision-$shape")
    fi
    if timeout 300 env LD_LIBRARY_PATH="$SLUICE_LD" "$WORK/sluice-gpu/sluice" bench --llm \
        --in-process --model-dir "$d" --precision "$precision" --concurrency 1,64 \
        --prompt-tokens 128 --output-tokens 128 --no-results | tee "$WORK/sluice_llm.txt"; then
      # The in-process line names the kernels: "decode graphs", or "decode graphs off (why)".
      grep -E "^(concurrency|in-process)" "$WORK/sluice_llm.txt" |
        sed "s/^/sluice-$precision,$shape,/" >> "$OUT/llm.csv"
    else
      failed+=("llm-sluice-$precision-$shape")
    fi
    # bf16 again with its decode steps launched op by op (llm.cuda_graphs: false): what the
    # graphs gain.
    if [ "$precision" = bf16 ]; then
      rm -rf "$d-op-by-op" && cp -rs "$(realpath "$d")" "$d-op-by-op" &&
        rm -f "$d-op-by-op/config.yaml" &&
        { cat "$d/config.yaml"; printf '  cuda_graphs: false\n'; } > "$d-op-by-op/config.yaml"
      if timeout 300 env LD_LIBRARY_PATH="$SLUICE_LD" "$WORK/sluice-gpu/sluice" bench --llm \
          --in-process --model-dir "$d-op-by-op" --precision bf16 --concurrency 1,64 \
          --prompt-tokens 128 --output-tokens 128 --no-results | tee "$WORK/sluice_llm.txt"; then
        grep -E "^concurrency" "$WORK/sluice_llm.txt" |
          sed "s/^/sluice-bf16-op-by-op,$shape,/" >> "$OUT/llm.csv"
      else
        failed+=("llm-sluice-op-by-op-$shape")
      fi
    fi
    # A long prompt alone: int4's products run ATen's tinygemm kernel at every row count, bf16's
    # and int8's prompts cuBLAS; this line says whether int4's prefill needs another path.
    if timeout 300 env LD_LIBRARY_PATH="$SLUICE_LD" "$WORK/sluice-gpu/sluice" bench --llm \
        --in-process --model-dir "$d" --precision "$precision" --concurrency 1 \
        --prompt-tokens 960 --output-tokens 1 --requests 4 --no-results |
        tee "$WORK/sluice_prefill.txt"; then
      grep -E "^concurrency" "$WORK/sluice_prefill.txt" |
        sed "s/^/sluice-prefill960-$precision,$shape,/" >> "$OUT/llm.csv"
    else
      failed+=("llm-prefill-$precision-$shape")
    fi
  done
  if timeout 420 $PY benchmarks/gpu_llm_baseline.py --model "$d" --batch-sizes 1 --tokens 128 \
      --out "$OUT/llm_python_$shape.json" | tee "$WORK/python_llm.txt"; then
    grep -E "^gpu_llm_baseline" "$WORK/python_llm.txt" | sed "s/^/python,$shape,/" \
      >> "$OUT/llm.csv"
  else
    failed+=("llm-python-$shape")
  fi
  rm -rf "$d"
done

step "summary"
[ -f "$OUT/inprocess.csv" ] && $PY - "$OUT" <<'PYEOF'
import csv, json, os, sys
out = sys.argv[1]
rows = list(csv.DictReader(open(os.path.join(out, "inprocess.csv"))))
print(f"{'variant':<16} {'inst':>4} {'batch':>5} {'samples/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'gpu %':>6}")
for r in rows:
    print(f"{r['variant']:<16} {r['instances']:>4} {r['batch_size']:>5} {float(r['samples_per_s']):>10.0f} "
          f"{float(r['p50_s'])*1e3:>8.3f} {float(r['p99_s'])*1e3:>8.3f} {r['gpu_util_pct'] or '-':>6}")
p = os.path.join(out, "python_baseline.csv")
if os.path.exists(p):
    for r in csv.DictReader(open(p)):
        print(f"{'python r-o':<16} {'':>4} {r['batch_size']:>5} {float(r['samples_per_s']):>10.0f} "
              f"{float(r['p50_ms']):>8.3f} {float(r['p99_ms']):>8.3f}")
for m in ("gpu_fp16_graphs", "gpu_aoti"):
    s = os.path.join(out, f"served_{m}.json")
    if os.path.exists(s):
        level = json.load(open(s))["levels"][0]
        lat = level["latency_seconds"]
        print(f"served {m}: {level['samples_per_second']:.0f} samples/s at 64 connections, "
              f"p50 {lat['p50']*1e3:.2f} ms, p99 {lat['p99']*1e3:.2f} ms, errors {level['errors']}, "
              f"mean batch {level.get('server_mean_batch_size', 0):.1f}, "
              f"gpu {level['utilization'].get('gpu_percent')} %")
PYEOF
echo "language models (llm.csv):"
tail -n +2 "$OUT/llm.csv"
if [ ${#failed[@]} -gt 0 ]; then
  echo "gpu-check: failed steps: ${failed[*]}"
  exit 1
fi
echo "gpu-check: every step ran; results in $OUT"
