#!/usr/bin/env python3
"""The A/B pairs of tests/data/h200-vllm/ab (issue 22) and tests/data/h100-vllm/steady/w4: each advice's predicted
saving beside the change the server's own /metrics measured without the profiler, and the profiled step beside the
unprofiled one.

  .venv/bin/python benchmarks/advice_ab.py            # markdown tables on stdout (docs/measurements.md)

A: the server without the setting; B: with it. The prediction is computed on A's trace with A's unprofiled step
as reference (as `profile` does live); the measured saving is A's unprofiled inter-token latency less B's.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from servescope.core.analysis import AnalysisDoc, StepReference
from servescope.core.document import read_document
from servescope.trace.analyze import AnalyzeRequest, analyze
from servescope.trace.rules.deployment import from_settings_doc

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "h200-vllm"
PAIRS = [
    ("ab/dense-noasync-b16", "ab/dense-async-b16", "async_scheduling"),
    ("ab/dense-noasync-b1", "ab/dense-async-b1", "async_scheduling"),
    ("ab/moe-noasync-b16", "ab/moe-async-b16", "async_scheduling"),
    ("ab/moe-noasync-b1", "ab/moe-async-b1", "async_scheduling"),
    ("ab/dense-eager-b16", "ab/dense-bf16-b16", "cuda_graphs"),
    ("ab/dense-eager-b64", "ab/dense-bf16-b64", "cuda_graphs"),
    ("ab/dense-cap32-b64", "ab/dense-bf16-b64", "max_cudagraph_capture_size"),
    ("dense-fp8-b16", "ab/dense-bf16-b16", "quantization"),
    # the same payload on a lent H100 (2026-12-05, tests/data/h100-vllm/steady/w4): async in bf16 and fp8
    *[(f"../h100-vllm/steady/w4/{m}-noasync-b{b}", f"../h100-vllm/steady/w4/{m}-async-b{b}", "async_scheduling")
      for m in ("dense", "dense-fp8", "moe", "moe-fp8") for b in (16, 1)],
]


def unprofiled_us(folder: str) -> float:
    return float(json.loads((DATA / folder / "provenance.json").read_text())["unprofiled_server"]["itl_ms"]) * 1000


def doc(folder: str) -> AnalysisDoc:
    path = DATA / folder
    settings = [from_settings_doc(read_document(path / "settings.json"), "settings.json")]
    ref = StepReference(step_us=unprofiled_us(folder), source="the server's ITL without the profiler")
    return analyze(AnalyzeRequest(paths=[path / "rank0.pt.trace.json.gz"], settings=settings, reference=ref))


def label(folder: str) -> str:
    """A capture's name in the tables, with its card where it is not the H200."""
    return ("H100 " if folder.startswith("../h100-vllm/") else "") + folder.split("/")[-1]


def main() -> None:
    print("| A → B | setting | advice on A | predicted saving (µs) | measured (µs) | held | advice on B |")
    print("|---|---|---|---|---|---|---|")
    for a, b, setting in PAIRS:
        da, db = doc(a), doc(b)
        measured = unprofiled_us(a) - unprofiled_us(b)
        given = [(f, x) for f in da.findings if f.phase == "decode" for x in f.advice if x.setting == setting]
        again = [x for f in db.findings if f.phase == "decode" for x in f.advice if x.setting == setting]
        if given:
            f, x = given[0]
            pred = f"{x.gain.low_us:.0f}–{x.gain.high_us:.0f}" if x.gain else "none"
            held = ("yes" if x.gain and x.gain.low_us <= measured <= x.gain.high_us else "**no**")
            words = x.text.split(" (")[0].split(":")[0][:48]
            print(f"| {label(a)} → {label(b)} | {setting} | {f.id}: {words} | {pred} | "
                  f"{measured:.0f} | {held} | {'none' if not again else 'AGAIN'} |")
        else:
            print(f"| {label(a)} → {label(b)} | {setting} | none | – | {measured:.0f} | – | "
                  f"{'none' if not again else 'AGAIN'} |")
    print()
    print("| capture | traced step + gap (µs) | unprofiled ITL (µs) | stretch | device busy (µs) | idle traced → "
          "unprofiled | decode verdict |")
    print("|---|---|---|---|---|---|---|")
    for folder in sorted({x for a, b, _ in PAIRS for x in (a, b)}):
        d = doc(folder)
        r = d.ranks[0]
        rows = [s for s in r.steps if s.phase == "decode"]
        if not rows:
            continue
        stats = r.phases["decode"]
        gaps = [s.gap_before_us for s in rows if s.gap_before_us is not None]
        cycle = statistics.fmean(s.span_us for s in rows) + (statistics.fmean(gaps) if gaps else 0.0)
        ref = unprofiled_us(folder)
        busy = stats.busy_us_per_step
        verdict = next(v for v in d.verdicts if v.phase == "decode")
        print(f"| {label(folder)} | {cycle:.0f} | {ref:.0f} | {cycle / ref - 1:+.0%} | {busy:.0f} | "
              f"{stats.idle_us_per_step / stats.step_us.mean:.0%} → {max(ref - busy, 0) / ref:.0%} | "
              f"{verdict.kind}: {verdict.what} |")


if __name__ == "__main__":
    main()
