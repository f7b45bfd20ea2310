#!/usr/bin/env python3
"""Tables of a `scaled` / `anchor` load session on the lent H200 (tools/gpu_vllm/device_session.sh).

Reads the files the session brought back (stdlib only, nothing of servescope):

  bench-<name>.json              servescope bench serve: client figures and the engine means it scraped
  vbench/vllm-bench-c<C>.json    `vllm bench serve` (the anchor) at C streams
  vbench/metrics-{before,after}-c<C>.txt (or vbench/metrics.tgz holding them)
                                 the server's /metrics around each anchor point: the engine's own means over
                                 exactly that point, from the histograms' _sum/_count differences

  python3 benchmarks/h200_load_table.py DIR [DIR ...]    # one markdown section per bench-*.json found
"""

from __future__ import annotations

import json
import re
import sys
import tarfile
from pathlib import Path

HISTOGRAMS = {
    "ttft": "vllm:time_to_first_token_seconds",
    "tpot": "vllm:request_time_per_output_token_seconds",
    "itl": "vllm:inter_token_latency_seconds",
}
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def read_scrape(vbench: Path, name: str) -> str:
    """One saved /metrics scrape: the text file, or its member of ``metrics.tgz`` (how results keep them)."""
    if (vbench / name).is_file():
        return (vbench / name).read_text()
    with tarfile.open(vbench / "metrics.tgz") as tar:
        member = tar.extractfile(name)
        if member is None:
            raise SystemExit(f"{vbench / 'metrics.tgz'}: no {name}")
        return member.read().decode()


def scrape_totals(text: str) -> dict[str, float]:
    """Sum every label set of each histogram's _sum and _count (all engines, all front ends)."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m and (m.group(1).endswith("_sum") or m.group(1).endswith("_count")):
            totals[m.group(1)] = totals.get(m.group(1), 0.0) + float(m.group(3))
    return totals


def engine_means(before: str, after: str) -> dict[str, float]:
    """Mean of each histogram over the interval between two scrapes, in ms."""
    b, a = scrape_totals(before), scrape_totals(after)
    out = {}
    for key, name in HISTOGRAMS.items():
        count = a.get(name + "_count", 0.0) - b.get(name + "_count", 0.0)
        total = a.get(name + "_sum", 0.0) - b.get(name + "_sum", 0.0)
        out[key] = 1000.0 * total / count if count else float("nan")
    return out


def pct(client: float, engine: float) -> str:
    return f"{100.0 * (client / engine - 1.0):+.1f}%"


def servescope_table(doc: dict) -> list[str]:
    rows = ["| streams | workers | requests | client TTFT | engine TTFT | client TPOT | engine TPOT "
            "| TPOT client/engine | client ITL | engine ITL | lag p99 | lag max | out tok/s | findings |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in doc["points"]:
        s = p["server"]
        kinds = sorted({f.get("id", "?") for f in p.get("findings", [])})
        rows.append(
            f"| {p['concurrency']} | {p['workers']} | {p['requests']} | {p['ttft_ms']['mean']:.1f} | "
            f"{s['ttft_ms_mean']:.1f} | {p['tpot_ms']['mean']:.2f} | {s['tpot_ms_mean']:.2f} | "
            f"{pct(p['tpot_ms']['mean'], s['tpot_ms_mean'])} | {p['itl_ms']['mean']:.2f} | {s['itl_ms_mean']:.2f} | "
            f"{p['client_lag']['p99_ms']:.2f} | {p['client_lag']['max_ms']:.1f} | {p['output_tokens_per_s']:.0f} | "
            f"{', '.join(kinds) or 'none'} |")
    return rows


def anchor_table(vbench: Path) -> list[str]:
    rows = ["| streams | prompts | s | client TTFT | engine TTFT | client TPOT | engine TPOT | TPOT client/engine "
            "| client ITL | engine ITL | out tok/s |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    points = sorted(vbench.glob("vllm-bench-c*.json"), key=lambda p: int(p.stem.rsplit("c", 1)[1]))
    for path in points:
        c = path.stem.rsplit("c", 1)[1]
        r = json.loads(path.read_text())
        e = engine_means(read_scrape(vbench, f"metrics-before-c{c}.txt"),
                         read_scrape(vbench, f"metrics-after-c{c}.txt"))
        rows.append(
            f"| {c} | {r['completed']} | {r['duration']:.1f} | {r['mean_ttft_ms']:.1f} | {e['ttft']:.1f} | "
            f"{r['mean_tpot_ms']:.2f} | {e['tpot']:.2f} | {pct(r['mean_tpot_ms'], e['tpot'])} | "
            f"{r['mean_itl_ms']:.2f} | {e['itl']:.2f} | {r['output_throughput']:.0f} |")
    return rows


def main(dirs: list[str]) -> int:
    for d in map(Path, dirs):
        for bench in sorted(d.glob("bench-*.json")):
            print(f"## {bench.stem}: servescope bench serve ({d})\n")
            print("\n".join(servescope_table(json.loads(bench.read_text()))) + "\n")
        if (d / "vbench").is_dir():
            print(f"## vllm bench serve, the anchor ({d}); engine = /metrics after - before each point\n")
            print("\n".join(anchor_table(d / "vbench")) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
