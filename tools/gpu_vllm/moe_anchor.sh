#!/bin/bash
# Runs ON THE LENT GPU after tune_session.sh moe (same warm machine): vLLM's own bench at tune's final load on the
# MoE server as tune started it (vLLM's default MoE config, one API server) and with the change tune kept
# (--api-server-count 2), REPEATS runs each, so that the kept change has an anchor by vLLM's bench at the same load.
set -u
W=/tmp/tune; R=$W/results; L=$W/logs; M=/tmp/models/qwen3moe-30b-12l; LOAD=${LOAD:-128}; OUTD=${OUT:-/tmp/out}
export PYTHONPATH=/tmp/ss-site:/tmp/site VLLM_USE_DEEP_GEMM=0 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 VLLM_USE_FLASHINFER_SAMPLER=0
pkill -f vllm.entrypoints; sleep 5
for variant in base:"" api2:"--api-server-count 2"; do
  name=${variant%%:*}; extra=${variant#*:}; t=$(date +%s)
  # shellcheck disable=SC2086
  setsid python3 -m vllm.entrypoints.openai.api_server --model $M --served-model-name qwen3moe-30b-12l --max-model-len 4096 \
    --gpu-memory-utilization 0.6 --kv-cache-memory-bytes 8589934592 --port 8032 $extra > "$L/server-moe-anchor-$name.log" 2>&1 < /dev/null &
  pid=$!
  python3 -m servescope health http://127.0.0.1:8032 --wait --timeout 300 --poll 2 --pid $pid > "$L/health-moe-anchor-$name.txt" 2>&1
  echo "[$(date -u +%T)] server $name ($extra) up rc=$? in $(( $(date +%s) - t ))s" | tee -a "$R/moe-anchor.txt"
  for i in ${REPEATS:-1 2}; do
    timeout 200 python3 -m vllm.entrypoints.cli.main bench serve --backend vllm --base-url http://127.0.0.1:8032 \
      --model qwen3moe-30b-12l --tokenizer $M --dataset-name random --random-input-len 256 --random-output-len 128 \
      --ignore-eos --max-concurrency $LOAD --num-prompts $(( LOAD * 4 )) --seed $i --percentile-metrics ttft,tpot,itl,e2el \
      --metric-percentiles 50,90,95,99 --save-result --result-dir "$R" --result-filename "vbench-moe-anchor-$name-$i-c$LOAD.json" \
      > "$R/vbench-moe-anchor-$name-$i-c$LOAD.txt" 2>&1
    echo "  $name run $i rc=$?: $(grep -E 'Output token throughput|P99 TTFT|P99 ITL|Mean TPOT' "$R/vbench-moe-anchor-$name-$i-c$LOAD.txt" | tr -s ' ' | tr '\n' ' ')" | tee -a "$R/moe-anchor.txt"
  done
  kill -TERM -- -$pid 2>/dev/null; sleep 8; kill -KILL -- -$pid 2>/dev/null
done
( cd $W && tar czf "$OUTD/tune-results.tgz" results && tar czf "$OUTD/tune-logs.tgz" logs )
