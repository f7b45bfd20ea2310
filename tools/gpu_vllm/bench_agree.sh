#!/bin/bash
# Runs ON THE LENT GPU after device_session.sh has installed vLLM 0.26 and servescope (/tmp/site, /tmp/ss-site):
#
#   bash tools/gpu_vllm/bench_agree.sh [agree|form]
#
# One server, the MoE model as tune's seventh session started it (vLLM's default MoE config, one API server; its
# knee's cause was the front end), and on it, in turn, LOAD streams of 256 in / 128 out (ignore_eos), 4 x LOAD
# requests a run, the server's /metrics saved before and after each run:
#   agree  (default) does servescope's load client measure what vLLM's own does? `vllm bench serve` and `servescope
#          bench serve --requests`, twice each (vLLM, servescope, vLLM, servescope), then servescope's timed point as
#          its knee search measures one (--duration 10 after the warm-up burst)
#   form   does the prompts' form move what a front-end-bound server delivers? servescope's point with token-id
#          prompts (`--prompts ids`, the default: the API server does not tokenize them) and with text prompts
#          (`--prompts text`, as vLLM's bench sends them), twice each in turn, then `vllm bench serve` once, then
#          a knee search in each form (default targets, --budget KNEE_BUDGET each)
# $OUT: STEP-results.tgz (every result file, packed after each run: a call cut short brings back what ran), STEP.txt.
set -u
STEP=${1:-agree}; OUTD=${OUT:-/tmp/out}; W=/tmp/$STEP; R=$W/results; mkdir -p "$R" "$OUTD"
M=qwen3moe-30b-12l; MD=/tmp/models/$M; LOAD=${LOAD:-128}; PORT=8033
export PYTHONPATH=/tmp/ss-site:/tmp/site VLLM_USE_DEEP_GEMM=0 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 VLLM_USE_FLASHINFER_SAMPLER=0
say() { echo "[$(date -u +%T)] $*" | tee -a "$R/$STEP.txt"; }
pack() { ( cd $W && tar czf "$OUTD/$STEP-results.tgz" results ); cp "$R/$STEP.txt" "$OUTD/"; }
metrics() { python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:$PORT/metrics').read().decode())" > "$R/metrics-$1.txt" 2>&1; }
[ -f $MD/config.json ] || python3 /tmp/payload/make_models.py /tmp/models $M > "$R/models.log" 2>&1
t=$(date +%s)
setsid python3 -m vllm.entrypoints.openai.api_server --model $MD --served-model-name $M --max-model-len 4096 \
  --gpu-memory-utilization 0.6 --kv-cache-memory-bytes 8589934592 --port $PORT > "$R/server.log" 2>&1 < /dev/null &
pid=$!
python3 -m servescope health http://127.0.0.1:$PORT --wait --timeout 300 --poll 2 --pid $pid > "$R/health.txt" 2>&1
say "server up rc=$? in $(( $(date +%s) - t ))s; $(grep -ohE 'Using (default MoE config|configuration from)[^.]*' "$R/server.log" | head -1)"; pack

vllm_run() {   # vllm_run NAME SEED
  metrics "$1-before"
  timeout 200 python3 -m vllm.entrypoints.cli.main bench serve --backend vllm --base-url http://127.0.0.1:$PORT \
    --model $M --tokenizer $MD --dataset-name random --random-input-len 256 --random-output-len 128 --ignore-eos \
    --max-concurrency $LOAD --num-prompts $(( LOAD * 4 )) --seed $2 --percentile-metrics ttft,tpot,itl,e2el \
    --metric-percentiles 50,90,95,99 --save-result --result-dir "$R" --result-filename "$1.json" > "$R/$1.txt" 2>&1
  say "vllm bench serve $1 rc=$?: $(grep -E 'Benchmark duration|Output token throughput|P99 TTFT|Mean TPOT|P99 ITL' "$R/$1.txt" | tr -s ' ' | tr '\n' ' ')"
  metrics "$1-after"; pack
}
ss_run() {   # ss_run NAME ARGS...: servescope bench serve
  local name=$1; shift
  metrics "ss-$name-before"
  COLUMNS=160 timeout 200 python3 -m servescope bench serve http://127.0.0.1:$PORT --concurrency $LOAD --input-tokens 256 \
    --output-tokens 128 "$@" --json -o "$R/ss-$name.json" > "$R/ss-$name.txt" 2>&1
  say "servescope bench serve $name ($*) rc=$?: $(python3 -c "
import json; d = json.load(open('$R/ss-$name.json')); p = d['points'][0]
print('duration', round(p['duration_s'], 2), 's, requests', p['requests'], ', output tok/s', round(p['output_tokens_per_s'], 1),
      ', ttft p99', round(p['ttft_ms']['p99'], 1), ', tpot mean', round(p['tpot_ms']['mean'], 2), ', itl p99', round(p['itl_ms']['p99'], 1),
      ', prompts', d['options'].get('prompt_form'), p['tokens']['prompt_mean'])" 2>&1)"
  metrics "ss-$name-after"; pack
}
knee_run() {   # knee_run ids|text: a knee search, default targets
  metrics "knee-$1-before"
  COLUMNS=160 timeout $(( ${KNEE_BUDGET:-90} + 60 )) python3 -m servescope bench serve http://127.0.0.1:$PORT \
    --slo ttft_p99=2000,itl_p99=100 --input-tokens 256 --output-tokens 128 --prompts $1 --budget ${KNEE_BUDGET:-90} \
    --json -o "$R/knee-$1.json" > "$R/knee-$1.txt" 2> "$R/knee-$1.err"
  say "knee $1 rc=$?: $(grep -m1 -iE 'knee' "$R/knee-$1.txt" | tr -s ' ')"
  metrics "knee-$1-after"; pack
}

case $STEP in
  agree) vllm_run vllm-1 1; ss_run count-1 --requests $(( LOAD * 4 )); vllm_run vllm-2 2; ss_run count-2 --requests $(( LOAD * 4 ))
         ss_run timed --duration 10 --warmup-burst $LOAD ;;
  form)  for n in 1 2; do ss_run ids-$n --requests $(( LOAD * 4 )); ss_run text-$n --requests $(( LOAD * 4 )) --prompts text; done
         vllm_run vllm 3; knee_run ids; knee_run text ;;
esac
kill -TERM -- -$pid 2>/dev/null; sleep 8; kill -KILL -- -$pid 2>/dev/null
pack
