#!/usr/bin/env bash
# One command for a GPU machine: correctness on CUDA, then the measurements,
# each part leaving a log and a Parquet export in OUT_DIR (docs/gpu.md).
#
#   scripts/gpu_harvest.sh OUT_DIR [PART ...]          on a GPU machine; PART 1..9, default all
#   scripts/gpu_harvest.sh --rehearse OUT_DIR [PART ...]   anywhere: every step that needs no GPU
#
# Parts (estimated H100 minutes in docs/gpu.md; each is cut at HARVEST_PART_TIMEOUT seconds):
#   1 tests       the exactness and contract tests on CUDA, 8 workers (junit.xml + log.txt)
#   2 dilated     bench_dilated (LongNet config, sdpa and triton, best dense backend) + bench_compile on CUDA
#   3 sparse      bench_block_sparse: every pattern at N=65536, fwd and fwd+bwd; BlockMask build at N=1M
#   4 std-bf16    the standard sweep's bf16 rows with NVML telemetry
#   5 std-fp32    the standard sweep's fp32 rows with NVML telemetry
#   6 maxlen      dilcompile maxlen: longest forward N, H=8, D=64, bf16
#   7 serving     bench_hf_serving: compiled static-cache decode (CUDA graphs), bf16, both models
#   8 tune        tune_triton: the kernels' tile / walk / warps / stages candidates at head dim 128, interleaved;
#                 bench_sdpa_merge: the sdpa path's merge, call-sharing and input-layout A/Bs
#   9 causal      bench_dilated as part 2, causal (eager and compiled; η against causal dense)
# Each part: DuckDB in $HARVEST_TMP, export (sweeps/measurements/telemetry.parquet) and log.txt in
# OUT_DIR/p<k>-<name>/ — at most 4 files a part, so any two parts fit the 8 files a call brings back.
#
# Missing packages come as wheels in .whl/ at the repo root (git-ignored) and install into
# $HARVEST_SITE with no network. Environment: PYTHON (python3), HARVEST_WHEELS (.whl),
# HARVEST_SITE (/tmp/site), HARVEST_TMP (/tmp/dilcompile-harvest), HARVEST_PART_TIMEOUT (530).
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
WHEELS="${HARVEST_WHEELS:-$REPO/.whl}"
SITE="${HARVEST_SITE:-/tmp/site}"
TMP="${HARVEST_TMP:-/tmp/dilcompile-harvest}"
PART_TIMEOUT="${HARVEST_PART_TIMEOUT:-530}"
NAMES=(_ tests dilated sparse std-bf16 std-fp32 maxlen serving tune causal)

usage() {
  echo "usage: scripts/gpu_harvest.sh [--rehearse] OUT_DIR [PART ...]   (PART: 1..9 or all; see the header)" >&2
  exit 2
}

REHEARSE=0
if [[ "${1:-}" == "--rehearse" ]]; then REHEARSE=1; shift; fi
[[ $# -ge 1 && "$1" != -* ]] || usage
OUT="$1"; shift
PARTS=()
for p in "${@:-all}"; do
  case "$p" in
    all) PARTS+=(1 2 3 4 5 6 7 8 9) ;;
    [1-9]) PARTS+=("$p") ;;
    *) echo "gpu_harvest: unknown part '$p': give 1..9 or all" >&2; usage ;;
  esac
done

log() { echo "[gpu_harvest $(date -u +%H:%M:%S)] $*"; }

install_wheels() {
  shopt -s nullglob
  local wheels=("$WHEELS"/*.whl)
  shopt -u nullglob
  if [[ ${#wheels[@]} -eq 0 ]]; then
    log "no wheels in $WHEELS: nothing to install"
  else
    mkdir -p "$SITE"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
      "${wheels[@]}" || { echo "gpu_harvest: installing ${wheels[*]} into $SITE failed" >&2; exit 4; }
    log "installed ${#wheels[@]} wheel(s) from $WHEELS into $SITE"
  fi
  export PYTHONPATH="$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}"
}

check_imports() {
  "$PY" -c "import torch, duckdb, dilcompile" 2>&1 || {
    echo "gpu_harvest: torch, duckdb and dilcompile must import (put the duckdb wheel in $WHEELS)" >&2; exit 4; }
}

# export DB DIR: the part's runs as Parquet, then its one-line summary.
export_part() {
  if [[ -f "$1" ]]; then
    "$PY" -m dilcompile runs export "$2" --db "$1" && "$PY" "$REPO/scripts/gpu_harvest.py" summary "$2"
  else
    log "no run store at $1: nothing to export"
  fi
}

# step DIR CMD...: run CMD with the part's time limit, output appended to DIR/log.txt and shown.
step() {
  local dir="$1"; shift
  log "\$ $*" | tee -a "$dir/log.txt"
  timeout --signal=INT --kill-after=20 "$PART_TIMEOUT" "$@" 2>&1 | tee -a "$dir/log.txt"
  local rc=${PIPESTATUS[0]}
  if [[ $rc -eq 124 ]]; then log "cut at ${PART_TIMEOUT}s (exit status 124)" | tee -a "$dir/log.txt"
  elif [[ $rc -ne 0 ]]; then log "exit status $rc" | tee -a "$dir/log.txt"; fi
  return 0
}

run_part() {
  local k="$1" name="${NAMES[$1]}" dir="$OUT/p$1-${NAMES[$1]}" db="$TMP/p$1.duckdb"
  mkdir -p "$dir" "$TMP"
  rm -f "$db" "$db.wal"
  local start=$SECONDS
  log "part $k ($name) → $dir" | tee -a "$dir/log.txt"
  case "$k" in
    1) step "$dir" env DILCOMPILE_TEST_DEVICE=cuda DILCOMPILE_TEST_THREADS=2 "$PY" -m pytest -n 8 -v -p no:cacheprovider \
         -o console_output_style=count --timeout=300 --junitxml="$dir/junit.xml" \
         tests/test_dilated.py tests/test_dilated_reference.py tests/test_dilated_compile.py tests/test_triton.py \
         tests/test_triton_merge.py tests/test_block_sparse.py tests/test_multihead.py \
         tests/test_multihead_block_sparse.py tests/test_varlen.py tests/test_ring.py tests/test_ring_multihead.py \
         tests/test_ring_agreement.py tests/test_profile.py tests/test_telemetry.py tests/test_compiler_lowering.py \
         tests/test_kernel_arguments.py tests/test_cuda_training.py tests/test_bench_dilated.py tests/test_numerics.py ;;
    2) step "$dir" "$PY" scripts/bench_dilated.py --preset longnet --device cuda --dtype bfloat16 \
         --impls sdpa triton --passes fwd fwd_bwd --dense-backends best --db "$db"
       step "$dir" "$PY" scripts/bench_compile.py --device cuda --seq-lens 65536 16384 32768 131072 --heads 16 \
         --head-dim 128 --dtype bfloat16 --passes fwd fwd_bwd --impls sdpa triton \
         --segments 2048 4096 8192 16384 32768 --rates 1 2 4 8 16 --db "$db" ;;
    3) step "$dir" "$PY" scripts/bench_block_sparse.py --device cuda --dtype bfloat16 --seq-lens 65536 --heads 16 \
         --head-dim 128 --passes fwd --rounds 1 --mask-n 1048576 --db "$db"
       step "$dir" "$PY" scripts/bench_block_sparse.py --device cuda --dtype bfloat16 --seq-lens 65536 --heads 16 \
         --head-dim 128 --passes fwd_bwd --rounds 1 --mask-n 0 --db "$db" ;;
    4) step "$dir" "$PY" scripts/gpu_harvest.py sweep --dtype bfloat16 --device cuda --db "$db" ;;
    5) step "$dir" "$PY" scripts/gpu_harvest.py sweep --dtype float32 --device cuda --db "$db" ;;
    6) step "$dir" "$PY" -m dilcompile maxlen --variant dilated --dtype bfloat16 --heads 8 --head-dim 64 \
         --segments 2048 4096 8192 16384 --rates 1 2 4 8 --start 1048576 --limit 67108864 \
         --granularity 1048576 --timeout 90 --repeats 2 --device cuda --db "$db" ;;
    7) step "$dir" "$PY" scripts/bench_hf_serving.py --device cuda --contexts 1024 16384 131072 --batches 1 \
         --rounds 3 --db "$db"
       step "$dir" "$PY" scripts/bench_hf_serving.py --device cuda --model large --contexts 16384 --batches 1 4 \
         --rounds 3 --db "$db" ;;
    8) step "$dir" "$PY" scripts/tune_triton.py --dims 128 --prewarm 8 --db "$db"
       step "$dir" "$PY" scripts/bench_sdpa_merge.py --db "$db" ;;
    9) step "$dir" "$PY" scripts/bench_dilated.py --preset longnet --device cuda --dtype bfloat16 --causal \
         --impls sdpa triton --passes fwd fwd_bwd --dense-backends best --db "$db" ;;
  esac
  [[ "$k" == 1 ]] || export_part "$db" "$dir" 2>&1 | tee -a "$dir/log.txt"
  log "part $k ($name) done in $((SECONDS - start)) s" | tee -a "$dir/log.txt"
}

rehearse() {
  local dir="$OUT/rehearsal" db="$TMP/rehearsal.duckdb"
  mkdir -p "$dir" "$TMP"
  rm -f "$db" "$db.wal"
  for k in "${PARTS[@]}"; do log "part $k (${NAMES[$k]}) would write $OUT/p$k-${NAMES[$k]}/"; done
  "$PY" -m dilcompile profile --device cpu --variant sdpa --variant dilated --seq-len 64 --heads 2 --head-dim 8 \
    --segments 16 32 --rates 1 2 --warmup 0 --repeats 3 --no-progress --db "$db" >/dev/null \
    || { echo "gpu_harvest: the rehearsal's CPU profile failed" >&2; exit 1; }
  export_part "$db" "$dir" || { echo "gpu_harvest: the rehearsal's export failed" >&2; exit 1; }
  "$PY" "$REPO/scripts/gpu_harvest.py" check-out "$OUT" || exit 1
  log "rehearsal ok"
}

cd "$REPO"
mkdir -p "$OUT" || { echo "gpu_harvest: cannot create OUT_DIR $OUT" >&2; exit 2; }
OUT="$(cd "$OUT" && pwd)"
install_wheels
check_imports
if [[ $REHEARSE -eq 1 ]]; then rehearse; exit 0; fi
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" || {
  echo "gpu_harvest: torch sees no CUDA device (parts 1..9 need one); on a CPU machine use --rehearse" >&2; exit 3; }
log "$("$PY" -c "import torch; print(torch.cuda.get_device_name(), 'torch', torch.__version__, 'CUDA', torch.version.cuda)")"
for k in "${PARTS[@]}"; do run_part "$k"; done
"$PY" "$REPO/scripts/gpu_harvest.py" check-out "$OUT" || true
log "done: parts ${PARTS[*]} in $OUT"
