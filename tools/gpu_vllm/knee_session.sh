#!/bin/bash
# Runs ON THE LENT GPU, in the repository root, after tools/gpu_vllm/device_session.sh has installed vLLM 0.26 and
# servescope there (/tmp/site, /tmp/ss-site):
#
#   bash tools/gpu_vllm/knee_session.sh SERVER...        SERVER: defaults | seqs | kv | prefill
#
# Issue 35: the knee of real vLLM servers, each set up so that a different cause bounds it, side by side on one GPU
# (llama8b-16l, CUDA graphs, no profiler; --kv-cache-memory-bytes so that none sizes its KV cache from the others'
# memory; --gpu-memory-utilization low so that each passes vLLM's start-up check beside the others):
#   defaults  vLLM's scheduling defaults, KV 8 GiB (never full here)          256 in / 128 out
#   seqs      --max-num-seqs 16                                             256 in / 128 out
#   kv        --kv-cache-memory-bytes 512 MiB (8192 tokens: ~21 requests)   256 in / 128 out
#   prefill   --max-num-batched-tokens 256, prompts of 2048 tokens          2048 in / 64 out
# Servers are started with setsid: they outlive the call while the machine stays warm, so a later call with other
# SERVER words finds them up (health) and goes on. Per server: `servescope bench serve --slo $SLO` (the knee
# search, KNEE_BUDGET_S), then the anchor `vllm bench serve` at the knee's load and at the first load past it
# (/metrics saved around each), all into $OUT: knee-NAME.json/.txt, vbench-NAME-cC.json/.txt, knee-session.txt,
# knee-logs.tgz (server logs, health).
set -u
T0=$(date +%s)
BUDGET=${SESSION_BUDGET_S:-570}
OUTD=${OUT:-/tmp/out}; mkdir -p "$OUTD"
W=/tmp/knee; mkdir -p "$W/logs"
LOG=$W/knee-session.txt
MODELS=/tmp/models MODEL=llama8b-16l
SLO=${SLO:-ttft_p99=1000,itl_p99=40}
KNEE_BUDGET_S=${KNEE_BUDGET_S:-110}
say() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG"; }
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
R=$W/results; mkdir -p "$R"
pack() { cp "$LOG" "$OUTD/knee-session.txt"; ( cd "$W" && tar czf "$OUTD/knee-logs.tgz" logs && tar czf "$OUTD/knee-results.tgz" results ) 2>/dev/null; ls -la "$OUTD" "$R"; }

export VLLM_USE_DEEP_GEMM=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1   # must stay set
export PYTHONPATH=/tmp/ss-site:/tmp/site
SS="python3 -m servescope"
[ -d /tmp/ss-site/servescope ] || { say "servescope is not installed: run device_session.sh with the payload first"; pack; exit 1; }
[ -f $MODELS/$MODEL/config.json ] || { say "making $MODEL"; python3 /tmp/payload/make_models.py $MODELS $MODEL > $W/logs/models.log 2>&1 || { tail -5 $W/logs/models.log; pack; exit 1; }; }
say "servescope $($SS --version 2>/dev/null | head -1) ($(cat /tmp/payload/SERVESCOPE_COMMIT 2>/dev/null)); $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1)"

declare -A PORT FLAGS SHAPE
PORT[defaults]=8011; FLAGS[defaults]="--kv-cache-memory-bytes 8589934592";  SHAPE[defaults]="256 128"
PORT[seqs]=8012;     FLAGS[seqs]="--kv-cache-memory-bytes 4294967296 --max-num-seqs 16"; SHAPE[seqs]="256 128"
PORT[kv]=8013;       FLAGS[kv]="--kv-cache-memory-bytes 536870912";         SHAPE[kv]="256 128"
PORT[prefill]=8014;  FLAGS[prefill]="--kv-cache-memory-bytes 4294967296 --max-num-batched-tokens 256"; SHAPE[prefill]="2048 64"

up() { python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$1/health', timeout=2)" 2>/dev/null; }

# 1. start those not up, side by side
started=()
for s in "$@"; do
  [ "$s" = tune ] && continue
  if up ${PORT[$s]}; then say "$s already up on ${PORT[$s]}"; continue; fi
  # shellcheck disable=SC2086
  setsid python3 -m vllm.entrypoints.openai.api_server --model $MODELS/$MODEL --served-model-name $MODEL \
    --max-model-len 4096 --gpu-memory-utilization 0.2 --port ${PORT[$s]} ${FLAGS[$s]} \
    > "$W/logs/server-$s.log" 2>&1 < /dev/null &
  echo $! > "$W/pid-$s"; started+=("$s"); say "started $s: pid $! port ${PORT[$s]}: ${FLAGS[$s]}"
done
for s in "${started[@]}"; do
  to=$(( $(left) - 60 )); [ $to -lt 60 ] && to=60
  COLUMNS=160 $SS health http://127.0.0.1:${PORT[$s]} --wait --timeout $to --poll 2 --pid "$(cat $W/pid-$s)" \
    --log "$W/logs/server-$s.log" > "$W/logs/health-$s.txt" 2>&1
  say "health --wait $s rc=$?: $(head -1 "$W/logs/health-$s.txt" | cut -c1-150)"
done
nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader | sed 's/^/  gpu memory: /' | tee -a "$LOG"

# 2. the knee of each, then the anchor beside it
anchor() {   # anchor NAME PORT IN OUT CONC
  local name=$1 port=$2 in=$3 out=$4 c=$5 n
  n=$(( c * 4 )); [ $n -lt 32 ] && n=32
  python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:$port/metrics').read().decode())" > "$W/logs/metrics-$name-c$c-before.txt" 2>&1
  local t=$(date +%s)
  timeout $(( $(left) > 40 ? $(left) - 20 : 20 )) python3 -m vllm.entrypoints.cli.main bench serve --backend vllm \
    --base-url http://127.0.0.1:$port --model $MODEL --tokenizer $MODELS/$MODEL --dataset-name random \
    --random-input-len $in --random-output-len $out --ignore-eos --max-concurrency $c --num-prompts $n --seed 0 \
    --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,95,99 --save-result --result-dir "$R" \
    --result-filename "vbench-$name-c$c.json" > "$R/vbench-$name-c$c.txt" 2>&1
  say "vllm bench serve $name c=$c n=$n rc=$? in $(( $(date +%s) - t ))s: $(grep -E 'P99 TTFT|P99 ITL' "$R/vbench-$name-c$c.txt" | tr -s ' ' | tr '\n' ' ')"
  python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:$port/metrics').read().decode())" > "$W/logs/metrics-$name-c$c-after.txt" 2>&1
}

for s in "$@"; do
  [ "$s" = tune ] && continue
  up ${PORT[$s]} || { say "$s is not up: skipped"; tail -20 "$W/logs/server-$s.log" | tee -a "$LOG"; continue; }
  read -r in out <<< "${SHAPE[$s]}"
  b=$KNEE_BUDGET_S; [ "$(left)" -lt $(( b + 60 )) ] && b=$(( $(left) - 60 ))
  [ $b -lt 20 ] && { say "no time left for $s"; break; }
  t=$(date +%s)
  COLUMNS=100 $SS bench serve http://127.0.0.1:${PORT[$s]} --slo "$SLO" --input-tokens $in --output-tokens $out \
    --budget ${b}s --max-load 512 -o "$R/knee-$s.json" > "$R/knee-$s.txt" 2> "$W/logs/knee-$s.err"
  say "knee $s rc=$? in $(( $(date +%s) - t ))s (budget ${b}s)"
  grep -E "^knee|^bounded|setting:|^search" "$R/knee-$s.txt" | cut -c1-200 | sed 's/^/    /' | tee -a "$LOG"
  read -r kl nl <<< "$(python3 -c "
import json; d = json.load(open('$R/knee-$s.json')); k = d.get('knee') or {}
print(int(k.get('load') or 0), int(k.get('next_load') or 0))" 2>/dev/null)"
  for c in ${kl:-0} ${nl:-0}; do
    [ "$c" -gt 0 ] && [ "$(left)" -gt 45 ] && anchor "$s" ${PORT[$s]} $in $out $c
  done
done

# 3. `tune` (issue 36): a launched server with one weak setting (--max-num-seqs 16); tune must find the cap and keep
# the change that lifts it, within TUNE_BUDGET_S
case " $* " in *" tune "*)
  tb=$(( $(left) - 30 ))
  if [ $tb -gt 120 ]; then
    t=$(date +%s)
    COLUMNS=100 timeout $tb $SS tune --launch "python3 -m vllm.entrypoints.openai.api_server --model $MODELS/$MODEL --served-model-name $MODEL --max-model-len 4096 --gpu-memory-utilization 0.2 --kv-cache-memory-bytes 4294967296 --max-num-seqs 16 --port 8015" \
      --slo "$SLO" --input-tokens 256 --output-tokens 128 --max-load 256 --measure-budget ${TUNE_MEASURE:-50s} \
      --max-restarts ${TUNE_RESTARTS:-2} --budget $(( tb - 20 ))s --ready-timeout 300 --yes --journal $W/tune.journal.json \
      -o "$R/tune-seqs.json" > "$R/tune-seqs.txt" 2> "$W/logs/tune-seqs.err"
    say "tune rc=$? in $(( $(date +%s) - t ))s"; tail -30 "$R/tune-seqs.txt" | cut -c1-160 | tee -a "$LOG"
    tail -5 "$W/logs/tune-seqs.err" | cut -c1-200 | tee -a "$LOG"
  else say "no time left for tune (${tb}s)"; fi ;;
esac
pack
