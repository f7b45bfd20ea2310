#!/bin/bash
# Runs ON THE LENT GPU, in the repository root, after tools/gpu_vllm/device_session.sh has installed vLLM 0.26 and
# servescope there (/tmp/site, /tmp/ss-site):
#
#   bash tools/gpu_vllm/tune_session.sh STEP...        STEP: scale | seqs | async | kv | defaults | capture | moe | sweep
#
# The steps run one after another in a driver started with setsid, which outlives the device call while the machine
# stays warm: every call (the same command) starts the driver if it is not running yet, then waits until it is done
# or the call's budget (SESSION_BUDGET_S) is nearly spent, and packs what is there into $OUT (tune-results.tgz,
# tune-logs.tgz, tune-session.txt). Model: llama8b-16l (CUDA graphs, vLLM's defaults but the one weak setting).
#   scale     issue 35 item 4: one `bench serve --concurrency 1024` against a server that runs 1024 at once
#             (--max-num-seqs 1024, 24 GiB of KV cache), the client's lag p99 read from its document; the anchor
#             `vllm bench serve --max-concurrency 1024` on the same server
#   seqs | async | kv | defaults | capture   issue 36 item 5: `servescope tune --launch` on a server with one weak
#             setting (--max-num-seqs 16 | --no-async-scheduling | 512 MiB of KV cache | none | a capture size of
#             8), --leave-running, then the anchor `vllm bench serve` at the final knee's load on the server left up
#   moe       the MoE model (qwen3moe-30b-12l) with vLLM's defaults, whose log says "Using default MoE config" on an
#             H100: `python -m servescope.bench.moe_config` searches the fused-MoE kernel's block sizes for its expert
#             shape first (MOE_SEARCH_S seconds; MOE_CONFIG_SRC=DIR takes an earlier search's config and timings
#             instead, its timings rebuilt from the search's moe-search.txt there where none were kept: e.g. a copy of
#             tests/data/tune/h100/moe-5 in an untracked folder, which travels with the tree; a folder moe-src at
#             the root is taken without it), then `tune --moe-config-dir` on the server, as above
#             and, for the A/B of the config itself, the same server started with the config state tune did not
#             end on, measured by `vllm bench serve` at the same load (moe-ab-tuned | moe-ab-default)
#   sweep     the anchor for `tune` on the seqs server: vLLM's own `vllm bench sweep serve` restarts the server for
#             each of SWEEP_SEQS (--max-num-seqs, a knob of the grid vLLM's auto_tune walks) and runs `vllm bench
#             serve` at each of SWEEP_CONC concurrencies on it (the same 256 in / 128 out); the best throughput
#             within the SLO is read from its results afterwards, its wall time beside
set -u
T0=$(date +%s)
BUDGET=${SESSION_BUDGET_S:-570}
OUTD=${OUT:-/tmp/out}; mkdir -p "$OUTD"
W=/tmp/tune; R=$W/results; L=$W/logs; mkdir -p "$R" "$L"
MODELS=/tmp/models MODEL=llama8b-16l
SLO=${SLO:-ttft_p99=1000,itl_p99=40}
export VLLM_USE_DEEP_GEMM=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1   # must stay set
export PYTHONPATH=/tmp/ss-site:/tmp/site
SS="python3 -m servescope"
SERVE="python3 -m vllm.entrypoints.openai.api_server --model $MODELS/$MODEL --served-model-name $MODEL --max-model-len 4096 --gpu-memory-utilization 0.3"

pack() {
  cp "$W/driver.txt" "$OUTD/tune-session.txt" 2>/dev/null
  ( cd "$W" && tar czf "$OUTD/tune-logs.tgz" logs $(ls -d tune-*.logs 2>/dev/null); tar czf "$OUTD/tune-results.tgz" results $(ls -d sweep 2>/dev/null) ) 2>/dev/null
  ls -la "$R" | tail -n +2
}

if [ "${1:-}" != "--driver" ]; then
  [ -d /tmp/ss-site/servescope ] || { echo "servescope is not installed: run device_session.sh with the payload first"; exit 1; }
  if [ ! -f "$W/driver.done" ] && ! { [ -f "$W/driver.pid" ] && kill -0 "$(cat "$W/driver.pid")" 2>/dev/null; }; then
    setsid bash "$0" --driver "$@" > "$L/driver.out" 2>&1 < /dev/null &
    echo $! > "$W/driver.pid"; echo "driver started: pid $! steps: $*"
  else echo "driver already running or done (pid $(cat "$W/driver.pid" 2>/dev/null))"; fi
  while [ ! -f "$W/driver.done" ] && [ $(( BUDGET - ($(date +%s) - T0) )) -gt 25 ]; do sleep 5; done
  [ -f "$W/driver.done" ] && echo "driver done" || echo "driver still running: call again to go on"
  tail -40 "$W/driver.txt"; pack; exit 0
fi

# ------------------------------------------------------------------------------------------------ the driver
shift
say() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - T0 ))s] $*" >> "$W/driver.txt"; }
[ -f $MODELS/$MODEL/config.json ] || { say "making $MODEL"; python3 /tmp/payload/make_models.py $MODELS $MODEL > $L/models.log 2>&1 || say "make_models failed"; }
say "servescope $($SS --version 2>/dev/null | head -1) ($(cat /tmp/payload/SERVESCOPE_COMMIT 2>/dev/null)); $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1); steps: $*"

metrics() { python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:$1/metrics').read().decode())" > "$2" 2>&1; }
vbench() {   # vbench NAME PORT IN OUT CONC N
  local t=$(date +%s)
  metrics $2 "$L/metrics-$1-c$5-before.txt"
  timeout 240 python3 -m vllm.entrypoints.cli.main bench serve --backend vllm --base-url http://127.0.0.1:$2 \
    --model $MODEL --tokenizer $MODELS/$MODEL --dataset-name random --random-input-len $3 --random-output-len $4 \
    --ignore-eos --max-concurrency $5 --num-prompts $6 --seed 0 --percentile-metrics ttft,tpot,itl,e2el \
    --metric-percentiles 50,90,95,99 --save-result --result-dir "$R" --result-filename "vbench-$1-c$5.json" \
    > "$R/vbench-$1-c$5.txt" 2>&1
  say "vllm bench serve $1 c=$5 n=$6 rc=$? in $(( $(date +%s) - t ))s: $(grep -E 'Output token throughput|P99 TTFT|P99 ITL|Mean TPOT' "$R/vbench-$1-c$5.txt" | tr -s ' ' | tr '\n' ' ')"
  metrics $2 "$L/metrics-$1-c$5-after.txt"
}

scale() {
  local port=8020 t=$(date +%s)
  # shellcheck disable=SC2086
  setsid $SERVE --port $port --max-num-seqs 1024 --kv-cache-memory-bytes 25769803776 > "$L/server-scale.log" 2>&1 < /dev/null &
  local pid=$!
  COLUMNS=160 $SS health http://127.0.0.1:$port --wait --timeout 400 --poll 2 --pid $pid --log "$L/server-scale.log" > "$L/health-scale.txt" 2>&1
  say "scale server rc=$? in $(( $(date +%s) - t ))s: $(head -1 "$L/health-scale.txt" | cut -c1-150)"
  t=$(date +%s)
  COLUMNS=100 $SS bench serve http://127.0.0.1:$port --concurrency 1024 --requests 3072 --input-tokens 128 \
    --output-tokens 256 --slo "$SLO" -o "$R/scale-1024.json" > "$R/scale-1024.txt" 2> "$L/scale-1024.err"
  say "bench serve --concurrency 1024 rc=$? in $(( $(date +%s) - t ))s"
  python3 - "$R/scale-1024.json" >> "$W/driver.txt" 2>&1 <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
for p in d.get("points", []):
    print("    point", {k: p.get(k) for k in ("concurrency", "requests", "errors", "duration_s", "workers",
                                             "output_tokens_per_s", "client_lag")},
          "tpot p50", (p.get("tpot_ms") or {}).get("p50"))
EOF
  vbench scale $port 128 256 1024 3072
  kill -TERM -- -$pid 2>/dev/null; sleep 8; kill -KILL -- -$pid 2>/dev/null
}

declare -A WEAK PROFILE MODEL_OF EXTRA
WEAK[seqs]="--kv-cache-memory-bytes 4294967296 --max-num-seqs 16"
WEAK[async]="--kv-cache-memory-bytes 8589934592 --no-async-scheduling"; PROFILE[async]=--profile
WEAK[kv]="--kv-cache-memory-bytes 536870912"
WEAK[defaults]="--kv-cache-memory-bytes 8589934592"
WEAK[capture]="--kv-cache-memory-bytes 8589934592 --max-cudagraph-capture-size 8"; [ -n "${TUNE_NO_PROFILE:-}" ] || PROFILE[capture]=--profile   # TUNE_NO_PROFILE=1: the knee's cause alone
WEAK[moe]="--gpu-memory-utilization 0.6 --kv-cache-memory-bytes 8589934592"; MODEL_OF[moe]=qwen3moe-30b-12l

moe_search() {   # the tuned fused-MoE config for the MoE model's expert shape on this GPU, before its tune run
  local m=qwen3moe-30b-12l t=$(date +%s)
  EXTRA[moe]="--moe-config-dir $W/moe-configs"
  # the model first, whether the config is searched or taken (the sixth session's tune failed without it)
  [ -f $MODELS/$m/config.json ] || python3 /tmp/payload/make_models.py $MODELS $m > $L/models-moe.log 2>&1 || say "make_models $m failed"
  [ -z "${MOE_CONFIG_SRC:-}" ] && [ -d moe-src ] && MOE_CONFIG_SRC=moe-src   # the folder that travels with the tree
  if [ -n "${MOE_CONFIG_SRC:-}" ]; then
    mkdir -p $W/moe-configs && cp "$MOE_CONFIG_SRC"/E=*.json $W/moe-configs/
    # the search's timings (tune's prediction) rebuilt from its log where only the log was kept
    ls $W/moe-configs/*.timings.json > /dev/null 2>&1 || python3 - "$MOE_CONFIG_SRC/moe-search.txt" $W/moe-configs <<'EOF'
import json, pathlib, re, sys
log = pathlib.Path(sys.argv[1]).read_text()
timed = {m[1]: [float(m[2]), float(m[3])] for m in re.finditer(r"M=(\d+): ([\d.]+) us \(default ([\d.]+) us", log)}
for config in pathlib.Path(sys.argv[2]).glob("E=*.json"):
    if not config.name.endswith(".timings.json"):
        config.with_name(config.name + ".timings.json").write_text(json.dumps(timed))
EOF
    say "moe config from $MOE_CONFIG_SRC: $(ls $W/moe-configs | tr '\n' ' ')"
    return
  fi
  python3 -m servescope.bench.moe_config --model $MODELS/$m --out $W/moe-configs --budget ${MOE_SEARCH_S:-150} \
    > "$R/moe-search.txt" 2> "$L/moe-search.err"
  say "moe search rc=$? in $(( $(date +%s) - t ))s: $(tail -1 "$R/moe-search.txt")"
  cp $W/moe-configs/*.json "$R/" 2>/dev/null
}

moe_ab() {   # vLLM's bench on the MoE server in the config state tune did not end on, at tune's final load
  local port=8031 t=$(date +%s) m=qwen3moe-30b-12l load kept state env=()
  read -r load kept <<< "$(python3 -c "
import json; d = json.load(open('$R/tune-moe.json')); f = d.get('final') or {}
print(int(f.get('load') or 0), int('VLLM_TUNED_CONFIG_FOLDER' in json.dumps(d.get('keep'))))" 2>/dev/null)"
  [ "${load:-0}" -gt 0 ] || { say "moe A/B: no final load"; return; }
  if [ "$kept" = 1 ]; then state=default; else state=tuned; env=(env VLLM_TUNED_CONFIG_FOLDER=$W/moe-configs); fi
  # shellcheck disable=SC2086
  setsid "${env[@]}" python3 -m vllm.entrypoints.openai.api_server --model $MODELS/$m --served-model-name $m \
    --max-model-len 4096 --gpu-memory-utilization 0.3 --port $port ${WEAK[moe]} > "$L/server-moe-ab.log" 2>&1 < /dev/null &
  local pid=$!
  $SS health http://127.0.0.1:$port --wait --timeout 400 --poll 2 --pid $pid --log "$L/server-moe-ab.log" > "$L/health-moe-ab.txt" 2>&1
  say "moe A/B server ($state config) rc=$? in $(( $(date +%s) - t ))s; $(grep -ohE 'Using (default MoE config|configuration from)[^.]*' "$L/server-moe-ab.log" | head -1)"
  grep -hE 'Using (default MoE config|configuration from)' "$L/server-moe-ab.log" | head -2 > "$R/server-moe-ab-lines.txt"
  MODEL=$m vbench "moe-ab-$state" $port 256 128 $load $(( load * 4 > 64 ? load * 4 : 64 ))
  kill -TERM -- -$pid 2>/dev/null; sleep 8; kill -KILL -- -$pid 2>/dev/null
}

sweep() {   # vLLM's own sweep over --max-num-seqs on the seqs server's base command: tune's anchor
  local t=$(date +%s) port=8040 d=$W/sweep; mkdir -p /tmp/bin $d
  printf '#!/bin/sh\nexec python3 -m vllm.entrypoints.cli.main "$@"\n' > /tmp/bin/vllm; chmod +x /tmp/bin/vllm
  python3 - "$d" "${SWEEP_SEQS:-16,64,256}" "${SWEEP_CONC:-16,64,128,256}" <<'EOF'
import json, sys
d, seqs, conc = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(",")
json.dump([{"max_num_seqs": int(s)} for s in seqs], open(f"{d}/serve.json", "w"))
json.dump([{"max_concurrency": int(c), "num_prompts": 2 * max(int(c), 32)} for c in conc], open(f"{d}/bench.json", "w"))
EOF
  /tmp/bin/vllm bench sweep --help > "$L/sweep-help.txt" 2>&1
  timeout 900 /tmp/bin/vllm bench sweep serve \
    --serve-cmd "/tmp/bin/vllm serve $MODELS/$MODEL --served-model-name $MODEL --max-model-len 4096 --gpu-memory-utilization 0.3 --port $port --kv-cache-memory-bytes 4294967296" \
    --bench-cmd "/tmp/bin/vllm bench serve --backend vllm --base-url http://127.0.0.1:$port --model $MODEL --tokenizer $MODELS/$MODEL --dataset-name random --random-input-len 256 --random-output-len 128 --ignore-eos --seed 0 --metric-percentiles 50,90,95,99" \
    --after-bench-cmd "python3 -c \"import urllib.request as u; u.urlopen(u.Request('http://127.0.0.1:$port/reset_prefix_cache', method='POST'))\"" \
    --serve-params $d/serve.json --bench-params $d/bench.json --num-runs 1 --server-ready-timeout 400 \
    -o $d/results > "$L/sweep.out" 2>&1
  say "vllm bench sweep serve rc=$? in $(( $(date +%s) - t ))s (seqs ${SWEEP_SEQS:-16,64,256}, concurrency ${SWEEP_CONC:-16,64,128,256})"
  python3 - "$d/results" >> "$W/driver.txt" 2>&1 <<'EOF'
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).rglob("run=*.json")):
    r = json.load(open(f))
    print("    ", {k: r.get(k) for k in ("max_num_seqs", "max_concurrency", "output_throughput", "p99_ttft_ms", "p99_itl_ms", "duration")})
EOF
  ( cd $W && tar czf "$R/sweep.tgz" sweep ) 2>/dev/null
}

tune() {   # tune NAME
  local name=$1 port=8030 t=$(date +%s) model=${MODEL_OF[$1]:-$MODEL}
  local serve="python3 -m vllm.entrypoints.openai.api_server --model $MODELS/$model --served-model-name $model --max-model-len 4096 --gpu-memory-utilization 0.3"
  # shellcheck disable=SC2086
  COLUMNS=100 timeout 900 $SS tune --launch "$serve --port $port ${WEAK[$name]}" --slo "$SLO" --input-tokens 256 \
    --output-tokens 128 --max-load 512 --measure-budget ${TUNE_MEASURE:-35s} --max-restarts ${TUNE_RESTARTS:-2} \
    --ready-timeout 400 --yes --leave-running ${PROFILE[$name]:-} ${EXTRA[$name]:-} --journal $W/tune-$name.journal.json \
    -o "$R/tune-$name.json" > "$R/tune-$name.txt" 2> "$L/tune-$name.err"
  say "tune $name rc=$? in $(( $(date +%s) - t ))s"
  grep -vE '^\s*$' "$R/tune-$name.txt" | head -30 | cut -c1-160 | sed 's/^/    /' >> "$W/driver.txt"
  read -r pid load <<< "$(python3 -c "
import json; d = json.load(open('$R/tune-$name.json')); f = d.get('final') or {}
print(d['target'].get('left_running') or 0, int(f.get('load') or 0))" 2>/dev/null)"
  if [ "${pid:-0}" -gt 0 ]; then
    [ "${load:-0}" -gt 0 ] && MODEL=$model vbench "tune-$name" $port 256 128 $load $(( load * 4 > 64 ? load * 4 : 64 ))
    kill -TERM -- -$pid 2>/dev/null; sleep 8; kill -KILL -- -$pid 2>/dev/null
  fi
}

for step in "$@"; do
  case $step in
    scale) scale ;;
    seqs|async|kv|defaults|capture) tune $step ;;
    moe) moe_search; tune moe; moe_ab ;;
    sweep) sweep ;;
    *) say "unknown step $step" ;;
  esac
done
say "driver done"; touch "$W/driver.done"
