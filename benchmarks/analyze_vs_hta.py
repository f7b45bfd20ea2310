"""Side-by-side cost of ``servescope analyze`` and HTA on the same traces: wall time and peak RSS.

Each measurement is one fresh child process, so its figures are that process's own:

* HTA: ``TraceAnalysis(trace_dir=DIR)`` (the trace alone, symlinked into DIR) + ``get_gpu_kernel_breakdown``;
* servescope: ``servescope analyze TRACE --json -o OUT.json``;
* plain json: open/gunzip + ``orjson.loads`` (``json`` without orjson) + sum of kernel ``dur``, the floor.

Both tools run from byte-compiled modules, as ``pip install`` leaves them (an editable install in an
environment with ``PYTHONDONTWRITEBYTECODE`` set would otherwise compile servescope on every run): the script
runs ``compileall`` on each tool's package first. Wall is ``time.perf_counter()`` around the whole process,
start-up included; peak RSS is ``ru_maxrss`` from
``os.wait4`` (the largest single process of the child's tree). ``--repeat`` runs each, the tools in turn
(HTA, servescope, plain, HTA, ...): median wall, max RSS, and HTA's wall over servescope's run by run (its
median and range: a drift in a shared machine's speed moves both sides of a pair alike).
A run that exits non-zero, leaves no output, times out, or hits the per-child address-space cap
(``--mem-limit-gb``, so a runaway parse gets MemoryError rather than the OOM killer) is reported as such,
never timed. Traces: ``--trace`` (the 35 MB A100 rank trace) and a ~1 GB plain-JSON trace built from it and
cached in ``--work-dir``: its events repeated, each copy shifted by the span + 1 ms, with ids and step
numbers offset. Goals (issue 39 item 7): 35 MB -> servescope >=15x faster and <=0.25x HTA's RSS; 1 GB -> <=5 s,
<=1.5 GB. MB = 10^6 bytes. See benchmarks/README.md.

``--ranks N`` adds a row with no goal: the trace as ranks 0..N-1 in one directory (one run's rank traces), which
HTA and servescope each analyze whole.

Run:  .venv/bin/python benchmarks/analyze_vs_hta.py [--skip-large|--skip-hta-large] [--ranks N] [--json-out F]
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import platform
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

try:
    import orjson
except ImportError:  # depends on the venv
    orjson = None

# ../shared beside the checkout; the HTA venv under the user's cache
DEFAULT_TRACE = str(Path(__file__).resolve().parents[2] / "shared/traces/hta/a100_8rank_rank3_nccl.json.gz")
_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
DEFAULT_HTA_PYTHON = str(_CACHE / "servescope/hta-venv/bin/python")
SMALL_GOAL = (15.0, 0.25)  # speed ratio at least, RSS ratio at most (issue 39 item 7)
LARGE_GOAL = (5.0, 1500.0)  # seconds at most, MB at most
ID_ARGS = ("correlation", "External id")  # per-event ids in ``args`` that copies offset

HTA_CHILD = """
import sys
from hta.trace_analysis import TraceAnalysis
by_type, by_kernel = TraceAnalysis(trace_dir=sys.argv[1]).get_gpu_kernel_breakdown(visualize=False)
if by_type.empty or by_kernel.empty:
    sys.exit("HTA returned an empty kernel breakdown")
print(by_type.to_string())
"""
PLAIN_CHILD = """
import gzip, importlib.util, json, sys
loads = __import__("orjson").loads if importlib.util.find_spec("orjson") else json.loads
p = sys.argv[1]
with (gzip.open if p.endswith(".gz") else open)(p, "rb") as f:
    doc = loads(f.read())
print(sum(e.get("dur", 0) for e in doc["traceEvents"] if e.get("cat") == "kernel"))
"""
VERSIONS_CHILD = """
import json, importlib.metadata as m
have = {(d.metadata["Name"] or "").lower(): d.version for d in m.distributions()}
wanted = ("holistictraceanalysis", "pandas", "numpy", "orjson", "servescope", "msgspec")
print(json.dumps({n: have[n] for n in wanted if n in have}))
"""

Check = Callable[[Path, Path], str | None]  # (stdout file, -o file) -> error or None


def dumps(obj: Any) -> str:
    return orjson.dumps(obj).decode() if orjson is not None else json.dumps(obj)


def measure_once(argv: list[str], timeout: float, mem_limit: int, check: Check) -> dict[str, Any]:
    """Run ``argv`` once as a child; return its status, wall seconds and peak RSS (MB)."""
    load_before = os.getloadavg()[0]  # the machine's load as the run starts (a shared machine's others)
    with tempfile.TemporaryDirectory(prefix="bench-run-") as tmp:
        out, err, result = Path(tmp, "stdout"), Path(tmp, "stderr"), Path(tmp, "result.json")
        argv = [a.replace("{OUT}", str(result)) for a in argv]
        with out.open("wb") as fo, err.open("wb") as fe:
            t0 = time.perf_counter()
            proc = subprocess.Popen(argv, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL,
                                    preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (mem_limit, mem_limit)),
                                    start_new_session=True)
            timer = threading.Timer(timeout, os.killpg, (proc.pid, signal.SIGKILL))
            timer.start()
            _, status, usage = os.wait4(proc.pid, 0)
            wall = time.perf_counter() - t0
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped by wait4 above
        rss_mb = usage.ru_maxrss * 1024 / 1e6
        tail = err.read_text(errors="replace")[-2000:]
        if proc.returncode == -signal.SIGKILL and wall >= timeout:
            state = f"timed out ({timeout:.0f} s)"
        elif "MemoryError" in tail or proc.returncode == -signal.SIGKILL:
            state = f"out of memory ({mem_limit / 2**30:g} GiB cap)"
        elif proc.returncode != 0:
            state = f"failed (rc={proc.returncode})"
        else:
            state = check(out, result) or "ok"
        if state != "ok" and tail.strip():
            print(f"    {state}; stderr tail:\n      " + "\n      ".join(tail.strip().splitlines()[-6:]))
        return {"status": state, "wall_s": wall, "rss_mb": rss_mb, "load_1min": load_before}


def check_stdout(out: Path, _result: Path) -> str | None:
    return None if out.stat().st_size > 0 else "failed (empty output)"


def check_json_file(_out: Path, result: Path) -> str | None:
    try:
        return None if json.loads(result.read_bytes()) else "failed (empty JSON)"
    except (OSError, ValueError) as e:
        return f"failed (no usable -o output: {e})"


def summarize(argv: list[str], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One tool's runs: median wall and max RSS when every run was ok, else the failure."""
    ok = all(r["status"] == "ok" for r in runs)
    return {"status": "ok" if ok else runs[-1]["status"], "argv": argv, "runs": runs,
            "wall_s": statistics.median(r["wall_s"] for r in runs) if ok else None,
            "rss_mb": max(r["rss_mb"] for r in runs) if ok else None}


def measure_in_turn(tools: dict[str, tuple[list[str], float, Check]], repeat: int, mem_limit: int
                    ) -> dict[str, dict[str, Any]]:
    """Each tool ``repeat`` times, in turn (A B C A B C ...), so that a drift in the machine's speed touches them
    alike; a tool that fails is reported, not averaged, and not run again (no second timeout burnt on it)."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in tools}
    for i in range(repeat):
        for name, (argv, timeout, check) in tools.items():
            if runs[name] and runs[name][-1]["status"] != "ok":
                continue
            runs[name].append(measure_once(argv, timeout, mem_limit, check))
            print(f"  {name:<10} run {i + 1}/{repeat}: {runs[name][-1]['status']:<12} "
                  f"{runs[name][-1]['wall_s']:8.2f} s {runs[name][-1]['rss_mb']:9.0f} MB "
                  f"(load {runs[name][-1]['load_1min']:.1f})", flush=True)
    return {name: summarize(tools[name][0], runs[name]) for name in tools}


def pair_ratios(slow: dict[str, Any], fast: dict[str, Any]) -> list[float]:
    """``slow``'s wall over ``fast``'s, run by run (runs made in turn)."""
    if slow["status"] != "ok" or fast["status"] != "ok":
        return []
    return [a["wall_s"] / b["wall_s"] for a, b in zip(slow["runs"], fast["runs"], strict=True)]


def build_large(src: Path, work_dir: Path, target_bytes: int) -> Path:
    """Write (once; cached) a ~target_bytes plain-JSON trace made of shifted copies of ``src``'s events."""
    out = work_dir / f"{src.name.split('.')[0]}_{target_bytes / 1e9:g}GB.json"
    if out.exists():
        print(f"large trace (cached): {out} {out.stat().st_size / 1e6:.0f} MB")
        return out
    with (gzip.open if src.suffix == ".gz" else open)(src, "rb") as fin:
        doc = json.loads(fin.read())
    meta = [e for e in doc["traceEvents"] if e.get("ph") == "M"]  # process/thread names: written once
    body: list[dict[str, Any]] = [e for e in doc["traceEvents"] if e.get("ph") != "M"]
    start = min(e["ts"] for e in body if "ts" in e)
    end = max(e["ts"] + e.get("dur", 0) for e in body if "ts" in e)
    shift = (end - start) + 1000  # the trace's span plus a 1 ms gap
    ids = [e["id"] for e in body if isinstance(e.get("id"), int)] + [
        v for e in body for k, v in e.get("args", {}).items() if k in ID_ARGS and type(v) is int]
    id_step = max(ids, default=0) + 1
    steps = [int(e["name"][13:]) for e in body if e.get("name", "").startswith("ProfilerStep#")]
    step_step = max(steps, default=0) - min(steps, default=0) + 1  # copies continue the step numbering

    def copy(k: int) -> str:
        parts = []
        for e in body:
            e2 = dict(e)
            if "ts" in e2:
                e2["ts"] = e["ts"] + k * shift
            if isinstance(e2.get("id"), int):
                e2["id"] = e["id"] + k * id_step
            if e2.get("name", "").startswith("ProfilerStep#"):
                e2["name"] = f"ProfilerStep#{int(e['name'][13:]) + k * step_step}"
            args = e.get("args")
            if args and any(a in args for a in ID_ARGS):
                e2["args"] = {a: v + k * id_step if a in ID_ARGS and type(v) is int
                              else v for a, v in args.items()}
            parts.append(dumps(e2))
        return ",\n".join(parts)

    work_dir.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.part")
    first = copy(0)
    copies = max(1, round(target_bytes / len(first)))
    with tmp.open("w") as f:
        f.write("{\n")
        for key, value in doc.items():
            if key != "traceEvents":
                f.write(f"  {json.dumps(key)}: {json.dumps(value)},\n")
        f.write('  "traceEvents": [\n')
        f.write(",\n".join(dumps(e) for e in meta) + (",\n" if meta else ""))
        for k in range(copies):
            f.write((first if k == 0 else copy(k)) + (",\n" if k < copies - 1 else "\n"))
        f.write("  ]\n}\n")
    tmp.rename(out)
    print(f"large trace built: {out} {out.stat().st_size / 1e6:.0f} MB, "
          f"{len(meta) + copies * len(body)} events ({copies} copies)")
    return out


def fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, default=Path(DEFAULT_TRACE), help="the 35 MB trace (and the source)")
    ap.add_argument("--hta-python", default=os.environ.get("SERVESCOPE_HTA_PYTHON", DEFAULT_HTA_PYTHON))
    ap.add_argument("--servescope", default=shlex.join([sys.executable, "-m", "servescope"]))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/servescope-bench"))
    ap.add_argument("--large-gb", type=float, default=1.0, help="size of the built trace (default 1.0)")
    ap.add_argument("--skip-large", action="store_true", help="only the 35 MB trace")
    ap.add_argument("--skip-hta-large", action="store_true", help="don't run HTA on the large trace")
    ap.add_argument("--ranks", type=int, default=0,
                    help="also N ranks in one directory: the trace as ranks 0..N-1 (no goal; default: skip)")
    ap.add_argument("--hta-timeout", type=float, default=300.0)
    ap.add_argument("--timeout", type=float, default=300.0, help="for servescope and plain json")
    ap.add_argument("--mem-limit-gb", type=float, default=16.0, help="address-space cap for each child")
    ap.add_argument("--json-out", type=Path)
    a = ap.parse_args()

    traces = [("small", a.trace)]
    if not a.skip_large:
        traces.append(("large", build_large(a.trace, a.work_dir, int(a.large_gb * 1e9))))
    if a.ranks:
        traces.append(("ranks", build_ranks(a.trace, a.work_dir, a.ranks)))
    compile_package(shlex.split(a.servescope)[0], "servescope")
    compile_package(a.hta_python, "hta")
    results = [bench_trace(kind, trace, a, int(a.mem_limit_gb * 2**30)) for kind, trace in traces]
    print_table(results, a.repeat)
    if a.json_out:
        doc = {"machine": machine_info(a.hta_python), "settings": {k: str(v) for k, v in vars(a).items()},
               "results": results}
        a.json_out.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"raw figures: {a.json_out}")
    return 0


def compile_package(python: str, package: str) -> None:
    """Byte-compile ``package`` as that interpreter imports it (what ``pip install`` does at install time)."""
    where = subprocess.run([python, "-c", f"import {package}, os; print(os.path.dirname({package}.__file__))"],
                           capture_output=True, text=True)
    if where.returncode == 0:
        subprocess.run([python, "-m", "compileall", "-q", where.stdout.strip()], stdout=subprocess.DEVNULL,
                       check=False)


def build_ranks(src: Path, work_dir: Path, ranks: int) -> Path:
    """Write (once; cached) a directory of ``ranks`` copies of ``src``, each with its own distributedInfo.rank:
    one run's rank traces, as vLLM writes them."""
    out = work_dir / f"ranks{ranks}"
    if out.is_dir() and len(list(out.glob("rank*.pt.trace.json.gz"))) == ranks:
        return out
    out.mkdir(parents=True, exist_ok=True)
    with (gzip.open if src.suffix == ".gz" else open)(src, "rb") as fin:
        doc = json.loads(fin.read())
    for rank in range(ranks):
        doc["distributedInfo"] = {**doc.get("distributedInfo", {}), "rank": rank, "world_size": ranks}
        with gzip.open(out / f"rank{rank}.pt.trace.json.gz", "wb", compresslevel=6) as fout:
            fout.write(json.dumps(doc).encode())
    return out


def json_mb(path: Path) -> float:
    """MB of JSON in a trace file, or in every trace file of a directory."""
    if path.is_dir():
        return sum(json_mb(p) for p in sorted(path.glob("*.json*")))
    if path.suffix != ".gz":
        return path.stat().st_size / 1e6
    with gzip.open(path, "rb") as gz:
        return sum(len(b) for b in iter(lambda: gz.read(1 << 24), b"")) / 1e6


def bench_trace(kind: str, trace: Path, a: argparse.Namespace, mem_limit: int) -> dict[str, Any]:
    """All three tools on one trace (HTA and servescope on a directory of ranks), the ratios and the goal."""
    size_mb = json_mb(trace)
    print(f"{trace.name} ({size_mb:.0f} MB of JSON)", flush=True)
    for path in [trace] if trace.is_file() else sorted(trace.iterdir()):
        subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)  # warm the page cache
    hta_dir = trace if trace.is_dir() else a.work_dir / f"hta-{trace.name}"  # HTA loads a whole directory
    hta_dir.mkdir(parents=True, exist_ok=True)
    if trace.is_file() and not (hta_dir / trace.name).is_symlink():
        (hta_dir / trace.name).symlink_to(trace.resolve())
    row: dict[str, Any] = {"trace": str(trace), "kind": kind, "json_mb": size_mb}
    skipped = {"status": "skipped", "wall_s": None, "rss_mb": None}
    tools: dict[str, tuple[list[str], float, Check]] = {}
    if not (kind == "large" and a.skip_hta_large):
        tools["HTA"] = ([a.hta_python, "-c", HTA_CHILD, str(hta_dir)], a.hta_timeout, check_stdout)
    tools["servescope"] = ([*shlex.split(a.servescope), "analyze", str(trace), "--json", "-o", "{OUT}"], a.timeout,
                           check_json_file)
    if trace.is_file():
        tools["plain json"] = ([sys.executable, "-c", PLAIN_CHILD, str(trace)], a.timeout, check_stdout)
    measured = measure_in_turn(tools, a.repeat, mem_limit)
    row["hta"] = measured.get("HTA", skipped)
    row["servescope"] = measured["servescope"]
    row["plain"] = measured.get("plain json", skipped)
    pairs = pair_ratios(row["hta"], row["servescope"])
    row["pair_speed_ratios"] = pairs
    row["pair_speed_ratio_median"] = statistics.median(pairs) if pairs else None
    h, s = row["hta"], row["servescope"]
    row["speed_ratio"] = h["wall_s"] / s["wall_s"] if h["wall_s"] and s["wall_s"] else None
    row["rss_ratio"] = s["rss_mb"] / h["rss_mb"] if h["rss_mb"] and s["rss_mb"] else None
    if s["status"] != "ok":
        row["goal"] = "NO (servescope failed)"
    elif kind == "ranks":
        row["goal"] = "n/a (no goal)"
    elif kind == "small" and row["speed_ratio"] is None:
        row["goal"] = f"n/a (HTA {h['status']})"
    elif kind == "small":
        met = row["speed_ratio"] >= SMALL_GOAL[0] and row["rss_ratio"] <= SMALL_GOAL[1]
        row["goal"] = ("yes" if met else "NO") + f" (>={SMALL_GOAL[0]:g}x, <={SMALL_GOAL[1]:g}x RSS)"
    else:
        met = s["wall_s"] <= LARGE_GOAL[0] and s["rss_mb"] <= LARGE_GOAL[1]
        row["goal"] = ("yes" if met else "NO") + f" (<={LARGE_GOAL[0]:g} s, <={LARGE_GOAL[1]:g} MB)"
    return row


def print_table(results: list[dict[str, Any]], repeat: int) -> None:
    def cell(m: dict[str, Any], key: str, spec: str) -> str:
        return fmt(m[key], spec) if m["status"] == "ok" else m["status"]

    head = ["trace", "MB", "load", "HTA s", "servescope s", "plain s", "HTA/ss", "pairs", "HTA MB", "ss MB",
            "plain MB", "ss/HTA RSS", "goal met"]
    lines = [head]
    for r in results:
        h, s, p = r["hta"], r["servescope"], r["plain"]
        speed = fmt(r["speed_ratio"], ".1f") + ("x" if r["speed_ratio"] else "")
        pairs = r.get("pair_speed_ratios") or []
        spread = (f"{statistics.median(pairs):.1f}x ({min(pairs):.1f}-{max(pairs):.1f})" if pairs else "-")
        loads = [run["load_1min"] for m in (h, s, p) for run in m.get("runs", [])]
        load = f"{min(loads):.1f}-{max(loads):.1f}" if loads else "-"
        lines.append([Path(r["trace"]).name, f"{r['json_mb']:.0f}", load, cell(h, "wall_s", ".2f"),
                      cell(s, "wall_s", ".2f"), cell(p, "wall_s", ".2f"), speed, spread, cell(h, "rss_mb", ".0f"),
                      cell(s, "rss_mb", ".0f"), cell(p, "rss_mb", ".0f"), fmt(r["rss_ratio"], ".2f"), r["goal"]])
    widths = [max(len(x[i]) for x in lines) for i in range(len(head))]
    print()
    for line in lines:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(line, widths, strict=True))))
    print(f"\nmedian wall of {repeat} runs made in turn, max peak RSS; load: the 1-minute load average as the runs"
          " started (min-max); HTA/ss: ratio of the medians; pairs: the ratio run by run, median (range);"
          " ss = servescope; MB = 10^6 bytes")


def machine_info(hta_python: str) -> dict[str, Any]:
    versions = {}
    for py in (sys.executable, hta_python):
        res = subprocess.run([py, "-c", VERSIONS_CHILD], capture_output=True, text=True)
        versions[py] = json.loads(res.stdout) if res.returncode == 0 else {"error": res.stderr[-500:]}
    mem = [ln.split()[1] for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal")]
    return {"platform": platform.platform(), "processor": platform.processor(), "cpu_count": os.cpu_count(),
            "mem_total_kib": int(mem[0]) if mem else None, "python": sys.version, "versions": versions,
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}


if __name__ == "__main__":
    sys.exit(main())
