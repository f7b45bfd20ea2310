#!/usr/bin/env python3
"""provenance.json for one capture folder (stdlib only; device_session.sh calls it after each capture).

  python3 provenance.py DEST PROFILE_JSON FLAVOUR DELAY STEPS MODEL_CONFIG_JSON 'SERVER FLAGS...'

DEST holds the capture (rank0 trace, front-end trace, profiler_out_0.txt); PROFILE_JSON is what
``servescope profile --json -o`` wrote for it (its ``profile`` block: batch, tokens, usage). Versions and
the device come from $VLLM_VERSION, $TORCH_VERSION, $GPU_DESC; the date from $CAPTURE_DATE or today.
"""

from __future__ import annotations

import datetime
import json
import os
import sys

SHAPE_KEYS = ("model_type", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "head_dim", "num_experts", "num_experts_per_tok",
              "vocab_size", "torch_dtype", "dtype")


def provenance(dest: str, profile_json: str, flavour: str, delay: int, steps: int, config_path: str,
               flags: str) -> dict[str, object]:
    cfg = json.load(open(config_path))
    try:
        prof = json.load(open(profile_json))
    except (OSError, ValueError):
        prof = {}
    cap = prof.get("profile", {})
    phases = None
    if prof.get("ranks"):
        phases = {ph: s["steps"] for ph, s in prof["ranks"][0]["phases"].items()}
    vllm = os.environ.get("VLLM_VERSION") or os.environ.get("CAP_VLLM_VERSION", "")
    files = {f: os.path.getsize(os.path.join(dest, f)) for f in sorted(os.listdir(dest)) if f != "provenance.json"}
    gpu = os.environ.get("GPU_DESC", "")
    card = next((name for name in ("H200", "H100") if name in gpu), "GPU")  # nvidia-smi's name: the lent card
    return {
        "what": f"real vLLM {vllm} {'admission window' if flavour == 'admit' else 'decode'} capture on the lent "
                f"{card} (servescope profile), batch {cap.get('batch')}",
        "date": os.environ.get("CAPTURE_DATE") or datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
        "device": gpu,
        "torch": os.environ.get("TORCH_VERSION") or os.environ.get("CAP_TORCH_VERSION", ""),
        "vllm_version": vllm,
        "model": cap.get("model"),
        "model_shape": {k: cfg[k] for k in SHAPE_KEYS if cfg.get(k) is not None},
        "random_weights": "../shared/gpu-vllm/make_models.py (bf16, normal(0, 0.02), seed 0)",
        "mode": "--enforce-eager" if "--enforce-eager" in flags.split()
                else "torch.compile + CUDA graphs (vLLM's default, FULL_AND_PIECEWISE)",
        "flavour": flavour,
        "python_stacks": "--profiler-config.torch_profiler_with_stack=true" in flags,
        "server_flags": flags.split(),
        "batch": cap.get("batch"),
        "output_tokens": cap.get("output_tokens"),
        "input_tokens": cap.get("input_tokens"),
        "window": f"engine steps {delay}..{delay + steps - 1} after /start_profile "
                  f"(--profiler-config.delay_iterations={delay} --profiler-config.max_iterations={steps})",
        "steps_by_phase": phases,
        "completion_tokens": sorted({u.get("completion_tokens") for u in cap.get("usage", [])}),
        "files": files,
        # the server's own /metrics means over the profiled batch and over the same batch without the profiler
        "profiled_server": cap.get("profiled_server"),
        "unprofiled_server": cap.get("unprofiled_server"),
        "unprofiled_runs": cap.get("unprofiled_runs", []),
        **({"unprofiled_batches": cap["unprofiled_batches"]} if cap.get("unprofiled_batches") else {}),
        **({key: cap[key] for key in ("after_profile_server", "after_profile_runs")} if cap.get("after_profile_runs")
           else {}),
        "truth": "profiler_out_0.txt: vLLM's worker printed it from the live torch profiler at the window's end "
                 "(key_averages().table(sort_by='self_cuda_time_total'): 100 rows, names cut at 55 characters)",
    }


def main() -> None:
    dest, profile_json, flavour, delay, steps, config_path, flags = sys.argv[1:8]
    doc = provenance(dest, profile_json, flavour, int(delay), int(steps), config_path, flags)
    with open(os.path.join(dest, "provenance.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"    {os.path.basename(dest)}: steps {doc['steps_by_phase']} files {doc['files']}")


if __name__ == "__main__":
    main()
