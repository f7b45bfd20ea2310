"""Test helpers: where ``../shared`` lies, the real traces in it (never copied into the repo), a plain reader.

``../shared`` is the corpus beside the checkout that the project may not ship: public and recorded traces
(``traces/``), nvidia-smi outputs of a lent H200 (``gpu/h200``) and the Kimi-K2.5 unit (``examples/``).
``$SERVESCOPE_SHARED`` points elsewhere. Tests that read it carry the ``needs_shared`` marker (or a
parameter that is a path in it); without the corpus they are skipped, and with ``SERVESCOPE_REQUIRE_SHARED=1``
(CI) its absence fails the run (``tests/conftest.py``).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("SERVESCOPE_SHARED") or ROOT.parent / "shared").resolve()
TRACES = SHARED / "traces"
REQUIRE_ENV = "SERVESCOPE_REQUIRE_SHARED"
# CI: tests that read neither ../shared nor are slow run only in the README's clone (tests/conftest.py)
SPLIT_ENV = "SERVESCOPE_CI_SPLIT"

# The traces of ../shared/traces, by name: the tests over "every shared trace" are parametrized from this list
# whether or not the corpus is here, so a clone without it collects (and skips) the same tests;
# test_corpus.py checks the list against the folder when it is there.
CORPUS = (
    "hta/a100_16rank_rank0_training_overlapping_steps.json.gz",
    "hta/a100_8rank_rank3_nccl.json.gz",
    "hta/cpu_only.pt.trace.json.gz",
    "hta/nccl_allreduce_2rank_rank0.json.gz",
    "hta/sampled_128rank_rank0.json.gz",
    "hta/sampled_128rank_rank1.json.gz",
    "public/hf_qwen1.5-0.5b_mi300x_eager_profilerstep.json.gz",
    "public/vllm_llama80L_tp4_h100_1p9d_rank0.pt.trace.json.gz",
    "public/xdit_sd35_mi300x_compiled.json.gz",
    "tracelens/h100_qwen1.5-0.5b_inference.json.gz",
    "tracelens/sglang_qwen3-8b_decode_graph_capture_bs32.json.gz",
    "tracelens/sglang_qwen3-8b_decode_graph_replay.json.gz",
    "tracelens/vllm_decode_full_graph_capture_rank0.pt.trace.json.gz",
    "tracelens/vllm_decode_full_graph_replay.json.gz",
    "vllm-cpu/tp1_b1_32tok_rank0.pt.trace.json.gz",
    "vllm-cpu/tp2_b4_16tok_frontend.async_llm.pt.trace.json.gz",
    "vllm-cpu/tp2_b4_16tok_rank0.pt.trace.json.gz",
    "vllm-cpu/tp2_b4_16tok_rank1.pt.trace.json.gz",
)


def shared_present() -> bool:
    """Whether the ../shared corpus lies beside the checkout (or at $SERVESCOPE_SHARED)."""
    return SHARED.is_dir()


def shared_required() -> bool:
    """CI's rule: with SERVESCOPE_REQUIRE_SHARED=1 a missing corpus fails the run instead of skipping."""
    return os.environ.get(REQUIRE_ENV, "").strip() not in ("", "0")


def in_shared(value: object) -> bool:
    """Whether a test parameter is a path inside ../shared (so the test reads the corpus)."""
    if isinstance(value, (tuple, list)):
        return any(in_shared(v) for v in value)
    return isinstance(value, Path) and (value == SHARED or SHARED in value.parents)


def all_shared_traces() -> list[Path]:
    """Every real trace of ../shared/traces (CORPUS), whether or not the folder is here."""
    return [TRACES / name for name in CORPUS]


def load_events(path: Path) -> list[dict[str, Any]]:
    """Plain json.load of a trace: the independent route the tests compare against."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        doc = json.load(handle)
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def _script(path: Path, name: str) -> ModuleType:
    """The script at ``path`` as the module ``name``, loaded once for the whole test run (the tools and
    benchmarks are scripts, not a package)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while the class is built
        spec.loader.exec_module(module)
    return sys.modules[name]


def benchmark(name: str) -> ModuleType:
    """The script ``benchmarks/NAME.py`` as a module, loaded once for the whole test run (tests that check the
    numbers a benchmark prints call its own functions, and share what it has computed)."""
    return _script(ROOT / "benchmarks" / f"{name}.py", name)


def tool(name: str) -> ModuleType:
    """The script ``tools/NAME.py`` as a module, loaded once for the whole test run."""
    return _script(ROOT / "tools" / f"{name}.py", f"_servescope_tools_{name}")
