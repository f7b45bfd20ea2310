"""The analysis after the trace is decoded, alone: what ``analyze`` runs on one core once the decoding children are
done (nothing else runs then, so each millisecond of it is a millisecond of the command's wall time).

Each run is a fresh process (a cold start, as the command's: regexes compiled on first use, data files read once):
the trace is decoded, the taxonomy and the rules loaded (the command does both while the trace decodes), and then
``trace.analyze.analyze`` is timed with ``time.perf_counter``. With ``--vs SRC`` the runs alternate with a second
tree's ``src`` folder (``git worktree add /tmp/base REV``, then ``--vs /tmp/base/src``), one of each in turn, and the
ratio of the medians is printed: a figure the whole command's noise (two cores shared with the decoding children,
±10 %) hides.

Run:  .venv/bin/python benchmarks/analysis_tail.py [--trace TRACE] [--runs N] [--vs OTHER_SRC]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

_TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "hta" / "a100_8rank_rank3_nccl.json.gz"

_CHILD = """
import gc, sys, time
gc.disable()
from pathlib import Path
from servescope.trace.analyze import AnalyzeRequest, analyze
from servescope.trace.classify.taxonomy import load_taxonomy
from servescope.trace.read.files import find_traces
from servescope.trace.read.trace_json import decode_trace
from servescope.trace.rules.findings import load_rules
path = Path(sys.argv[1])
found = find_traces([path])
data = decode_trace(path)
class Decoded:
    def take(self, _path):
        return data
load_taxonomy(None)
load_rules()
start = time.perf_counter()
analyze(AnalyzeRequest(paths=found), read_ahead=Decoded())
print(time.perf_counter() - start)
"""


def _once(trace: Path, src: str | None) -> float:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    if src is not None:
        env["PYTHONPATH"] = src
    out = subprocess.run([sys.executable, "-c", _CHILD, str(trace)], env=env, capture_output=True, text=True,
                         check=True)
    return float(out.stdout.strip()) * 1000.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=_TRACE)
    parser.add_argument("--runs", type=int, default=11)
    parser.add_argument("--vs", metavar="OTHER_SRC", help="another tree's src folder, run in turn with this one")
    args = parser.parse_args()
    if not args.trace.is_file():
        sys.exit(f"analysis_tail.py: {args.trace}: no such file (give --trace)")
    this: list[float] = []
    other: list[float] = []
    for _ in range(args.runs):
        this.append(_once(args.trace, None))
        if args.vs:
            other.append(_once(args.trace, args.vs))
    print(f"this tree: median {statistics.median(this):.1f} ms, min {min(this):.1f} ms ({args.runs} runs)")
    if args.vs:
        print(f"{args.vs}: median {statistics.median(other):.1f} ms, min {min(other):.1f} ms")
        print(f"ratio of the medians (this / other): {statistics.median(this) / statistics.median(other):.3f}")


if __name__ == "__main__":
    main()
