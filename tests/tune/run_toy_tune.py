"""Runs tune against the toy server in its own process, for the fault tests (signals, kill -9).

``python run_toy_tune.py SPEC.json``; SPEC: ``mode`` (launch | unit), ``journal``, ``port``, ``flags`` (the toy's),
``unit``/``unit_file``/``dropin_dir`` (unit mode), ``delay_s`` and ``marker`` (each load takes ``delay_s`` after
writing ``marker``), ``out`` (the document), ``resume`` (continue the journal's run). Exits 130 when interrupted.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from servescope.core.document import encode  # noqa: E402
from servescope.deploy.unitfile import load_unit, split_command_line  # noqa: E402
from servescope.tune.api import TuneSetup, resume_tune, tune_server  # noqa: E402
from tune.toy import toy_command, toy_measure  # noqa: E402


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text())
    seqs_of = None
    if spec["mode"] == "unit":
        def seqs_of(url: str) -> int:  # what systemd would run: the unit and its drop-ins
            unit = load_unit(Path(spec["unit_file"]), dropin_dirs=[Path(spec["dropin_dir"])])
            argv = split_command_line(unit.get("Service", "ExecStart") or "").argv
            return int(argv[argv.index("--max-num-seqs") + 1])
    measure = toy_measure(delay_s=spec.get("delay_s", 0.0), marker=Path(spec["marker"]) if spec.get("marker")
                          else None, seqs_of=seqs_of)
    say = lambda text, transient: print(text, flush=True)  # noqa: E731
    if spec.get("resume"):
        doc = resume_tune(Path(spec["journal"]), say=say, measure=measure, confirm=lambda _: True)
    else:
        setup = TuneSetup(
            launch=toy_command(spec["port"], *spec["flags"]) if spec["mode"] == "launch" else None,
            unit=spec.get("unit"), unit_file=Path(spec["unit_file"]) if spec.get("unit_file") else None,
            dropin_dir=Path(spec["dropin_dir"]) if spec.get("dropin_dir") else None,
            url=f"http://127.0.0.1:{spec['port']}", journal=Path(spec["journal"]), ready_timeout_s=60)
        doc = tune_server(setup, say=say, measure=measure, confirm=lambda _: True)
    Path(spec["out"]).write_bytes(encode(doc))
    return 130 if doc.stopped == "interrupted" else 0


if __name__ == "__main__":
    sys.exit(main())
