"""bench comm: real gloo runs at world size 2 (torchrun, two processes), checked by an independent route."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
from typer.testing import CliRunner

from children import default_signals
from servescope.cli import app
from servescope.core.comm import load_curves, time_us_at
from servescope.core.errors import InputError

DATA = Path(__file__).parents[1] / "data" / "comm"
WORKER = "servescope.bench.comm_worker"
# nccl-tests' busbw factors written out for n = 2 (all_reduce 2(n-1)/n, the rest (n-1)/n).
FACTOR_N2 = {"all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5, "all_to_all": 0.5}
LLAMA_70B_HIDDEN = 8192   # Llama-3-70B config.json hidden_size


def _workers_alive(tag: str | None = None) -> list[str]:
    """Worker processes still running; with ``tag``, only those started under it (``SERVESCOPE_TEST_TAG`` in
    their environment), so that another run on the same machine (a concurrent suite) does not count."""
    alive = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                env = Path(f"/proc/{pid}/environ").read_bytes() if tag is not None else b""
            except OSError:
                continue
            if WORKER in cmd and (tag is None or f"SERVESCOPE_TEST_TAG={tag}".encode() in env):
                alive.append(f"{pid} {cmd}")
    return alive


def _cli(*args: str, timeout: float = 90, tag: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SERVESCOPE_TEST_TAG": tag} if tag is not None else None
    return subprocess.run([sys.executable, "-m", "servescope", "bench", "comm", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def gloo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict, str]:
    out = tmp_path_factory.mktemp("comm")
    curves, env = out / "curves.json", out / "unit.env"
    proc = _cli("--backend", "gloo", "--gpus", "2", "--sizes", "1K:64K:4", "--iters", "6", "--warmup", "2",
                "--variant", "GLOO_DEVICE_TRANSPORT=TCP", "--model", "llama-3-70b", "--batch", "1,2",
                "-o", str(curves), "--env-out", str(env), "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(curves.read_text()), json.loads(proc.stdout), env.read_text()


def test_curve_file_follows_the_contract(gloo_run: tuple[dict, dict, str]) -> None:
    doc, _, _ = gloo_run
    assert doc["schema"] == "servescope.comm-curves/1" and doc["source"] == "measured"
    assert doc["backend"] == "gloo" and doc["world_size"] == 2 and doc["dtype"] == "bfloat16"
    assert doc["device"] == "cpu (gloo)" and doc["versions"]["nccl"] is None and doc["versions"]["torch"]
    assert doc["date"].endswith("Z") and doc["interconnect"] in {"nvlink", "pcie", "shm", "unknown"}
    keys = {(c["op"], c["variant"], c["graph"]) for c in doc["curves"]}
    assert keys == {(op, v, False) for op in FACTOR_N2 for v in ("default", "GLOO_DEVICE_TRANSPORT=TCP")}
    for c in doc["curves"]:
        assert c["env"] == ({} if c["variant"] == "default" else {"GLOO_DEVICE_TRANSPORT": "TCP"})
        sizes = [p["bytes"] for p in c["points"]]
        # 1K, 4K, 16K, 64K asked, plus the decode sizes 8192 × {1, 2} × 2 bytes = 16384 (already there), 32768
        assert sizes == [1024, 4096, 16384, 32768, 65536]
        for p in c["points"]:
            assert p["iters"] == 6 and p["time_us"] > 0
            algbw = p["bytes"] / (p["time_us"] * 1e-6) / 1e9
            assert math.isclose(p["algbw_gbps"], algbw, rel_tol=1e-3, abs_tol=1e-4)
            assert math.isclose(p["busbw_gbps"], algbw * FACTOR_N2[c["op"]], rel_tol=1e-3, abs_tol=1e-4)


def test_best_variant_and_unit_env_at_decode_sizes(gloo_run: tuple[dict, dict, str]) -> None:
    doc, result, env_text = gloo_run
    assert set(result) >= {"curves", "best_at_decode", "environment", "failures", "output"}
    assert result["failures"] == [] and result["curves"]["curves"] == doc["curves"]
    ar = [c for c in doc["curves"] if c["op"] == "all_reduce"]
    for choice, batch in zip(result["best_at_decode"], (1, 2), strict=True):
        nbytes = LLAMA_70B_HIDDEN * batch * 2
        times = {c["variant"]: next(p["time_us"] for p in c["points"] if p["bytes"] == nbytes) for c in ar}
        assert choice["bytes"] == nbytes and choice["variant"] == min(times, key=times.__getitem__)
        assert math.isclose(choice["time_us"], min(times.values()))
    variants = [c["variant"] for c in result["best_at_decode"]]
    sizes = [c["bytes"] for c in result["best_at_decode"]]

    def total_us(variant: str) -> float:  # ties go to the smaller summed time at the decode sizes
        return sum(min(p["time_us"] for c in ar if c["variant"] == variant for p in c["points"] if p["bytes"] == n)
                   for n in sizes)

    top = min(set(variants), key=lambda v: (-variants.count(v), total_us(v), v))
    lines = [ln for ln in env_text.splitlines() if ln.startswith("Environment=")]
    assert lines == ([] if top == "default" else ["Environment=GLOO_DEVICE_TRANSPORT=TCP"])
    assert result["environment"] == env_text.splitlines()


def test_curve_file_round_trips_through_the_loader(gloo_run: tuple[dict, dict, str], tmp_path: Path) -> None:
    doc, _, _ = gloo_run
    path = tmp_path / "c.json"
    path.write_text(json.dumps(doc))
    loaded = load_curves(path)
    curve = loaded.curve("all_gather", variant="GLOO_DEVICE_TRANSPORT=TCP")
    assert curve is not None and [p.bytes for p in curve.points] == [1024, 4096, 16384, 32768, 65536]
    assert loaded.world_size == 2 and loaded.curve("all_gather", graph=True) is None


def test_bench_comm_as_a_plain_function(tmp_path: Path) -> None:
    """The function the command calls, without the CLI: one real gloo launch (2 ranks), its document returned
    and its curve file written."""
    from servescope.bench.comm import CommRequest, bench_comm
    from servescope.core.comm_result import CommResultDoc

    out = tmp_path / "curves.json"
    doc = bench_comm(CommRequest(ops=("all_reduce",), sizes="1K,4K", backend="gloo", nproc=2, iters=3, warmup=1,
                                 model="llama-3-70b", tp=2, batches=(1,), output=out))
    assert isinstance(doc, CommResultDoc) and doc.failures == [] and doc.output == str(out)
    assert json.loads(out.read_text())["curves"] == json.loads(json.dumps(msgspec.to_builtins(doc.curves)))["curves"]
    [curve] = doc.curves.curves
    # 1K and 4K asked, plus the decode size of batch 1: 8192 × 1 × 2 bytes
    assert (curve.op, curve.variant, [p.bytes for p in curve.points]) == ("all_reduce", "default", [1024, 4096, 16384])
    [choice] = doc.best_at_decode
    at = next(p for p in curve.points if p.bytes == LLAMA_70B_HIDDEN * 2)
    assert (choice.batch, choice.bytes, choice.variant) == (1, LLAMA_70B_HIDDEN * 2, "default")
    assert choice.time_us == at.time_us == choice.default_time_us
    assert doc.environment[0].startswith("# servescope bench comm: best all_reduce variant at decode sizes: default")


@pytest.mark.parametrize(("options", "flag"), [
    ({"ops": ("all_reduce", "broadcast")}, "--ops"),
    ({"ops": ()}, "--ops"),
    ({"dtype": "int8"}, "--dtype"),
    ({"variants": ("NCCL_PROTO",)}, "--variant"),
    ({"sizes": "64M:1K"}, "--sizes"),
    ({"tp": 4}, "--tp"),
])
def test_bench_comm_bad_options_raise_one_input_error_naming_the_flag(options: dict[str, object], flag: str) -> None:
    from servescope.bench.comm import CommRequest, bench_comm

    with pytest.raises(InputError) as caught:
        bench_comm(dataclasses.replace(CommRequest(backend="gloo", nproc=2), **options))
    assert caught.value.source == flag and "\n" not in str(caught.value)


def test_bad_variant_is_one_line_exit_2() -> None:
    res = CliRunner().invoke(app, ["bench", "comm", "--backend", "gloo", "--variant", "NCCL_PROTO"])
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and "--variant" in lines[0] and "NAME=VALUE" in lines[0]


def test_graph_needs_nccl() -> None:
    res = CliRunner().invoke(app, ["bench", "comm", "--backend", "gloo", "--graph", "--sizes", "1K"])
    assert res.exit_code == 2 and "CUDA graphs need" in res.output and len(res.output.strip().splitlines()) == 1


def test_worker_failure_is_one_line_keeps_finished_variants_and_leaves_no_process(tmp_path: Path) -> None:
    out = tmp_path / "c.json"
    tag = f"{os.getpid()}-failure-{time.monotonic_ns()}"  # this test's workers only: not another suite's
    proc = _cli("--backend", "gloo", "--gpus", "2", "--ops", "all_reduce", "--sizes", "1K,4K", "--iters", "3",
                "--variant", "GLOO_SOCKET_IFNAME=nosuchif0", "-o", str(out), tag=tag)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.strip().splitlines() if not line.startswith("bench comm: ")]  # progress
    assert len(lines) == 1 and "variant GLOO_SOCKET_IFNAME=nosuchif0" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    kept = json.loads(out.read_text())   # the default variant ran first and stays
    assert [(c["op"], c["variant"]) for c in kept["curves"]] == [("all_reduce", "default")]
    assert _workers_alive(tag) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_stops_workers_and_keeps_finished_variants(tmp_path: Path, sig: signal.Signals) -> None:
    out = tmp_path / "c.json"
    tag = f"{os.getpid()}-{sig.name}-{time.monotonic_ns()}"
    proc = subprocess.Popen([sys.executable, "-m", "servescope", "bench", "comm", "--backend", "gloo", "--gpus",
                             "2", "--ops", "all_reduce", "--sizes", "1K,4K", "--iters", "400", "--variant",
                             "GLOO_DEVICE_TRANSPORT=TCP", "--variant", "GLOO_DEVICE_TRANSPORT=UV", "-o", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=default_signals,
                            env={**os.environ, "SERVESCOPE_TEST_TAG": tag})
    deadline = time.monotonic() + 60
    while not out.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert out.exists(), "the first variant never finished"
    # the next variant's two ranks running (not only torchrun starting them): what the signal must stop
    while len([w for w in _workers_alive(tag) if "torch.distributed.run" not in w]) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len([w for w in _workers_alive(tag) if "torch.distributed.run" not in w]) == 2, "no variant's ranks ran"
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=60)
    errors = [line for line in stderr.decode().splitlines() if not line.startswith("bench comm: ")]  # progress
    assert proc.returncode == 130 and errors[0].startswith("servescope: error: interrupted"), stderr.decode()
    kept = json.loads(out.read_text())
    assert kept["curves"] and kept["curves"][0]["variant"] == "default"
    assert len(kept["curves"]) < 3
    time.sleep(1.0)
    assert _workers_alive(tag) == []


def test_progress_says_what_it_measures_and_each_op_and_variant_as_they_finish(tmp_path: Path) -> None:
    """Progress lines on stderr while it runs (a default run is a silent minute otherwise), checked against the
    curve file the run writes: one line per curve, each variant's "done" before the next variant starts."""
    out = tmp_path / "c.json"
    proc = subprocess.Popen([sys.executable, "-m", "servescope", "bench", "comm", "--backend", "gloo", "--gpus", "2",
                             "--ops", "all_reduce,all_gather", "--sizes", "1K:16K", "--iters", "200", "--variant",
                             "GLOO_DEVICE_TRANSPORT=TCP", "-o", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)
    assert proc.stderr is not None
    seen: list[tuple[float, str]] = [(time.monotonic(), line.rstrip("\n")) for line in proc.stderr]
    proc.wait(timeout=300)
    ended = time.monotonic()
    assert proc.returncode == 0, seen
    lines = [line for _, line in seen]
    assert lines[0] == ("bench comm: timing all_reduce, all_gather at 5 sizes (1K..16K bytes), bfloat16, 10 warm-up "
                        "+ 200 timed per size, gloo over 2 processes, 2 variants")
    curves = json.loads(out.read_text())["curves"]
    timed = [line for line in lines if " timed (" in line]
    assert [(c["variant"], c["op"]) for c in curves] == [
        (line.split()[4].rstrip(":"), line.split()[5]) for line in timed]
    assert [line.split(":")[1].strip() for line in lines if ": done in " in line] == [
        "variant 1/2 default", "variant 2/2 GLOO_DEVICE_TRANSPORT=TCP"]
    first_done = next(t for t, line in seen if ": done in " in line)
    assert ended - first_done > 1.0, "progress came only at the end"


def test_loader_rejects_another_schema_and_bad_fields(tmp_path: Path) -> None:
    good = json.loads((DATA / "h200_ws1_nccl.json").read_text())
    path = tmp_path / "x.json"
    path.write_text(json.dumps({**good, "schema": "servescope.comm-curves/2"}))
    with pytest.raises(InputError, match="schema 'servescope.comm-curves/2'"):
        load_curves(path)
    bad = json.loads(json.dumps(good))
    bad["curves"][0]["points"].reverse()
    path.write_text(json.dumps(bad))
    with pytest.raises(InputError, match=r"curves\[0\]\.points: not sorted"):
        load_curves(path)


def test_h200_world_size_1_file() -> None:
    doc = load_curves(DATA / "h200_ws1_nccl.json")
    assert doc.device == "NVIDIA H200" and doc.backend == "nccl" and doc.world_size == 1
    assert doc.versions["nccl"] and "code-path proof" in doc.provenance.lower()
    assert {c.graph for c in doc.curves} == {False, True}
    raw = json.loads((DATA / "h200_ws1_nccl.json").read_text())
    for c in raw["curves"]:
        for p in c["points"]:
            assert p["busbw_gbps"] == 0.0   # (n-1)/n = 0 at one rank
            assert math.isclose(p["algbw_gbps"], p["bytes"] / p["time_us"] / 1e3, rel_tol=1e-3, abs_tol=1e-4)


def test_interpolation_follows_the_contract() -> None:
    doc = load_curves(DATA / "h200_ws1_nccl.json")
    curve = doc.curve("all_reduce")
    assert curve is not None
    lo, hi = curve.points[0], curve.points[1]            # 1 KiB and 2 KiB
    mid = math.sqrt(lo.bytes * hi.bytes)                  # halfway in log(bytes) → geometric mean of the times
    assert math.isclose(time_us_at(curve, mid), math.sqrt(lo.time_us * hi.time_us), rel_tol=1e-9)
    assert time_us_at(curve, 10) == lo.time_us
    top = curve.points[-1]
    assert math.isclose(time_us_at(curve, 4 * top.bytes), 4 * top.time_us, rel_tol=1e-9)


def test_table_renders_from_the_document() -> None:
    import io

    from rich.console import Console

    from servescope.core.comm import CurveDoc, CurvePoint, OpCurve
    from servescope.core.comm_result import CommResultDoc
    from servescope.report.comm import render_comm

    point = CurvePoint(bytes=2048, time_us=10.0, algbw_gbps=0.2048, busbw_gbps=0.2048, iters=5)
    doc = CurveDoc(source="measured", provenance="hand-made", device="cpu (gloo)", interconnect="unknown",
                   backend="gloo", versions={"torch": "2.x", "nccl": None}, date="2026-12-02T00:00:00Z", host=None,
                   world_size=2, dtype="bfloat16",
                   curves=(OpCurve(op="all_reduce", variant="default", env={}, graph=False, points=(point,)),))
    buf = io.StringIO()
    result = CommResultDoc(curves=doc, best_at_decode=[], environment=["Environment=A=1"], failures=["x: broke"],
                           output=None)
    render_comm(result, Console(file=buf, width=80, color_system=None))
    lines = buf.getvalue().splitlines()
    assert lines[1].strip() == "all_reduce"
    assert lines[:1] + lines[2:] == [
        "cpu (gloo) · gloo · torch 2.x · 2 ranks · unknown · 2026-12-02T00:00:00Z",
        " size  variant    µs  algbw GB/s  busbw GB/s ",
        "   2K  default  10.0        0.20        0.20 ",
        "Environment=A=1",
        "failed: x: broke",
    ]


def test_the_gloo_curve_file_drives_plan(gloo_run: tuple[dict, dict, str], tmp_path: Path) -> None:
    """The file `bench comm` wrote feeds `plan --comm`: TP=2 all-reduce time = count x the measured point."""
    doc, _, _ = gloo_run
    path = tmp_path / "gloo.json"
    path.write_text(json.dumps(doc))
    config = Path(__file__).parents[1] / "data" / "vllm-cpu-profile" / "tiny-llama.config.json"
    hidden = json.loads(config.read_text())["hidden_size"]
    # an RTX 4090 pair: no P2P, so vLLM 0.26 runs the all-reduce through NCCL, which the curve times (on two H200s
    # it takes the custom one-shot all-reduce, which a bench comm curve does not describe: plan/paths.py)
    args = ["plan", "--model", str(config), "--hardware", "rtx4090", "--gpus", "2", "--batch", "2,8",
            "--comm", str(path)]
    refused = CliRunner().invoke(app, [*args, "--json"])  # a CPU gloo curve for an H200 plan: another setup
    assert refused.exit_code == 2 and "gloo" in refused.output and "--force" in refused.output
    res = CliRunner().invoke(app, [*args, "--force", "--json"])
    assert res.exit_code == 0, res.output
    plan = json.loads(res.stdout)
    assert any("gloo" in note for note in plan["notes"])  # used only when forced, and then said
    assert plan["curves"][0]["origin"] == "measured curve" and plan["curves"][0]["world_size"] == 2
    measured = {p["bytes"]: p["time_us"] for c in doc["curves"]
                if c["op"] == "all_reduce" and c["variant"] == "default" and not c["graph"] for p in c["points"]}
    [tp2] = [layout for layout in plan["layouts"] if (layout["tp"], layout["pp"], layout["ep"]) == (2, 1, 1)]
    scale = plan["factors"]["collective_scale"]["value"]
    for point in tp2["points"]:
        ar = point["collectives_per_step"]["all_reduce"]
        [each] = ar["bytes_each"]  # one size: 2 per layer + the embedding, each batch x hidden x 2 bytes
        assert each["bytes"] == point["batch"] * hidden * 2 and each["bytes"] in measured
        assert each["count"] == ar["count"] == 2 * 2 + 1  # the tiny Llama has 2 layers
        # a microbenchmark's figure gets the assumed wait for the last rank added (data/plan.toml [comm.wait])
        wait = plan["factors"]["wait_us"]["value"]
        assert ar["wait_ms"] == pytest.approx(each["count"] * wait / 1000, rel=1e-6)
        assert ar["ms"] == pytest.approx(each["count"] * (measured[each["bytes"]] * scale + wait) / 1000, rel=1e-6)
