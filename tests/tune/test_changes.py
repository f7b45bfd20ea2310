"""The catalogue both ways, entry by entry: the evidence that calls for it makes a candidate with the edit it
should; the same change in place, not allowed or waiting on an input is not one.

Real evidence where it exists: the H200 A/B captures (analyze over their traces, with the settings document of
each live server beside them) and their server logs; the knee's causes are given as ``bench serve`` names them.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from pathlib import Path

import msgspec
import pytest

from servescope.core.analysis import SettingEvidence
from servescope.core.changes import (
    Candidate,
    ChangeEvidence,
    SeenFinding,
    load_catalogue,
    match_changes,
    moe_log_facts,
)
from servescope.core.document import read_document
from servescope.core.errors import InputError
from servescope.core.next_steps import evidence_of_analysis, next_steps
from servescope.trace.analyze import AnalyzeRequest, analyze
from servescope.trace.rules.deployment import from_settings_doc
from servescope.tune.edit import ServerConfig
from servescope.tune.evidence import deployment_of

AB = Path(__file__).resolve().parents[1] / "data" / "h200-vllm" / "ab"
H100 = Path(__file__).resolve().parents[1] / "data" / "h100-vllm" / "sweep"
# vLLM's warning, as fused_moe.py logs it (logger.warning("Using default MoE config. Performance might be
# sub-optimal! Config file not found at %s", ...)) for the bundled example's expert shape on an H200
MOE_LINE = ("(EngineCore pid=1304) WARNING 12-04 21:04:10 [fused_moe.py:1015] Using default MoE config. Performance "
            "might be sub-optimal! Config file not found at /usr/local/lib/python3.12/dist-packages/vllm/"
            "model_executor/layers/fused_moe/configs/E=128,N=768,device_name=NVIDIA_H200.json")


def _captured(name: str) -> tuple[ChangeEvidence, list[str]]:
    """analyze of one A/B capture with its live server's settings document: the evidence, and its command line."""
    folder = AB / name
    settings = from_settings_doc(read_document(folder / "settings.json"), str(folder / "settings.json"))
    doc = analyze(AnalyzeRequest(paths=[folder / "rank0.pt.trace.json.gz"], settings=[settings]))
    return evidence_of_analysis(doc, argv=settings.argv), settings.argv


def _argv(name: str) -> list[str]:
    folder = AB / name
    return from_settings_doc(read_document(folder / "settings.json"), "s").argv


def _ids(ev: ChangeEvidence, allow: tuple[str, ...] = ()) -> tuple[dict[str, Candidate], dict[str, str]]:
    matched = match_changes(ev, allow=allow)
    return {c.id: c for c in matched.candidates}, {n.id: n.reason for n in matched.ruled_out}


def _with_settings(argv: list[str], **kw: object) -> ChangeEvidence:
    """Evidence of a server by its command line, its settings told by the same route tune uses (vLLM 0.26)."""
    settings = deployment_of(ServerConfig(tuple(argv)), "0.26.0")
    return ChangeEvidence(argv=argv, settings=settings, **kw)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------- the launch-bound family

def test_cuda_graphs_called_by_an_eager_capture() -> None:
    ev, argv = _captured("dense-eager-b16")
    assert "--enforce-eager" in argv
    cands, out = _ids(ev)
    assert cands["cuda-graphs"].edit.remove == ["--enforce-eager"]
    # the range is the finding's own: the host time the device waits for, a share s of the step cycle; the same
    # tokens in a cycle shorter by s come s / (1 - s) faster (s counted up to 0.9)
    finding = next(f for f in ev.findings if f.id == "launch_bound")
    low, high = (min(x, 0.9) for x in finding.gains["cuda_graphs"])
    assert cands["cuda-graphs"].gain_low == pytest.approx(low / (1 - low))
    assert cands["cuda-graphs"].gain_high == pytest.approx(high / (1 - high))
    assert "cudagraph-mode" not in cands and out.get("cudagraph-mode") in (None, "in_place")


def test_cuda_graphs_in_place_on_a_graphed_server() -> None:
    argv = _argv("dense-async-b1")
    cands, out = _ids(_with_settings(argv, knee_cause="step_time", load=4, platform="cuda"))
    assert "cuda-graphs" not in cands and out["cuda-graphs"] == "in_place"


def test_capture_size_called_by_steps_above_the_captured_size() -> None:
    ev, argv = _captured("dense-cap32-b64")
    assert argv[argv.index("--max-cudagraph-capture-size") + 1] == "32"
    cands, _ = _ids(ev)
    # the decode batch of the capture is 64 (its README): the next power of two at or above it
    assert cands["capture-size"].edit.set_flags == {"--max-cudagraph-capture-size": "64"}
    # the steps ran without graphs because the batch was above the captured sizes: the capture size answers it,
    # not the graph mode (which only a finding that saw steps run in pieces calls for)
    assert "cudagraph-mode" not in cands
    pieces = msgspec.structs.replace(ev, findings=[msgspec.structs.replace(
        ev.findings[0], advice_settings=[*ev.findings[0].advice_settings, "cudagraph_mode"])], argv=[])
    assert "cudagraph-mode" in _ids(pieces)[0]


def test_capture_size_in_place_when_it_covers_the_load() -> None:
    ev = ChangeEvidence(findings=[SeenFinding(id="launch_bound", severity="high",
                                              advice_settings=["max_cudagraph_capture_size"])],
                        argv=["vllm", "serve", "m", "--max-cudagraph-capture-size", "512"], load=64, platform="cuda")
    cands, out = _ids(ev)
    assert "capture-size" not in cands and out["capture-size"] == "in_place"


def test_async_scheduling_called_where_it_is_off() -> None:
    ev, argv = _captured("dense-noasync-b1")
    assert "--no-async-scheduling" in argv
    cands, _ = _ids(ev)
    assert cands["async-scheduling"].edit.add == ["--async-scheduling"]
    assert cands["async-scheduling"].edit.remove == ["--no-async-scheduling"]


def test_async_scheduling_in_place_by_the_versions_default() -> None:
    ev, _ = _captured("dense-async-b1")
    cands, _ = _ids(ev)
    assert "async-scheduling" not in cands  # analyze found it on: its advice was not offered
    cands, out = _ids(_with_settings(_argv("dense-async-b1"), knee_cause="step_time", load=4, platform="cuda"))
    assert "async-scheduling" not in cands and out["async-scheduling"] == "in_place"


def test_cudagraph_mode_called_where_decode_runs_in_pieces() -> None:
    argv = ["vllm", "serve", "m", "--compilation-config", '{"cudagraph_mode": "PIECEWISE"}']
    cands, _ = _ids(ChangeEvidence(knee_cause="step_time", argv=argv, load=4, platform="cuda"))
    assert cands["cudagraph-mode"].current == "PIECEWISE"
    assert cands["cudagraph-mode"].edit.set_flags == {
        "--compilation-config.cudagraph_mode": "FULL_AND_PIECEWISE"}
    _, out = _ids(ChangeEvidence(knee_cause="step_time", argv=["vllm", "serve", "m"], load=4, platform="cuda"))
    assert out["cudagraph-mode"] == "in_place"


def test_speculation_called_at_low_load_on_a_host_bound_step() -> None:
    ev, _ = _captured("dense-noasync-b1")  # batch 1, launch-bound
    cands, _ = _ids(ev)
    assert '"ngram"' in cands["spec-ngram"].edit.set_flags["--speculative-config"]
    assert cands["spec-ngram"].risk["quality"].startswith("none")
    ev64, _ = _captured("dense-cap32-b64")
    assert "spec-ngram" not in _ids(ev64)[0]  # batch 64: not a low-batch step
    already = ChangeEvidence(knee_cause="step_time", load=2, argv=["vllm", "serve", "m", "--speculative-config",
                                                                   '{"method": "eagle"}'])
    assert _ids(already)[1]["spec-ngram"] == "in_place"


def test_mtp_only_where_the_model_has_a_head() -> None:
    ev = ChangeEvidence(knee_cause="step_time", load=4, argv=["vllm", "serve", "m"], facts={"model_mtp_layers": 1})
    cands, _ = _ids(ev)
    assert '"mtp"' in cands["spec-mtp"].edit.set_flags["--speculative-config"]
    none = ChangeEvidence(knee_cause="step_time", load=4, argv=["vllm", "serve", "m"], facts={"model_mtp_layers": 0})
    cands, out = _ids(none)
    assert "spec-mtp" not in cands and "spec-mtp" not in out


# --------------------------------------------------------------------------------------- the knee's causes

def test_max_num_seqs_raised_from_the_flag() -> None:
    cands, _ = _ids(ChangeEvidence(knee_cause="scheduler_cap", argv=["vllm", "serve", "m", "--max-num-seqs", "4"],
                                   load=6))
    # twice the flag (8) or twice the load (12), the larger
    assert cands["max-num-seqs"].edit.set_flags == {"--max-num-seqs": "12"}
    # 3x the requests a step: the catalogue's 0.1..0.7 of the 2x more
    assert (cands["max-num-seqs"].gain_low, cands["max-num-seqs"].gain_high) == pytest.approx((0.2, 1.4))


def test_max_num_seqs_from_the_running_cap_and_in_place_at_its_cap() -> None:
    cands, _ = _ids(ChangeEvidence(knee_cause="scheduler_cap", cause_figures={"running_max": 64.0}, load=64))
    assert cands["max-num-seqs"].current == "64"
    assert cands["max-num-seqs"].value == "128"
    _, out = _ids(ChangeEvidence(knee_cause="scheduler_cap", argv=["vllm", "serve", "m", "--max-num-seqs", "1024"]))
    assert out["max-num-seqs"] == "in_place"


def test_max_num_seqs_stays_within_the_kv_caches_room() -> None:
    # the H100 seqs server's second trial (tests/data/tune/h100/tune-seqs.json): 64 running filled 36% of the KV
    # cache at a knee of 128 streams; doubling to 256 outran the cache (-17%). The room: 64 / 0.36 x 0.9 = 160
    doc = json.loads((Path(__file__).parents[1] / "data" / "tune" / "h100" / "tune-seqs.json").read_text())
    [second] = [t for t in doc["trials"] if t["change"]["value"] == "256"]
    assert "64 of 256 streams" in doc["evidence"][-1] and "KV cache at 36%" in doc["evidence"][-1]
    ev = ChangeEvidence(knee_cause="scheduler_cap", argv=["vllm", "serve", "m", "--max-num-seqs", "64"], load=128,
                        cause_figures={"running_max": 64.0, "kv_usage_max": 0.36})
    cands, _ = _ids(ev)
    assert second["outcome"] == "rolled_back" and cands["max-num-seqs"].value == str(round(64 / 0.36 * 0.9))
    # a cache that was full leaves no room: the flag stays (in place), the KV cache's own change speaks
    full = ChangeEvidence(knee_cause="scheduler_cap", argv=["vllm", "serve", "m", "--max-num-seqs", "64"], load=128,
                          cause_figures={"running_max": 64.0, "kv_usage_max": 0.97})
    _, out = _ids(full)
    assert out["max-num-seqs"] == "in_place"
    [why] = [n.detail for n in match_changes(full).ruled_out if n.id == "max-num-seqs"]
    assert "no room above it" in why and f"= {round(64 / 0.97 * 0.9)})" in why


@pytest.mark.parametrize(("missed", "flag", "want", "entry"), [
    ("missed_ttft", "2048", "4096", "max-num-batched-tokens-up"),
    ("missed_itl", "8192", "4096", "max-num-batched-tokens-down"),
])
def test_batched_tokens_move_the_way_the_missed_target_says(missed: str, flag: str, want: str, entry: str) -> None:
    ev = ChangeEvidence(knee_cause="prefill_interference", cause_figures={missed: 1.0},
                        argv=["vllm", "serve", "m", "--max-num-batched-tokens", flag])
    cands, _ = _ids(ev)
    assert cands[entry].edit.set_flags == {"--max-num-batched-tokens": want}
    other = "max-num-batched-tokens-down" if entry.endswith("up") else "max-num-batched-tokens-up"
    assert other not in cands


@pytest.mark.parametrize(("entry", "flag"), [("max-num-batched-tokens-up", "65536"),
                                             ("max-num-batched-tokens-down", "512")])
def test_batched_tokens_in_place_at_their_bounds(entry: str, flag: str) -> None:
    missed = "missed_ttft" if entry.endswith("up") else "missed_itl"
    ev = ChangeEvidence(knee_cause="prefill_interference", cause_figures={missed: 1.0},
                        argv=["vllm", "serve", "m", "--max-num-batched-tokens", flag])
    assert _ids(ev)[1][entry] == "in_place"


def test_kv_cache_bytes_on_the_real_command_line() -> None:
    argv = _argv("dense-async-b1")  # --kv-cache-memory-bytes 8589934592
    cands, out = _ids(_with_settings(argv, knee_cause="kv_cache_full", platform="cuda"))
    assert cands["kv-cache-bytes"].edit.set_flags == {
        "--kv-cache-memory-bytes": str(8589934592 * 3 // 2)}
    assert out["kv-cache-memory"] == "in_place"  # the bytes decide; utilization does not
    assert out["kv-fp8"] == "not_allowed"


def test_kv_cache_memory_raised_and_in_place_at_its_cap() -> None:
    cands, out = _ids(ChangeEvidence(knee_cause="kv_cache_full", platform="cuda",
                                     argv=["vllm", "serve", "m", "--gpu-memory-utilization", "0.85"]))
    assert cands["kv-cache-memory"].edit.set_flags == {"--gpu-memory-utilization": "0.9"}
    assert out["kv-cache-bytes"] == "in_place"
    _, out = _ids(ChangeEvidence(knee_cause="kv_cache_full", platform="cuda",
                                 argv=["vllm", "serve", "m", "--gpu-memory-utilization", "0.95"]))
    assert out["kv-cache-memory"] == "in_place"


def test_kv_cache_on_the_cpu_is_its_environment() -> None:
    cands, out = _ids(ChangeEvidence(knee_cause="kv_cache_full", platform="cpu", argv=["vllm", "serve", "m"],
                                     env={"VLLM_CPU_KVCACHE_SPACE": "1"}))
    assert cands["kv-cache-cpu"].edit.env == {"VLLM_CPU_KVCACHE_SPACE": "2"}
    assert out["kv-cache-memory"] == "platform"
    _, out = _ids(ChangeEvidence(knee_cause="kv_cache_full", platform="cuda", argv=["vllm", "serve", "m"],
                                 env={"VLLM_CPU_KVCACHE_SPACE": "1"}))
    assert out["kv-cache-cpu"] == "platform"


def test_kv_fp8_only_when_allowed_and_not_in_place() -> None:
    ev = ChangeEvidence(knee_cause="kv_cache_full", platform="cuda", argv=["vllm", "serve", "m"])
    assert _ids(ev)[1]["kv-fp8"] == "not_allowed"
    cands, _ = _ids(ev, allow=("kv-fp8",))
    assert cands["kv-fp8"].edit.set_flags == {"--kv-cache-dtype": "fp8"}
    fp8 = ChangeEvidence(knee_cause="kv_cache_full", platform="cuda", argv=["vllm", "serve", "m"],
                         settings={"kv_cache_dtype": SettingEvidence(value="fp8", source="server", detail="x")})
    assert _ids(fp8, allow=("kv-fp8",))[1]["kv-fp8"] == "in_place"


def test_weight_fp8_only_when_allowed() -> None:
    ev = ChangeEvidence(knee_cause="step_time", load=32, platform="cuda", argv=["vllm", "serve", "m"])
    assert _ids(ev)[1]["weight-fp8"] == "not_allowed"
    assert _ids(ev, allow=("weight-fp8",))[0]["weight-fp8"].edit.set_flags == {
        "--quantization": "fp8"}
    quantized = ChangeEvidence(knee_cause="step_time", load=32, platform="cuda",
                               argv=["vllm", "serve", "m", "--quantization", "awq"])
    assert _ids(quantized, allow=("weight-fp8",))[1]["weight-fp8"] == "in_place"


def test_api_server_count_doubled_and_in_place_at_its_cap() -> None:
    cands, _ = _ids(ChangeEvidence(knee_cause="front_end", argv=["vllm", "serve", "m"]))
    assert cands["api-server-count"].edit.set_flags == {"--api-server-count": "2"}
    seen = ChangeEvidence(findings=[SeenFinding(id="front_end_bound", severity="medium")], argv=["vllm", "serve", "m"])
    assert "api-server-count" in _ids(seen)[0]
    _, out = _ids(ChangeEvidence(knee_cause="front_end", argv=["vllm", "serve", "m", "--api-server-count", "8"]))
    assert out["api-server-count"] == "in_place"


def test_prefix_caching_in_place_by_default_called_where_off() -> None:
    ev = ChangeEvidence(knee_cause="prefill_interference", argv=["vllm", "serve", "m", "--no-enable-prefix-caching"])
    assert _ids(ev)[0]["prefix-caching"].edit.add == ["--enable-prefix-caching"]
    real = ChangeEvidence(knee_cause="prefill_interference", argv=_argv("dense-async-b1"))
    assert _ids(real)[1]["prefix-caching"] == "in_place"


# --------------------------------------------------------------------------------------- log lines and inputs

def test_moe_config_named_from_the_log_line() -> None:
    facts = moe_log_facts([MOE_LINE])
    assert facts == {"moe_file": "E=128,N=768,device_name=NVIDIA_H200.json", "moe_shape": "E=128,N=768",
                     "moe_device": "NVIDIA_H200", "moe_dtype": "auto"}
    ev = ChangeEvidence(log_lines=[MOE_LINE], platform="cuda", argv=["vllm", "serve", "/m/qwen3moe"],
                        inputs={"model": "/m/qwen3moe", "tp": "1"})
    matched = match_changes(ev)
    need = next(n for n in matched.ruled_out if n.id == "fused-moe-config")
    assert need.reason == "needs_input"
    assert "benchmarks/kernels/benchmark_moe.py --model /m/qwen3moe --tp-size 1 --dtype auto --tune" in need.detail
    assert "E=128,N=768,device_name=NVIDIA_H200.json" in need.detail
    given = ChangeEvidence(log_lines=[MOE_LINE], platform="cuda", argv=["vllm", "serve", "/m/qwen3moe"],
                           inputs={"moe_config_dir": "/srv/moe"})
    assert _ids(given)[0]["fused-moe-config"].edit.env == {"VLLM_TUNED_CONFIG_FOLDER": "/srv/moe"}
    done = ChangeEvidence(log_lines=[MOE_LINE], platform="cuda", argv=["vllm", "serve", "/m/qwen3moe"],
                          env={"VLLM_TUNED_CONFIG_FOLDER": "/srv/moe"}, inputs={"moe_config_dir": "/srv/moe"})
    assert _ids(done)[1]["fused-moe-config"] == "in_place"


def test_moe_config_not_called_by_a_log_without_the_line() -> None:
    lines = (H100 / "moe-async-b1" / "server-log-lines.txt").read_text().splitlines()
    assert lines and not any("MoE config" in line for line in lines)
    cands, out = _ids(ChangeEvidence(log_lines=lines, platform="cuda", inputs={"moe_config_dir": "/srv/moe"}))
    assert "fused-moe-config" not in cands and "fused-moe-config" not in out


def test_comm_env_from_bench_comm_and_in_place_when_set() -> None:
    finding = SeenFinding(id="communication_bound", severity="high", gains={"": [0.1, 0.3]})
    ev = ChangeEvidence(findings=[finding], platform="cuda", argv=["vllm", "serve", "m"],
                        inputs={"comm_env": "NCCL_PROTO=LL NCCL_ALGO=Ring"})
    cand = _ids(ev)[0]["comm-env"]
    assert cand.edit.env == {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}
    # the finding saves 10..30% of the step: the same tokens 1/0.9 - 1 .. 1/0.7 - 1 faster
    assert (cand.gain_low, cand.gain_high) == pytest.approx((0.1 / 0.9, 0.3 / 0.7))
    set_ = ChangeEvidence(findings=[finding], platform="cuda", argv=["vllm", "serve", "m"],
                          env={"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"},
                          inputs={"comm_env": "NCCL_PROTO=LL NCCL_ALGO=Ring"})
    assert _ids(set_)[1]["comm-env"] == "in_place"
    assert _ids(ChangeEvidence(findings=[finding], platform="cuda"))[1]["comm-env"] == "needs_input"


def test_custom_all_reduce_back_where_disabled() -> None:
    finding = SeenFinding(id="communication_bound", severity="high", advice_settings=["custom_all_reduce"])
    ev = ChangeEvidence(findings=[finding], platform="cuda", argv=["vllm", "serve", "m", "--disable-custom-all-reduce"])
    assert _ids(ev)[0]["custom-all-reduce"].edit.remove == ["--disable-custom-all-reduce"]
    on = ChangeEvidence(findings=[finding], platform="cuda", argv=["vllm", "serve", "m"])
    assert _ids(on)[1]["custom-all-reduce"] == "in_place"


# --------------------------------------------------------------------------------------- the catalogue itself

def test_every_entry_is_tested_both_ways() -> None:
    text = Path(__file__).read_text()
    for cid in load_catalogue():
        assert text.count(f'"{cid}"') >= 2, f"{cid}: no test both ways"


def test_info_findings_and_admission_steps_call_for_nothing() -> None:
    info = ChangeEvidence(findings=[SeenFinding(id="launch_bound", severity="info", advice_settings=["cuda_graphs"])],
                          argv=["vllm", "serve", "m", "--enforce-eager"], platform="cuda")
    assert match_changes(info).candidates == []


def test_a_users_catalogue_adds_entries(tmp_path: Path) -> None:
    extra = tmp_path / "mine.toml"
    extra.write_text('[changes.mine]\nlabel = "x"\nflag = "--x"\nvalue = {rule = "set", to = "1"}\n'
                     'gain = {low = 0.0, high = 0.1, basis = "b"}\nrisk = {memory = "m", start_time = "s", '
                     'quality = "none"}\nundo = "u"\n[[changes.mine.when]]\nknee_cause = "client"\n')
    catalogue = load_catalogue(extra)
    assert "mine" in catalogue and "max-num-seqs" in catalogue
    cands = match_changes(ChangeEvidence(knee_cause="client", argv=["a"]), catalogue=catalogue).candidates
    assert [c.id for c in cands] == ["mine"]
    bad = tmp_path / "bad.toml"
    bad.write_text("[changes.x]\nflag = 1\n")
    with pytest.raises(InputError, match="needs a label"):
        load_catalogue(bad)


def test_next_steps_speak_in_sentences() -> None:
    ev, _ = _captured("dense-eager-b16")
    lines = next_steps(ev)
    assert lines and lines[0].startswith("--enforce-eager removed: CUDA graphs on")


def test_bench_serves_front_end_finding_names_more_api_servers() -> None:
    from servescope.core.document import decode_as
    from servescope.core.next_steps import serve_next_steps
    from servescope.core.serve import ServeResult

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "h200-vllm-bench-2026-12-03" / "bench.json"
    result = decode_as(path.read_bytes(), str(path), ServeResult)
    assert any(f.id == "front_end_bound" for p in result.points for f in p.findings)
    lines = serve_next_steps(result, argv=["vllm", "serve", "m"])
    assert lines and lines[0].startswith("--api-server-count 2: more API front-end processes")
    # at its cap (8 front ends) it is in place, not named again
    assert serve_next_steps(result, argv=["vllm", "serve", "m", "--api-server-count", "8"]) == []


def test_capture_size_called_by_a_knee_above_the_captured_size() -> None:
    argv = ["vllm", "serve", "m", "--max-cudagraph-capture-size", "8"]
    cands, _ = _ids(ChangeEvidence(knee_cause="step_time", load=48, argv=argv, platform="cuda"))
    assert cands["capture-size"].edit.set_flags == {"--max-cudagraph-capture-size": "64"}
    # at vLLM's default (512) a knee of 48 streams is captured already: not called
    cands, out = _ids(ChangeEvidence(knee_cause="step_time", load=48, argv=["vllm", "serve", "m"], platform="cuda"))
    assert "capture-size" not in cands and "capture-size" not in out


def test_the_catalogue_speaks_only_where_its_engine_serves_the_run() -> None:
    """The eager vLLM capture with its server's settings names `--enforce-eager`'s removal; the same analysis
    told it is a training run, or with no engine evidence at all, names no vLLM flag (issue 37: advice knows the
    engine). Training traces get their engine evidence from their ops (tests/trace/test_engine_advice.py)."""
    import msgspec

    from servescope.core.changes import catalogue_engine
    from servescope.core.next_steps import analysis_next_steps

    folder = AB / "dense-eager-b16"
    settings = from_settings_doc(read_document(folder / "settings.json"), str(folder / "settings.json"))
    doc = analyze(AnalyzeRequest(paths=[folder / "rank0.pt.trace.json.gz"], settings=[settings]))
    engine = doc.deployment["engine"]
    assert engine.value == catalogue_engine() == "vllm"
    said = analysis_next_steps(doc, argv=settings.argv)
    assert any("--enforce-eager" in line for line in said), said
    training = msgspec.structs.replace(doc, deployment={**doc.deployment,
                                                        "engine": msgspec.structs.replace(engine, value="training")})
    assert analysis_next_steps(training, argv=settings.argv) == []
    unknown = msgspec.structs.replace(doc, deployment={k: v for k, v in doc.deployment.items() if k != "engine"})
    assert analysis_next_steps(unknown, argv=settings.argv) == []


def test_a_value_left_to_the_engine_is_read_from_its_own_log_line() -> None:
    """The H100 server with vLLM's defaults (tests/data/tune/h100): its knee was bounded by prefill chunks, but its
    command line does not say the chunk budget, so the first tune run had no value to halve (its document:
    ``no_value``). vLLM's own log line says what it runs with; with it the change is a candidate at half of that."""
    data = Path(__file__).resolve().parents[1] / "data" / "tune" / "h100"
    doc = json.loads((data / "tune-defaults.json").read_text())
    assert ("max-num-batched-tokens-down", "no_value") in {(n["id"], n["reason"]) for n in doc["not_tried"]}
    lines = (data / "defaults-log-lines.txt").read_text().splitlines()
    logged = int(re.search(r"max_num_batched_tokens=(\d+)", "\n".join(lines))[1])  # type: ignore[index]
    argv = shlex.split(doc["target"]["original"])
    ev = ChangeEvidence(knee_cause="prefill_interference", cause_figures={"missed_itl": 1.0}, argv=argv,
                        load=doc["baseline"][0]["load"], platform="cuda", log_lines=lines)
    [cand] = [c for c in match_changes(ev).candidates if c.id == "max-num-batched-tokens-down"]
    assert (cand.current, cand.value) == (str(logged), str(logged // 2))
    blind = msgspec.structs.replace(ev, log_lines=[])
    assert "max-num-batched-tokens-down" in {n.id for n in match_changes(blind).ruled_out if n.reason == "no_value"}
    given = msgspec.structs.replace(ev, argv=[*argv, "--max-num-batched-tokens", "2048"])  # the command line wins
    [cand] = [c for c in match_changes(given).candidates if c.id == "max-num-batched-tokens-down"]
    assert (cand.current, cand.value) == ("2048", "1024")


def test_capture_size_covers_the_load_the_knee_search_saw_miss() -> None:
    # H100 (tests/data/tune/h100, third session): capture 8 at a knee of 64 streams; capture 64 moved the knee to 96,
    # whose steps ran eager again. The least load the search saw miss the targets is where the knee can move to.
    argv = ["vllm", "serve", "m", "--max-cudagraph-capture-size", "8"]
    ev = ChangeEvidence(knee_cause="step_time", load=64, cause_figures={"next_load": 96.0}, argv=argv, platform="cuda")
    assert _ids(ev)[0]["capture-size"].edit.set_flags == {"--max-cudagraph-capture-size": "128"}
    # no load seen to miss (the search's limit reached): the knee's own load
    ev = msgspec.structs.replace(ev, cause_figures={})
    assert _ids(ev)[0]["capture-size"].edit.set_flags == {"--max-cudagraph-capture-size": "64"}


def test_capture_size_covers_the_next_probe_where_the_knee_is_a_lower_bound() -> None:
    # H100 (tests/data/tune/h100, sessions 3, 4 and 6): baseline knees of 64+ streams (the search's budget ran out
    # before any load above was measured); capture 64 moved the knee to 96 twice of three, each time one restart
    # more for capture 128. A knee no load above was measured for may lie at the load the search measures next.
    from servescope.bench.serve.knee import knee_of
    from servescope.core.document import decode_as
    from servescope.core.next_steps import knee_figures
    from servescope.core.serve import ServeResult

    path = Path(__file__).resolve().parents[1] / "data" / "knee" / "h100" / "knee-seqs.json"
    raw = json.loads(path.read_text())
    result = decode_as(path.read_bytes(), str(path), ServeResult)
    knee_load = raw["knee"]["load"]
    kept = [p for p in result.points if p.load <= knee_load]  # as a budget that ran out at the knee leaves them
    assert result.search is not None
    cut = msgspec.structs.replace(result, points=kept, knee=knee_of(kept, "streams"),
                                  search=msgspec.structs.replace(result.search, stopped="the time budget ran out"))
    assert cut.knee is not None and cut.knee.next_load is None and knee_load < raw["search"]["max_load"]
    figures = knee_figures(cut)
    assert figures["next_load"] == knee_load * 2  # the search doubles the last load that met the targets
    argv = ["vllm", "serve", "m", "--max-cudagraph-capture-size", "8"]
    ev = ChangeEvidence(knee_cause="step_time", load=knee_load, cause_figures=figures, argv=argv, platform="cuda")
    want = 2 ** math.ceil(math.log2(knee_load * 2))
    assert _ids(ev)[0]["capture-size"].edit.set_flags == {"--max-cudagraph-capture-size": str(want)}
    # the search stopped at its limit: nothing lies above it to cover
    limit = msgspec.structs.replace(cut, search=msgspec.structs.replace(cut.search, max_load=knee_load))
    assert "next_load" not in knee_figures(limit)


def test_a_finding_as_evidence_keeps_the_phase_of_steps_it_is_about() -> None:
    # the phase each finding names in the capture's own analysis (plain json of the stored profile document)
    raw = json.loads((AB / "dense-noasync-b64" / "profile.json").read_text())
    phases = {f["id"]: f.get("phase") for f in raw["findings"]}
    ev, _ = _captured("dense-noasync-b64")
    assert phases["launch_bound"] == "mixed"
    assert {f.id: f.phase for f in ev.findings}["launch_bound"] == phases["launch_bound"]


def test_knee_figures_carry_the_least_load_seen_to_miss_and_only_in_streams() -> None:
    from servescope.core.document import decode_as
    from servescope.core.next_steps import knee_figures
    from servescope.core.serve import ServeResult

    path = Path(__file__).resolve().parents[1] / "data" / "knee" / "h100" / "knee-seqs.json"
    raw = json.loads(path.read_text())
    result = decode_as(path.read_bytes(), str(path), ServeResult)
    figures = knee_figures(result)
    assert raw["knee"]["unit"] == "streams" and figures["next_load"] == raw["knee"]["next_load"]
    assert {k: figures[k] for k in raw["cause"]["evidence"]} == raw["cause"]["evidence"]
    # a knee of requests/s (--rate auto) is not a batch: neither its load nor the next one reads as one
    rate = msgspec.structs.replace(result, knee=msgspec.structs.replace(result.knee, unit="requests/s"))
    assert "next_load" not in knee_figures(rate)


def test_the_profile_sentence_names_each_finding_with_its_phase() -> None:
    from servescope.tune.evidence import profile_sentence

    raw = json.loads((AB / "dense-noasync-b64" / "profile.json").read_text())
    ev, _ = _captured("dense-noasync-b64")
    expected = ", ".join(f"{f['id']} ({f['severity']}, {f['phase']})" if f.get("phase") not in (None, "unknown")
                         else f"{f['id']} ({f['severity']})" for f in raw["findings"])
    assert profile_sentence(64, ev.findings) == f"profiled at 64 requests: {expected}"
    assert profile_sentence(8, []) == "profiled at 8 requests: no findings"
