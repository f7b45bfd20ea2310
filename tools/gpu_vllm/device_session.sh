#!/bin/bash
# Runs ON THE LENT H200, in the repository root (the `run` tool's working copy), as every device call's command:
#
#   bash tools/gpu_vllm/device_session.sh [graphs] [eager]
#
# 1. Staging: copies whatever payload part folders this call carries (.p0, .p1, ...; `tools/gpu_vllm_run.py
#    stage` makes them) into /tmp/payload. While parts are missing it says which and exits 0: such a call only
#    stages. Once all parts are there: ../shared/gpu-vllm/install.sh -> /tmp/site (vLLM 0.26.0), servescope's
#    wheel (+ deflate, pyahocorasick) -> /tmp/ss-site, make_models.py -> /tmp/models. All of /tmp survives only while the
#    machine stays warm (~30 s between calls), so later calls reuse it with no carry, or stage again.
# 2. Each plan word starts two real vLLM servers side by side on the one GPU (dense llama8b-16l on :8001, MoE
#    qwen3moe-30b-12l on :8002; --kv-cache-memory-bytes so that neither sizes its KV cache from the other's
#    memory), torch profiler on, stacks off:
#      graphs: torch.compile + CUDA graphs (vLLM's default)      eager: --enforce-eager
#    The plan word `bench` instead starts the dense server alone (CUDA graphs, no profiler flags) for the load
#    study and the restart check (issue 14, items 4 and 6): health --wait through the load (GPU memory sampled
#    every 0.5 s beside it), gpu list/holders, `gpu wait-free` while the server holds the GPU (must fail naming
#    it), settings --pid --url at 80 and 200 columns (+ --json), bench serve with default workers at
#    BENCH_CONCURRENCY (1,8,32,128,256), 256 in / 128 out, --duration sized to the time left (BENCH_MAX_S per
#    point; 256 is dropped first when short), then `gpu wait-free` started just before SIGINT (must succeed;
#    its time from the SIGINT measured). settings at 80/200 columns runs on a pseudo-terminal (tty_capture.py). Key files straight to $OUT: bench.json, bench.txt, waitfree.txt,
#    settings-80.txt, settings-200.txt.
#    The plan words `scaled` (API_SERVERS front ends, default 4) and `anchor` (one) start the dense server alone
#    with `vllm serve --api-server-count N` (CUDA graphs, no profiler), wait for it with `health --wait` piped
#    (its lasting lines show the load; nvidia-smi samples the memory beside it), then run, in SWEEP_ORDER,
#    servescope's bench serve (defaults, BENCH_MAX_S per point) and `vllm bench serve` (the anchor: random
#    256 in / 128 out, --ignore-eos, ~20 s a point, the server's /metrics saved before and after each point)
#    on BENCH_CONCURRENCY.
#    Each capture profiles 8 engine steps from the 20th after /start_profile (PROFILE_DELAY, PROFILE_STEPS):
#    decode steps of all B requests, past the steps in which the front end admits them.
#    and runs the loop with servescope as the only client: health --wait (through the load), gpu list / holders,
#    settings --pid --url, profile at batch 1/16/64 (each capture = the rank trace, the front end's trace and
#    vLLM's own profiler_out_0.txt, moved out of the profiler dir, plus provenance.json), bench serve (graphs
#    only, short), then stops the servers.  A server that fails beside the other is retried alone without
#    --kv-cache-memory-bytes.
# 3. $OUT: captures.tar (captures/<flavour>-b<B>/...), logs-<plan>.tgz (server logs, health, settings, gpu,
#    bench, profile JSON), session.txt (the step log). Every step is bounded by the call's budget
#    (SESSION_BUDGET_S, default 570 s of the 600 s limit); what does not fit is skipped and named in session.txt.
set -u
T0=$(date +%s)
BUDGET=${SESSION_BUDGET_S:-570}
REPO=$(pwd)
OUTD=${OUT:-/tmp/out}; mkdir -p "$OUTD"
PAY=/tmp/payload SITE=/tmp/site SS_SITE=/tmp/ss-site MODELS=/tmp/models
W=/tmp/session; CAP=$W/captures
# The profiled window: engine steps DELAY .. DELAY+STEPS-1 after /start_profile (vLLM's delay_iterations /
# max_iterations). A real front end admits B concurrent streams over several steps (at B=64 over ~10-13 steps
# on this machine), so a window from the first step holds mostly mixed prefill/decode steps; from step 20 on,
# with every request asking for DELAY+STEPS+14 tokens, each profiled step is a decode step of all B requests.
DELAY=${PROFILE_DELAY:-20}
STEPS=${PROFILE_STEPS:-8}
TOKENS=${PROFILE_TOKENS:-$(( DELAY + STEPS + 14 ))}
BATCHES=${BATCHES:-16 1 64}
INPUT_TOKENS=${INPUT_TOKENS:-32}
KV_BYTES=${KV_BYTES:-8589934592}    # 8 GiB of KV cache per server (dense: 128k tokens, MoE: 341k)
mkdir -p "$W" "$CAP"
LOG=$W/session.txt
say() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG"; }
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }

pack() {   # everything that comes back; called once at the end (and on the way out of a staging-only call)
  # a file comes back only under 16 MiB: one tar while the captures fit, else one per capture folder
  if [ -n "$(ls -A "$CAP" 2>/dev/null)" ]; then
    if [ "$(du -sm "$CAP" | cut -f1)" -lt 15 ]; then ( cd "$W" && tar cf "$OUTD/captures.tar" captures )
    else for d in "$CAP"/*/; do n=$(basename "$d"); ( cd "$W" && tar cf "$OUTD/captures-$n.tar" "captures/$n" ); done; fi
  fi
  if ls "$W"/logs >/dev/null 2>&1; then ( cd "$W" && tar czf "$OUTD/logs-${PLAN_NAME:-none}.tgz" logs ); fi
  cp "$LOG" "$OUTD/session.txt" 2>/dev/null
  ls -la "$OUTD"
}

# ---------- 1. staging, install ----------
mkdir -p "$PAY"
for d in "$REPO"/.p[0-9]*; do
  [ -d "$d" ] || continue
  cp "$d"/* "$PAY"/ && say "staged $(basename "$d"): $(ls "$d" | tr '\n' ' ')"
done
if [ ! -f $SITE/.installed ]; then
  if [ ! -f $PAY/SHA256SUMS ] || [ ! -f $PAY/install.sh ]; then
    say "payload incomplete: no SHA256SUMS/install.sh yet (they come with the last part); have: $(ls $PAY | tr '\n' ' ')"
    pack; exit 0
  fi
  want=$(grep -c " vllm-site.tar.xz.part-" $PAY/SHA256SUMS); have=$(ls $PAY/vllm-site.tar.xz.part-* 2>/dev/null | wc -l)
  if [ "$have" -lt "$want" ]; then say "payload: $have of $want parts here; stage the rest"; pack; exit 0; fi
  say "installing vLLM from $want parts"
  bash $PAY/install.sh $PAY $SITE > $W/install.log 2>&1 || { tail -30 $W/install.log; say "install FAILED"; pack; exit 1; }
  tail -3 $W/install.log | tee -a "$LOG"; touch $SITE/.installed; rm -f $PAY/vllm-site.tar.xz.part-*
fi
if ls $PAY/*.whl >/dev/null 2>&1; then
  rm -rf $SS_SITE
  python3 -m pip install -q --no-index --no-deps --no-compile --target $SS_SITE $PAY/*.whl > $W/ss-install.log 2>&1 \
    || { cat $W/ss-install.log; say "servescope wheel install FAILED"; }
  rm -f $PAY/*.whl
fi
[ -d $SS_SITE/servescope ] || { say "no servescope under $SS_SITE: carry the last part (it holds the wheel)"; pack; exit 1; }

export VLLM_USE_DEEP_GEMM=0   # DeepGEMM is not carried; fp8 uses CUTLASS scaled_mm
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 PYTHONUNBUFFERED=1
export VLLM_USE_FLASHINFER_SAMPLER=0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1   # must stay set
export PYTHONPATH=$SS_SITE:$SITE
SS="python3 -m servescope"
export VLLM_VERSION=$(python3 -c 'import vllm; print(vllm.__version__)' 2>/dev/null)
export TORCH_VERSION=$(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null)
export GPU_DESC=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
say "vllm $VLLM_VERSION, torch $TORCH_VERSION, $GPU_DESC, servescope $($SS --version 2>/dev/null | head -1) (commit $(cat $PAY/SERVESCOPE_COMMIT 2>/dev/null || echo unknown))"
export CAP_VLLM_VERSION=$VLLM_VERSION CAP_TORCH_VERSION=$TORCH_VERSION   # for provenance.py
unset VLLM_VERSION TORCH_VERSION   # not the server's: vLLM warns about unknown VLLM_* variables and settings lists them

if [ $# -eq 0 ]; then say "no plan words: install only"; pack; exit 0; fi
PLAN_NAME=$(echo "$@" | tr ' ' '_')

need_models=""
WANT_MODELS="llama8b-16l qwen3moe-30b-12l"
case "$*" in *graphs*|*eager*|*admit*|*ab-*|*steady-*|*repeat-*) ;; example) WANT_MODELS=qwen3moe-30b-12l ;; *) WANT_MODELS=llama8b-16l ;; esac
for m in $WANT_MODELS; do [ -f $MODELS/$m/config.json ] || need_models="$need_models $m"; done
if [ -n "$need_models" ]; then
  say "making models:$need_models"
  python3 $PAY/make_models.py $MODELS $need_models > $W/models.log 2>&1 || { tail -20 $W/models.log; say "models FAILED"; pack; exit 1; }
  grep params $W/models.log | tee -a "$LOG"
fi

# ---------- 2. servers ----------
declare -A PID PORT MODEL FLAGS READY FLAV
PORT[dense]=8001; MODEL[dense]=llama8b-16l
PORT[moe]=8002;  MODEL[moe]=qwen3moe-30b-12l

start_server() {   # start_server KEY FLAVOUR EXTRA...   (KEY = dense|moe)
  local key=$1 flav=$2; shift 2
  local name=$key-$flav prof=$W/prof/$key-$flav
  FLAV[$key]=$flav
  rm -rf "$prof"; mkdir -p "$prof" "$W/logs"
  FLAGS[$key]="--max-model-len 4096 --gpu-memory-utilization 0.4 --port ${PORT[$key]} --profiler-config.profiler=torch --profiler-config.torch_profiler_dir=$prof --profiler-config.torch_profiler_with_stack=${WITH_STACK:-false} --profiler-config.delay_iterations=$DELAY --profiler-config.max_iterations=$STEPS $*"
  # shellcheck disable=SC2086
  setsid python3 -m vllm.entrypoints.openai.api_server --model $MODELS/${MODEL[$key]} \
    --served-model-name ${MODEL[$key]} ${FLAGS[$key]} > "$W/logs/server-$name.log" 2>&1 &
  PID[$key]=$!
  say "started $name: pid ${PID[$key]} port ${PORT[$key]}: ${MODEL[$key]} $*"
}

wait_ready() {   # wait_ready FLAVOUR KEY...   (health --wait of each, side by side)
  local flav=$1; shift; local k hp=()
  for k in "$@"; do
    # what the call has left, less READY_RESERVE_S for the captures (a short SESSION_BUDGET_S leaves the server too
    # little: on 2026-12-05 a 330 s budget gave health --wait 103 s, and the MoE server needed ~110 cold)
    local name=$k-$flav to=$(( $(left) - ${READY_RESERVE_S:-120} )); [ $to -lt 60 ] && to=60
    $SS health http://127.0.0.1:${PORT[$k]} --wait --timeout $to --poll 2 --pid ${PID[$k]} \
      --log "$W/logs/server-$name.log" > "$W/logs/health-$name.txt" 2>&1 &
    hp+=("$!:$k")
  done
  for e in "${hp[@]}"; do
    local p=${e%%:*} k=${e#*:}; wait "$p"; local rc=$?
    READY[$k]=$rc; say "health --wait $k-$flav rc=$rc"; tail -4 "$W/logs/health-$k-$flav.txt" | sed 's/^/    /' | tee -a "$LOG"
  done
}

stop_server() {  # SIGINT to the API server, then the whole session
  local k=$1 p=${PID[$1]:-}; [ -n "$p" ] || return 0
  kill -INT "$p" 2>/dev/null
  for _ in $(seq 1 15); do kill -0 "$p" 2>/dev/null || break; sleep 1; done
  kill -TERM -- -"$p" 2>/dev/null; sleep 1; kill -KILL -- -"$p" 2>/dev/null
  for _ in $(seq 1 20); do pgrep -s "$p" >/dev/null 2>&1 || break; sleep 0.5; done
  say "stopped $k (pid $p)"; PID[$k]=""
}

take_window() {   # take_window PROF DEST keep|drop: once vLLM's table is written, move the window's files from the
  # profiler dir into DEST as rank0.pt.trace.json.gz (+ frontend.async_llm.pt.trace.json.gz, or dropped for size)
  local prof=$1 dest=$2 frontend=$3 f
  # vLLM writes profiler_out_0.txt after the traces; wait for it to settle, then take every file of this window
  for _ in $(seq 1 20); do [ -s "$prof/profiler_out_0.txt" ] && break; sleep 0.5; done
  sleep 1
  for f in "$prof"/*; do [ -f "$f" ] && mv "$f" "$dest/"; done
  ( cd "$dest" && for f in *.pt.trace.json.gz; do
      case $f in
        *async_llm*) if [ "$frontend" = keep ]; then mv "$f" frontend.async_llm.pt.trace.json.gz; else rm -f "$f"; fi ;;
        *) mv "$f" rank0.pt.trace.json.gz ;;
      esac
    done ) 2>/dev/null
}

capture() {   # capture KEY FLAVOUR BATCH TOKENS
  local k=$1 flav=$2 b=$3 n=$4 name=$1-$2-b$3 prof=$W/prof/$1-$2
  local dest=$CAP/$name
  rm -rf "$dest"; mkdir -p "$dest"
  local t=$(date +%s)
  timeout 150 $SS profile http://127.0.0.1:${PORT[$k]} --batch "$b" --output-tokens "$n" --input-tokens $INPUT_TOKENS \
    --trace-dir "$prof" --trace-timeout 90 --json -o "$W/logs/profile-$name.json" > "$W/logs/profile-$name.out" 2>&1
  local rc=$?
  take_window "$prof" "$dest" keep
  cp "$W/logs/settings-$k-$flav.json" "$dest/settings.json" 2>/dev/null
  grep -m 20 -E "Asynchronous scheduling|async|cudagraph|CUDA graph|quantiz|Chunked|max_num" "$W/logs/server-$k-$flav.log" \
    | cut -c1-400 > "$dest/server-log-lines.txt" 2>/dev/null
  python3 "$REPO/tools/gpu_vllm/provenance.py" "$dest" "$W/logs/profile-$name.json" "$flav" "$DELAY" "$STEPS" \
    "$MODELS/${MODEL[$k]}/config.json" "${FLAGS[$k]}" >> "$LOG" 2>&1
  say "capture $name rc=$rc in $(( $(date +%s) - t ))s"
  [ $rc -eq 0 ] || tail -5 "$W/logs/profile-$name.out" | sed 's/^/    /' | tee -a "$LOG"
}

loop_checks() {   # loop_checks FLAVOUR KEY...: gpu, settings (both servers up)
  local flav=$1; shift
  $SS gpu list > "$W/logs/gpu-list-$flav.txt" 2>&1; $SS gpu list --json > "$W/logs/gpu-list-$flav.json" 2>&1
  $SS gpu holders > "$W/logs/gpu-holders-$flav.txt" 2>&1; $SS gpu holders --json > "$W/logs/gpu-holders-$flav.json" 2>&1
  say "gpu holders:"; sed 's/^/    /' "$W/logs/gpu-holders-$flav.txt" | cut -c1-150 | head -12 | tee -a "$LOG"
  nvidia-smi > "$W/logs/nvidia-smi-$flav.txt" 2>&1
  for k in "$@"; do
    [ "${READY[$k]:-1}" = 0 ] || continue
    $SS settings --pid ${PID[$k]} --url http://127.0.0.1:${PORT[$k]} > "$W/logs/settings-$k-$flav.txt" 2>&1
    $SS settings --pid ${PID[$k]} --url http://127.0.0.1:${PORT[$k]} --json > "$W/logs/settings-$k-$flav.json" 2>&1
    say "settings $k-$flav rc=$? ($(wc -l < "$W/logs/settings-$k-$flav.txt") lines)"
  done
}

bench() {   # bench KEY FLAVOUR: a short sweep (the loop, not the load study)
  local k=$1 flav=$2 name=$1-$2
  [ "$(left)" -gt 90 ] || { say "skip bench $name: $(left)s left"; return; }
  local t=$(date +%s)
  timeout 80 $SS bench serve http://127.0.0.1:${PORT[$k]} --concurrency 1,16,64 --input-tokens 256 --output-tokens 64 \
    --json -o "$W/logs/bench-$name.json" > "$W/logs/bench-$name.out" 2>&1
  say "bench serve $name rc=$? in $(( $(date +%s) - t ))s"; tail -12 "$W/logs/bench-$name.out" | cut -c1-160 | tee -a "$LOG"
}

run_pair() {   # run_pair FLAVOUR TOKENS EXTRA_FLAGS...
  local flav=$1 n=$2; shift 2
  if [ "$(left)" -lt 200 ]; then say "skip $flav pair: $(left)s left"; return; fi
  start_server dense "$flav" --kv-cache-memory-bytes $KV_BYTES "$@"
  sleep 3
  start_server moe "$flav" --kv-cache-memory-bytes $KV_BYTES "$@"
  wait_ready "$flav" dense moe
  for k in dense moe; do   # a server that failed beside the other: once more, alone, as vLLM sizes it itself
    [ "${READY[$k]}" = 0 ] && continue
    stop_server $k
    if [ "$(left)" -lt 200 ]; then say "no time to retry $k-$flav"; continue; fi
    say "retrying $k-$flav alone"; start_server $k "$flav" "$@"; wait_ready "$flav" $k
  done
  loop_checks "$flav" dense moe
  # priority order: dense b16, moe b16, then the other batches
  local b
  for b in $BATCHES; do
    for k in dense moe; do
      [ "${READY[$k]}" = 0 ] || continue
      if [ "$(left)" -lt 45 ]; then say "skip capture $k-$flav-b$b: $(left)s left"; continue; fi
      capture $k "$flav" "$b" "$n"
    done
  done
  if [ "$flav" = graphs ]; then for k in dense moe; do [ "${READY[$k]}" = 0 ] && bench $k "$flav"; done; fi
  stop_server dense; stop_server moe
  ls "$W"/prof/*/ 2>/dev/null | head -5
}

run_ab() {   # run_ab KEY_A MODEL_A FLAV_A "FLAGS_A" KEY_B MODEL_B FLAV_B "FLAGS_B": two servers side by side, each
  # captured at AB_BATCHES (profile also runs each batch once without the profiler: the server's own /metrics)
  if [ "$(left)" -lt 200 ]; then say "skip ab $3/$7: $(left)s left"; return; fi
  local ka=$1 kb=$5
  MODEL[$ka]=$2; MODEL[$kb]=$6; PORT[$ka]=8001; PORT[$kb]=8002
  local fa=$3 fb=$7 ga=$4 gb=$8
  # shellcheck disable=SC2086
  WITH_STACK=${STACK_A:-false} start_server $ka "$fa" --kv-cache-memory-bytes $KV_BYTES $ga
  sleep 3
  # shellcheck disable=SC2086
  WITH_STACK=${STACK_B:-false} start_server $kb "$fb" --kv-cache-memory-bytes $KV_BYTES $gb
  READY[$ka]=1; READY[$kb]=1
  local to=$(( $(left) - 120 )); [ $to -lt 60 ] && to=60
  $SS health http://127.0.0.1:${PORT[$ka]} --wait --timeout $to --poll 2 --pid ${PID[$ka]} --log "$W/logs/server-$ka-$fa.log" > "$W/logs/health-$ka-$fa.txt" 2>&1 &
  local pa=$!
  $SS health http://127.0.0.1:${PORT[$kb]} --wait --timeout $to --poll 2 --pid ${PID[$kb]} --log "$W/logs/server-$kb-$fb.log" > "$W/logs/health-$kb-$fb.txt" 2>&1
  READY[$kb]=$?; wait $pa; READY[$ka]=$?
  say "ready: $ka-$fa rc=${READY[$ka]}, $kb-$fb rc=${READY[$kb]}"
  local k f
  for k in $ka $kb; do
    f=${FLAV[$k]}
    if [ "${READY[$k]}" != 0 ]; then tail -15 "$W/logs/server-$k-$f.log" | cut -c1-200 | tee -a "$LOG"; continue; fi
    $SS settings --pid ${PID[$k]} --url http://127.0.0.1:${PORT[$k]} --json > "$W/logs/settings-$k-$f.json" 2>&1
    $SS settings --pid ${PID[$k]} --url http://127.0.0.1:${PORT[$k]} > "$W/logs/settings-$k-$f.txt" 2>&1
  done
  local b
  for b in ${AB_BATCHES:-16 1}; do
    for k in $ka $kb; do
      [ "${READY[$k]}" = 0 ] || continue
      if [ "$(left)" -lt 40 ]; then say "skip capture $k-${FLAV[$k]}-b$b: $(left)s left"; continue; fi
      capture_ab $k "${FLAV[$k]}" "$b"
    done
  done
  stop_server $ka; stop_server $kb
}

run_repeat() {   # run_repeat KEY MODEL FLAVOUR "FLAGS": one server alone (stacks REPEAT_STACK, default on), captured REPEATS times at each of
  # AB_BATCHES, back to back; folders MODELKIND-FLAVOUR-rR-bB (does the host's time repeat when no other server runs?)
  if [ "$(left)" -lt 200 ]; then say "skip repeat $3: $(left)s left"; return; fi
  local k=$1 flav=$3 g=$4 r b mk=dense
  case $2 in qwen3moe*) mk=moe ;; esac
  MODEL[$k]=$2; PORT[$k]=8001
  # shellcheck disable=SC2086
  WITH_STACK=${REPEAT_STACK:-true} start_server $k "$flav" --kv-cache-memory-bytes $KV_BYTES $g
  wait_ready "$flav" $k
  if [ "${READY[$k]}" != 0 ]; then tail -15 "$W/logs/server-$k-$flav.log" | cut -c1-200 | tee -a "$LOG"; stop_server $k; return; fi
  $SS settings --pid ${PID[$k]} --url http://127.0.0.1:${PORT[$k]} --json > "$W/logs/settings-$k-$flav.json" 2>&1
  for r in $(seq 1 "${REPEATS:-3}"); do
    for b in ${AB_BATCHES:-16 1}; do
      if [ "$(left)" -lt 40 ]; then say "skip capture $mk-$flav-r$r-b$b: $(left)s left"; continue; fi
      capture_ab $k "$flav" "$b"
      rm -rf "$CAP/$mk-$flav-r$r-b$b"; mv "$CAP/$mk-$flav-b$b" "$CAP/$mk-$flav-r$r-b$b"
    done
  done
  stop_server $k
}

capture_ab() {   # capture_ab KEY FLAVOUR BATCH: the capture folder is named MODELKIND-FLAVOUR-bB
  local k=$1 flav=$2 b=$3
  local mk=dense; case ${MODEL[$k]} in qwen3moe*) mk=moe ;; esac
  local name=$mk-$flav-b$b prof=$W/prof/$k-$flav dest=$CAP/$mk-$flav-b$b
  rm -rf "$dest"; mkdir -p "$dest"
  local t=$(date +%s)
  timeout 150 $SS profile http://127.0.0.1:${PORT[$k]} --batch "$b" --output-tokens "$TOKENS" --input-tokens $INPUT_TOKENS \
    --unprofiled-runs ${UNPROFILED_RUNS:-5} ${UNPROFILED_BATCHES:+--unprofiled-batches $UNPROFILED_BATCHES} \
    --trace-dir "$prof" --trace-timeout 90 --json -o "$W/logs/profile-$name.json" \
    > "$W/logs/profile-$name.out" 2>&1
  local rc=$?
  take_window "$prof" "$dest" drop
  cp "$W/logs/settings-$k-$flav.json" "$dest/settings.json" 2>/dev/null
  grep -E "Asynchronous scheduling|async_scheduling|cudagraph_capture_sizes|max_cudagraph|quantization|chunked|enforce_eager" \
    "$W/logs/server-$k-$flav.log" | head -8 | cut -c1-600 > "$dest/server-log-lines.txt" 2>/dev/null
  python3 "$REPO/tools/gpu_vllm/provenance.py" "$dest" "$W/logs/profile-$name.json" "$flav" "$DELAY" "$STEPS" \
    "$MODELS/${MODEL[$k]}/config.json" "${FLAGS[$k]}" >> "$LOG" 2>&1
  python3 - "$W/logs/profile-$name.json" <<'PY' >> "$LOG" 2>&1
import json, sys
d = json.load(open(sys.argv[1])); p = d.get("profile", {})
u, q = p.get("unprofiled_server") or {}, p.get("profiled_server") or {}
dec = [r["phases"].get("decode") for r in d["ranks"]]
runs = [r.get('itl_ms') for r in p.get('unprofiled_runs') or []]
timed = {t["batch"]: t.get("itl_ms") for t in p.get("unprofiled_batches") or []}
print(f"    unprofiled itl {u.get('itl_ms')} ms (runs {runs}) tpot {u.get('tpot_ms')}; profiled itl {q.get('itl_ms')} tpot {q.get('tpot_ms')};"
      f" trace decode {[round(x['step_us']['mean']) for x in dec if x]} us; other batches {timed};"
      f" after the window {(p.get('after_profile_server') or {}).get('itl_ms')}")
PY
  say "capture $name rc=$rc in $(( $(date +%s) - t ))s"
  [ $rc -eq 0 ] || tail -5 "$W/logs/profile-$name.out" | sed 's/^/    /' | tee -a "$LOG"
}

run_example() {   # the bundled example (issue 22): the MoE server as vLLM 0.26 runs by default (CUDA graphs, the
  # profiler's python stacks on), `profile -o` with its unprofiled run and the live deployment, settings beside
  if [ "$(left)" -lt 200 ]; then say "skip example: $(left)s left"; return; fi
  local k=moe flav=example prof=$W/prof/moe-example dest=$CAP/moe-example-b16
  MODEL[$k]=qwen3moe-30b-12l; PORT[$k]=8002
  rm -rf "$prof" "$dest"; mkdir -p "$prof" "$dest" "$W/logs"
  FLAGS[$k]="--max-model-len 4096 --gpu-memory-utilization 0.4 --port ${PORT[$k]} --profiler-config.profiler=torch --profiler-config.torch_profiler_dir=$prof --profiler-config.delay_iterations=$DELAY --profiler-config.max_iterations=$STEPS"
  # shellcheck disable=SC2086
  setsid python3 -m vllm.entrypoints.openai.api_server --model $MODELS/${MODEL[$k]} \
    --served-model-name ${MODEL[$k]} ${FLAGS[$k]} > "$W/logs/server-$k-$flav.log" 2>&1 &
  PID[$k]=$!; FLAV[$k]=$flav
  say "started $k-$flav: pid ${PID[$k]}"
  $SS health http://127.0.0.1:${PORT[$k]} --wait --timeout $(( $(left) - 120 )) --poll 2 --pid ${PID[$k]} \
    --log "$W/logs/server-$k-$flav.log" > "$W/logs/health-$k-$flav.txt" 2>&1
  READY[$k]=$?; say "health --wait rc=${READY[$k]}"
  if [ "${READY[$k]}" != 0 ]; then tail -20 "$W/logs/server-$k-$flav.log"; stop_server $k; return; fi
  $SS settings --pid ${PID[$k]} --url http://127.0.0.1:${PORT[$k]} --json > "$dest/settings.json" 2>&1
  COLUMNS=100 timeout 200 $SS profile http://127.0.0.1:${PORT[$k]} --batch 16 --output-tokens "$TOKENS" \
    --input-tokens $INPUT_TOKENS --trace-dir "$prof" --trace-timeout 120 -o "$dest/profile.json" \
    > "$OUTD/profile-100.txt" 2>&1
  say "profile rc=$?"; head -30 "$OUTD/profile-100.txt" | cut -c1-200 | tee -a "$LOG"
  take_window "$prof" "$dest" keep
  grep -E "Asynchronous scheduling|non-default args" "$W/logs/server-$k-$flav.log" | head -4 | cut -c1-600 \
    > "$dest/server-log-lines.txt"
  python3 "$REPO/tools/gpu_vllm/provenance.py" "$dest" "$dest/profile.json" "$flav" "$DELAY" "$STEPS" \
    "$MODELS/${MODEL[$k]}/config.json" "${FLAGS[$k]}" >> "$LOG" 2>&1
  COLUMNS=100 $SS analyze "$dest" > "$OUTD/analyze-100.txt" 2>&1
  stop_server $k
}

run_bench() {   # the dense server alone, CUDA graphs: load study + restart check (plan word `bench`)
  local flav=graphs k=dense name=dense-bench url=http://127.0.0.1:8001
  if [ "$(left)" -lt 200 ]; then say "skip bench plan: $(left)s left"; return; fi
  mkdir -p "$W/logs"
  nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader -lms 500 > "$W/logs/gpu-mem.csv" 2>&1 &
  local smi=$!
  FLAGS[$k]="--max-model-len 4096 --gpu-memory-utilization 0.4 --port ${PORT[$k]}"
  # shellcheck disable=SC2086
  setsid python3 -m vllm.entrypoints.openai.api_server --model $MODELS/${MODEL[$k]} \
    --served-model-name ${MODEL[$k]} ${FLAGS[$k]} > "$W/logs/server-$name.log" 2>&1 &
  PID[$k]=$!; local t0=$(date +%s.%N)
  say "started $name: pid ${PID[$k]} ($(left)s left)"
  local to=$(( $(left) - 150 )); [ $to -lt 60 ] && to=60
  $SS health $url --wait --timeout $to --poll 2 --pid ${PID[$k]} --log "$W/logs/server-$name.log" \
    > "$W/logs/health-$name.txt" 2>&1
  READY[$k]=$?
  say "health --wait rc=${READY[$k]} after $(python3 -c "import time;print(round(time.time()-$t0,1))")s"
  tail -6 "$W/logs/health-$name.txt" | cut -c1-160 | sed 's/^/    /' | tee -a "$LOG"
  if [ "${READY[$k]}" != 0 ]; then tail -30 "$W/logs/server-$name.log"; stop_server $k; kill $smi; return; fi
  # while the server holds the GPU: holders, a wait-free that must fail naming it, settings
  $SS gpu list > "$W/logs/gpu-list-$name.txt" 2>&1; $SS gpu holders > "$W/logs/gpu-holders-$name.txt" 2>&1
  $SS gpu holders --json > "$W/logs/gpu-holders-$name.json" 2>&1
  nvidia-smi > "$W/logs/nvidia-smi-$name.txt" 2>&1
  ps -o pid,ppid,rss,args -s ${PID[$k]} | cut -c1-200 > "$W/logs/ps-$name.txt" 2>&1
  sed 's/^/    /' "$W/logs/gpu-holders-$name.txt" | cut -c1-160 | head -8 | tee -a "$LOG"
  local wf=$W/logs/waitfree.txt t
  { echo "### 1. servescope gpu wait-free --max-used-mib 1024 --timeout 5 --poll 1   (server pid ${PID[$k]} up)"
    t=$(date +%s.%N); COLUMNS=200 $SS gpu wait-free --max-used-mib 1024 --timeout 5 --poll 1 2>&1; local rc=$?
    echo "### exit code $rc, $(python3 -c "import time;print(round(time.time()-$t,2))") s"; } > "$wf" 2>&1
  say "wait-free while up: $(grep '### exit' "$wf")"; grep -v '^###' "$wf" | head -6 | cut -c1-160 | sed 's/^/    /' | tee -a "$LOG"
  for c in 80 200; do   # on a terminal of c columns (piped, settings never wraps)
    python3 "$REPO/tools/gpu_vllm/tty_capture.py" $c python3 -m servescope settings --pid ${PID[$k]} --url $url \
      > "$W/logs/settings-$c.txt" 2>&1
    echo "### exit code $?" >> "$W/logs/settings-$c.txt"
  done
  $SS settings --pid ${PID[$k]} --url $url > "$W/logs/settings-piped.txt" 2>&1
  $SS settings --pid ${PID[$k]} --url $url --json > "$W/logs/settings-$name.json" 2>&1
  tr '\0' '\n' < /proc/${PID[$k]}/environ > "$W/logs/environ-$name.txt" 2>/dev/null
  say "settings: $(tail -1 "$W/logs/settings-80.txt"), $(wc -l < "$W/logs/settings-80.txt") / $(wc -l < "$W/logs/settings-200.txt") lines at 80 / 200 cols, widest $(awk '{ if (length > m) m = length } END { print m }' "$W/logs/settings-80.txt")"
  # the sweep: --duration per point sized to the time left (after it: ~40 s for the stop and pack)
  local conc=${BENCH_CONCURRENCY:-1,8,32,128,256} maxd=${BENCH_MAX_S:-30}
  local sweep=$(( $(left) - 40 )) n d
  n=$(echo "$conc" | tr ',' '\n' | wc -l); d=$(( (sweep - 15 - 5 * n) / n ))
  if [ $d -lt 8 ] && [ $n -gt 1 ]; then conc=${conc%,*}; n=$(( n - 1 )); d=$(( (sweep - 15 - 5 * n) / n )); fi
  [ $d -gt "$maxd" ] && d=$maxd; [ $d -lt 3 ] && d=3
  say "bench serve --concurrency $conc --duration $d (sweep budget ${sweep}s)"
  t=$(date +%s)
  COLUMNS=200 timeout $(( sweep > 30 ? sweep : 30 )) $SS bench serve $url --concurrency $conc --input-tokens 256 \
    --output-tokens 128 --duration $d -o "$W/logs/bench.json" > "$W/logs/bench.txt" 2>&1
  rc=$?; echo "### exit code $rc" >> "$W/logs/bench.txt"
  say "bench serve rc=$rc in $(( $(date +%s) - t ))s"; grep -E "^concurrency|lag p99|bound|front end" "$W/logs/bench.txt" | cut -c1-200 | tee -a "$LOG"
  # the restart: wait-free started, then SIGINT; it must return once the memory is free
  { echo "### 2. servescope gpu wait-free --max-used-mib 1024 --timeout 60 --poll 0.5   (started, then SIGINT to ${PID[$k]})"; } >> "$wf"
  t=$(date +%s.%N)
  COLUMNS=200 $SS gpu wait-free --max-used-mib 1024 --timeout 60 --poll 0.5 >> "$wf" 2>&1 &
  local wfp=$!
  sleep 1.5   # its first poll sees the server still there
  local ts=$(date +%s.%N); echo "### SIGINT at +$(python3 -c "print(round($ts-$t,2))") s" >> "$wf"
  stop_server $k
  wait $wfp; rc=$?
  echo "### exit code $rc, returned $(python3 -c "import time;print(round(time.time()-$ts,2))") s after the SIGINT" >> "$wf"
  sleep 1; kill $smi 2>/dev/null
  say "wait-free after stop: $(tail -1 "$wf")"
  cp "$W/logs/bench.json" "$W/logs/bench.txt" "$wf" "$W/logs/settings-80.txt" "$W/logs/settings-200.txt" "$OUTD"/ 2>/dev/null
}

vllm_bench_point() {   # vllm_bench_point URL CONC PROMPTS: the anchor, `vllm bench serve`, with /metrics around it
  local url=$1 c=$2 n=$3 d=$W/logs/vbench t
  mkdir -p "$d"
  python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('$url/metrics').read().decode())" \
    > "$d/metrics-before-c$c.txt" 2>&1
  t=$(date +%s.%N)
  timeout $(( $(left) - 30 )) python3 -m vllm.entrypoints.cli.main bench serve --backend vllm --base-url "$url" \
    --model ${MODEL[dense]} --tokenizer $MODELS/${MODEL[dense]} --dataset-name random --random-input-len 256 \
    --random-output-len 128 --ignore-eos --max-concurrency "$c" --num-prompts "$n" --seed 0 \
    --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99 --save-result --result-dir "$d" \
    --result-filename "vllm-bench-c$c.json" > "$d/vllm-bench-c$c.txt" 2>&1
  local rc=$?
  python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('$url/metrics').read().decode())" \
    > "$d/metrics-after-c$c.txt" 2>&1
  say "vllm bench serve c=$c n=$n rc=$rc in $(python3 -c "import time;print(round(time.time()-$t,1))")s: $(grep -E 'Mean TPOT|Mean TTFT' "$d/vllm-bench-c$c.txt" | tr -s ' ' | tr '\n' ' ')"
  [ $rc -eq 0 ] || tail -5 "$d/vllm-bench-c$c.txt" | cut -c1-200 | sed 's/^/    /' | tee -a "$LOG"
}

run_load() {   # run_load API_SERVERS: the dense server alone (CUDA graphs) with N API front ends; both sweeps
  local api=$1 k=dense name=dense-api$1 url=http://127.0.0.1:8001
  if [ "$(left)" -lt 200 ]; then say "skip load plan api=$api: $(left)s left"; return; fi
  mkdir -p "$W/logs"
  nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader -lms 500 > "$W/logs/gpu-mem-$name.csv" 2>&1 &
  local smi=$!
  FLAGS[$k]="--max-model-len 4096 --gpu-memory-utilization 0.4 --port ${PORT[$k]} --api-server-count $api"
  # `vllm serve` (the CLI's entry point): only it starts more than one API server
  # shellcheck disable=SC2086
  setsid python3 -m vllm.entrypoints.cli.main serve $MODELS/${MODEL[$k]} \
    --served-model-name ${MODEL[$k]} ${FLAGS[$k]} > "$W/logs/server-$name.log" 2>&1 &
  PID[$k]=$!; local t0=$(date +%s.%N)
  say "started $name: pid ${PID[$k]} ($(left)s left): vllm serve ... ${FLAGS[$k]}"
  local to=$(( $(left) - 150 )); [ $to -lt 60 ] && to=60
  # piped, as a unit's ExecStartPost or a CI log would run it: its lasting lines show the load
  COLUMNS=160 $SS health $url --wait --timeout $to --poll 2 --pid ${PID[$k]} --log "$W/logs/server-$name.log" \
    > "$W/logs/health-$name.txt" 2>&1
  READY[$k]=$?
  say "health --wait rc=${READY[$k]} after $(python3 -c "import time;print(round(time.time()-$t0,1))")s"
  cut -c1-160 "$W/logs/health-$name.txt" | sed 's/^/    /' | tee -a "$LOG"
  if [ "${READY[$k]}" != 0 ]; then tail -30 "$W/logs/server-$name.log"; stop_server $k; kill $smi; return; fi
  ps -o pid,ppid,rss,args -s ${PID[$k]} | cut -c1-200 > "$W/logs/ps-$name.txt" 2>&1
  $SS gpu holders > "$W/logs/gpu-holders-$name.txt" 2>&1
  local order=${SWEEP_ORDER:-servescope vllm} which conc=${BENCH_CONCURRENCY:-1,8,32,128,256} d=${BENCH_MAX_S:-25} t
  for which in $order; do
    if [ "$which" = servescope ]; then
      local n; n=$(echo "$conc" | tr ',' '\n' | wc -l)
      if [ "$(left)" -lt $(( n * (d + 6) + 60 )) ]; then say "skip servescope sweep: $(left)s left"; continue; fi
      say "bench serve --concurrency $conc --duration $d"
      t=$(date +%s)
      COLUMNS=200 timeout $(( $(left) - 30 )) $SS bench serve $url --concurrency $conc --input-tokens 256 \
        --output-tokens 128 --duration $d -o "$W/logs/bench-$name.json" > "$W/logs/bench-$name.txt" 2>&1
      echo "### exit code $?" >> "$W/logs/bench-$name.txt"
      say "bench serve in $(( $(date +%s) - t ))s"; grep -E "^concurrency|lag p99|bound|front end|TPOT" "$W/logs/bench-$name.txt" | cut -c1-200 | head -40 | tee -a "$LOG"
    else
      # prompts per point: ~VBENCH_S (20) s at the rates one front end reached on 2026-12-03 (3, 21, 66, 129,
      # 127 req/s); each point also costs ~25 s of vLLM's imports, dataset and ready check
      local c vs=${VBENCH_S:-20}
      for c in ${conc//,/ }; do
        case $c in 1) n=$(( 3 * vs )) ;; 8) n=$(( 21 * vs )) ;; 32) n=$(( 65 * vs )) ;; 128) n=$(( 130 * vs )) ;; *) n=$(( 150 * vs )) ;; esac
        if [ "$(left)" -lt 60 ]; then say "skip vllm bench serve c=$c: $(left)s left"; continue; fi
        vllm_bench_point $url "$c" "$n"
      done
    fi
  done
  stop_server $k
  sleep 1; kill $smi 2>/dev/null
  cp "$W/logs/bench-$name.json" "$W/logs/bench-$name.txt" "$W/logs/health-$name.txt" "$OUTD"/ 2>/dev/null
}

for word in "$@"; do
  case $word in
    graphs) run_pair graphs "$TOKENS" ;;
    admit) # the window from the first engine step, python stacks on: prefill, mixed and decode steps with the
           # model runner's frames (steps found without vLLM's annotation, checked against it)
      DELAY=0 STEPS=${ADMIT_STEPS:-12} WITH_STACK=true INPUT_TOKENS=${ADMIT_INPUT_TOKENS:-512} \
        BATCHES=${ADMIT_BATCHES:-16} run_pair admit "$TOKENS" ;;
    eager) run_pair eager "$TOKENS" --enforce-eager ;;
    # A/B pairs (issue 22): one model, two servers that differ in one setting; python stacks as vLLM defaults
    ab-async-dense) AB_BATCHES=${AB_BATCHES:-16 1 64} STACK_A=true STACK_B=true run_ab a llama8b-16l async "" b llama8b-16l noasync "--no-async-scheduling" ;;
    ab-async-moe) STACK_A=true STACK_B=true run_ab a qwen3moe-30b-12l async "" b qwen3moe-30b-12l noasync "--no-async-scheduling" ;;
    ab-fp8) run_ab a llama8b-16l fp8 "--quantization fp8" b qwen3moe-30b-12l fp8 "--quantization fp8" ;;
    ab-graphs) AB_BATCHES=${AB_BATCHES:-16 64} run_ab a llama8b-16l eager "--enforce-eager" b llama8b-16l cap32 "--max-cudagraph-capture-size 32" ;;
    ab-bf16) AB_BATCHES=${AB_BATCHES:-16 64} run_ab a llama8b-16l bf16 "" b qwen3moe-30b-12l bf16 "" ;;
    # The same A/B servers with the window in steady state (issue 24, plan --calibrate pairs): with distinct prompts
    # and python stacks the front end admits 16 requests over more than 20 steps, so a window from step 20 held
    # mixed steps and decode steps still carrying the new requests' host work; from step 64 every one is settled.
    steady-dense) DELAY=64 STEPS=12 TOKENS=90 AB_BATCHES="16 1" STACK_A=true STACK_B=true run_ab a llama8b-16l async "" b llama8b-16l noasync "--no-async-scheduling" ;;
    steady-moe) DELAY=64 STEPS=12 TOKENS=90 AB_BATCHES="16 1" STACK_A=true STACK_B=true run_ab a qwen3moe-30b-12l async "" b qwen3moe-30b-12l noasync "--no-async-scheduling" ;;
    steady-fp8) DELAY=64 STEPS=12 TOKENS=90 AB_BATCHES="16 1" STACK_A=true STACK_B=true run_ab a llama8b-16l fp8 "--quantization fp8" b qwen3moe-30b-12l fp8 "--quantization fp8" ;;
    # The same steady windows with the profiler's python stacks off (does the host's time repeat without them?)
    steady-dense-nostack) DELAY=64 STEPS=12 TOKENS=90 AB_BATCHES="${STEADY_BATCHES:-16 1}" run_ab a llama8b-16l async "" b llama8b-16l noasync "--no-async-scheduling" ;;
    steady-moe-nostack) DELAY=64 STEPS=12 TOKENS=90 AB_BATCHES="${STEADY_BATCHES:-16 1}" run_ab a qwen3moe-30b-12l async "" b qwen3moe-30b-12l noasync "--no-async-scheduling" ;;
    # fp8 with five unprofiled runs, async scheduling on and off (issue 24: the pairs in fp8), stacks off
    steady-fp8-dense-nostack) DELAY=64 STEPS=12 TOKENS=90 AB_BATCHES="${STEADY_BATCHES:-16 1}" run_ab a llama8b-16l fp8-async "--quantization fp8" b llama8b-16l fp8-noasync "--quantization fp8 --no-async-scheduling" ;;
    steady-fp8-moe-nostack) DELAY=64 STEPS=12 TOKENS=90 AB_BATCHES="${STEADY_BATCHES:-16 1}" run_ab a qwen3moe-30b-12l fp8-async "--quantization fp8" b qwen3moe-30b-12l fp8-noasync "--quantization fp8 --no-async-scheduling" ;;
    # Async scheduling's step across batches (issue 24: how does the async step's host share move with the batch?):
    # both models, async on (vLLM 0.26's default), stacks off, SWEEP_BATCHES steady windows each
    sweep-async) DELAY=64 STEPS=12 TOKENS=90 AB_BATCHES="${SWEEP_BATCHES:-1 2 4 8 16 32}" run_ab a llama8b-16l async "" b qwen3moe-30b-12l async "" ;;
    # One server alone, the steady window captured three times at 16 and at 1 request (issue 24: whether the host's
    # time inside a step repeats when no second server shares the machine)
    repeat-moe) READY_RESERVE_S=${READY_RESERVE_S:-60} DELAY=64 STEPS=12 TOKENS=90 AB_BATCHES="16 1" run_repeat a qwen3moe-30b-12l noasync "--no-async-scheduling" ;;
    repeat-moe-nostack) READY_RESERVE_S=${READY_RESERVE_S:-60} DELAY=64 STEPS=12 TOKENS=90 AB_BATCHES="16 1" REPEAT_STACK=false run_repeat a qwen3moe-30b-12l noasync-nostack "--no-async-scheduling" ;;
    repeat-moe-async) READY_RESERVE_S=${READY_RESERVE_S:-60} DELAY=64 STEPS=12 TOKENS=90 AB_BATCHES="16 1" run_repeat a qwen3moe-30b-12l async "" ;;
    repeat-dense) READY_RESERVE_S=${READY_RESERVE_S:-60} DELAY=64 STEPS=12 TOKENS=90 AB_BATCHES="16 1" run_repeat a llama8b-16l noasync "--no-async-scheduling" ;;
    # The steady window at a long context (issue 24: does attention's work per request stay put while its bytes
    # grow?): 3,000-token distinct prompts, the same servers and window as steady-*, stacks off; plan --calibrate
    # from a steady-* capture (77 tokens) predicts these windows' attention.
    long-context) DELAY=64 STEPS=12 TOKENS=90 INPUT_TOKENS=${LONG_INPUT_TOKENS:-3000} AB_BATCHES="16 1" run_ab a llama8b-16l long "--no-async-scheduling" b qwen3moe-30b-12l long "--no-async-scheduling" ;;
    bench) run_bench ;;
    example) run_example ;;
    scaled) run_load "${API_SERVERS:-4}" ;;
    anchor) run_load 1 ;;
    *) say "unknown plan word $word" ;;
  esac
done
du -sh "$CAP"/* 2>/dev/null | tee -a "$LOG"
say "done"
pack
