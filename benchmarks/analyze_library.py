"""``servescope analyze TRACE --json -o OUT`` without the command line: the feature function alone.

The same work as the command (its feature function :func:`servescope.trace.run.analyze_traces`: read-ahead
started before the analysis is imported; the JSON document written atomically and printed), without the CLI
layer's imports, so that
``analyze_vs_hta.py --servescope "PYTHON benchmarks/analyze_library.py"`` measures what trace/ costs and the
difference to the plain run is what the CLI adds at start-up.

Run:  .venv/bin/python benchmarks/analyze_library.py analyze TRACE --json -o OUT.json
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main(argv: list[str]) -> None:
    if len(argv) != 5 or argv[0] != "analyze" or argv[2:4] != ["--json", "-o"]:
        sys.exit("usage: analyze_library.py analyze TRACE --json -o OUT")
    from servescope.trace.run import analyze_traces

    doc = analyze_traces([Path(argv[1])]).doc  # decoding starts before the analysis is imported, as in the command
    from servescope.core.atomic import write_bytes_atomic
    from servescope.core.document import encode

    encoded = encode(doc)
    write_bytes_atomic(Path(argv[4]), encoded)
    sys.stdout.buffer.write(encoded + b"\n")
    sys.stdout.flush()
    os._exit(0)  # as the command: no teardown of the analysis' objects


if __name__ == "__main__":
    main(sys.argv[1:])
