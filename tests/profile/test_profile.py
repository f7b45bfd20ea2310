"""`servescope profile`: a real TP=2 capture analyzed, checked against the trace files read by hand."""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from tests.profile.conftest import ProfilingServer, capture_tool, run_cli

from httpd import serving

STEP_RE = re.compile(r"^execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)$")


def _steps_by_hand(path: Path) -> list[tuple[int, int, int, int]]:
    """(prefill requests, prefill tokens, decode requests, decode tokens) of each step annotation."""
    with gzip.open(path, "rb") as f:
        doc = json.load(f)
    return [tuple(int(g) for g in m.groups()) for ev in doc["traceEvents"]  # type: ignore[misc]
            if ev.get("cat") == "user_annotation" and (m := STEP_RE.match(ev.get("name", "")))]


def test_tp2_profile_gives_two_ranks_with_decode_communication(profiling_server: ProfilingServer) -> None:
    # prompts longer than a KV block (vLLM's CPU backend: 128 tokens), so that a prefix cache could serve them
    batch, tokens, prompt = 4, 16, 200
    before = set(profiling_server.trace_dir.rglob("*.pt.trace.json.gz"))
    result = run_cli("profile", profiling_server.url, "--batch", str(batch), "--output-tokens", str(tokens),
                     "--input-tokens", str(prompt), "--trace-dir", str(profiling_server.trace_dir), "--after-runs",
                     "0", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    after = set(profiling_server.trace_dir.rglob("*.pt.trace.json.gz"))
    files = [Path(p) for p in doc["trace_files"]]
    assert set(files) == after - before and all(p.is_file() for p in files)
    assert len(files) == profiling_server.tp + 1
    assert [t["role"] for t in doc["traces"]].count("frontend") == 1
    assert any(".async_llm." in t["path"] for t in doc["traces"] if t["role"] == "frontend")
    assert sorted(r["rank"] for r in doc["ranks"]) == [0, 1]
    comm = {c for c, group in doc["categories"].items() if group == "communication"}
    for rank in doc["ranks"]:
        decode = rank["phases"]["decode"]
        assert sum(decode["categories"][c]["total_us"] for c in comm if c in decode["categories"]) > 0
        by_hand = _steps_by_hand(Path(rank["path"]))
        decode_only = [s for s in by_hand if s[0] == 0 and s[2] > 0]
        assert decode["steps"] == len(decode_only)
        # every prompt token computed (distinct prompts: none served from the prefix cache), every request's
        # first token from its prefill step and the other N-1 from decode work
        assert sum(s[1] for s in by_hand) == batch * prompt
        assert sum(s[3] for s in by_hand) == batch * (tokens - 1)
        # How many steps the B requests took depends on when each reached the engine: both cores run the TP
        # workers here, so a starved front end can pass them on one by one (a CI run saw every step decode one).
        # Between fully overlapped (N - 1 steps, less the steps that mixed a prefill in) and serial (B x (N - 1)).
        assert tokens - 1 - batch <= len(decode_only) <= batch * (tokens - 1)
    usage = doc["profile"]["usage"]
    assert [u["completion_tokens"] for u in usage] == [tokens] * batch
    assert [u["prompt_tokens"] for u in usage] == [prompt] * batch


def test_profile_server_as_a_plain_function(profiling_server: ProfilingServer) -> None:
    """The function the command calls, without the CLI: the capture's files and the analysis of exactly them."""
    from servescope.server.profile import ProfileRequest, profile_server

    batch, tokens = 2, 8
    before = set(profiling_server.trace_dir.rglob("*.pt.trace.json.gz"))
    said: list[str] = []
    result = profile_server(ProfileRequest(url=profiling_server.url, batch=batch, output_tokens=tokens,
                                           trace_dir=profiling_server.trace_dir, after_runs=0), say=said.append)
    new = set(profiling_server.trace_dir.rglob("*.pt.trace.json.gz")) - before
    assert set(result.capture.trace_files) == new and len(new) == profiling_server.tp + 1
    assert sorted(r.rank for r in result.analysis.ranks) == [0, 1]
    assert {Path(t.path) for t in result.analysis.traces} == new
    for rank in result.analysis.ranks:
        by_hand = _steps_by_hand(Path(rank.path))
        assert rank.phases["decode"].steps == len([s for s in by_hand if s[0] == 0 and s[2] > 0])
    record = result.capture.record()
    assert [u["completion_tokens"] for u in record["usage"]] == [tokens] * batch
    assert record["batch"] == batch and record["output_tokens"] == tokens and record["url"] == profiling_server.url


def test_tp2_profile_finds_the_trace_dir_from_the_local_process(profiling_server: ProfilingServer) -> None:
    result = run_cli("profile", profiling_server.url, "--batch", "1", "--output-tokens", "4")
    assert result.returncode == 0, result.stderr
    assert "decode" in result.stdout
    assert f"trace: {profiling_server.trace_dir}" in result.stdout
    # the header names the production step: the median of the three unprofiled runs, each listed
    line = re.search(r"without the profiler: ([\d.]+) ms \(median of 3 runs: ([\d.]+), ([\d.]+), ([\d.]+)\); "
                     r"under the profiler ([\d.]+) ms", result.stdout)
    assert line is not None, result.stdout
    median, *runs = (float(g) for g in line.groups()[:4])
    assert median == sorted(runs)[1] > 0 and float(line[5]) > 0
    # and what the three runs after the window showed, against that median
    after = re.search(r"after the profiled window the server's step was ([\d.]+) ms, ([+-]\d+)% against ([\d.]+) "
                      r"ms before it", result.stdout)
    assert after is not None, result.stdout
    assert float(after[3]) == median and abs(int(after[2]) - (float(after[1]) / median - 1) * 100) <= 1


class _NoProfilingVllm(BaseHTTPRequestHandler):
    """What vLLM 0.32 answers without profiler flags: the /start_profile route is not attached
    (vllm/entrypoints/serve/profile/api_router.py attach_router), so FastAPI's default 404 body. The
    OpenAI routes the command needs first (/v1/models, a streamed /v1/completions) answer in their shape."""

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/v1/models":
            self._send(200, b'{"object":"list","data":[{"id":"tiny-llama","object":"model","max_model_len":256}]}')
        else:
            self._send(404, b'{"detail":"Not Found"}')

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("content-length") or 0))
        if self.path != "/v1/completions":
            self._send(404, b'{"detail":"Not Found"}')
            return
        chunk = {"id": "cmpl-0", "object": "text_completion", "model": "tiny-llama",
                 "choices": [{"index": 0, "text": " a", "finish_reason": "length"}],
                 "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}}
        body = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture
def no_profiling_server() -> Iterator[str]:
    with serving(_NoProfilingVllm, capture_tool.HOST) as url:
        yield url


def test_server_without_profiling_names_the_flags(no_profiling_server: str, tmp_path: Path) -> None:
    result = run_cli("profile", no_profiling_server, "--batch", "1", "--output-tokens", "4",
                     "--trace-dir", str(tmp_path))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert f"{no_profiling_server}/start_profile" in lines[0] and "404" in lines[0]
    assert "--profiler-config.profiler=torch --profiler-config.torch_profiler_dir=DIR" in lines[0]
    assert "VLLM_TORCH_PROFILER_DIR" in lines[0]


def test_unreachable_url_is_one_line_exit_2(tmp_path: Path) -> None:
    url = f"http://{capture_tool.HOST}:{capture_tool.free_port()}"
    result = run_cli("profile", url, "--batch", "1", "--output-tokens", "4", "--trace-dir", str(tmp_path))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and url in lines[0] and "refused" in lines[0]


def test_missing_trace_dir_and_bad_batch_are_one_line_exit_2(tmp_path: Path) -> None:
    url = f"http://{capture_tool.HOST}:{capture_tool.free_port()}"
    missing = tmp_path / "nope"
    result = run_cli("profile", url, "--trace-dir", str(missing))  # local: waited for, but the port comes first
    assert result.returncode == 2 and "refused" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    result = run_cli("profile", url, "--batch", "0", "--trace-dir", str(tmp_path))
    assert result.returncode == 2 and "--batch" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    remote = run_cli("profile", "http://192.0.2.1:8000", "--trace-dir", str(missing))
    # a remote server's directory cannot be waited for; whether the port (a documentation-only address) refuses
    # or times out first depends on the network the test runs in: either way one line, exit 2
    assert remote.returncode == 2 and len(remote.stderr.strip().splitlines()) == 1
    assert any(word in remote.stderr for word in ("not on this machine", "refused", "unreachable", "timed out"))


def _itl_sum_count(url: str) -> tuple[float, float]:
    """vLLM's inter-token latency histogram (_sum, _count) from /metrics, read with a plain regex."""
    import urllib.request

    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    sums = [float(m.group(1)) for m in re.finditer(r"^vllm:inter_token_latency_seconds_sum\{.*\} (\S+)$", text, re.M)]
    counts = [float(m.group(1)) for m in re.finditer(r"^vllm:inter_token_latency_seconds_count\{.*\} (\S+)$", text,
                                                     re.M)]
    return sum(sums), sum(counts)


def test_profile_measures_the_same_batch_without_the_profiler(profiling_server: ProfilingServer) -> None:
    """The unprofiled runs and the profiled batch, each timed by the server's own histogram: with no warm-up, they
    are the only requests, of equal size, so their means average to the mean over all, read by hand; the median
    run is the production step."""
    batch, tokens, runs, after = 2, 12, 3, 2
    s0, c0 = _itl_sum_count(profiling_server.url)
    result = run_cli("profile", profiling_server.url, "--batch", str(batch), "--output-tokens", str(tokens),
                     "--trace-dir", str(profiling_server.trace_dir), "--no-warmup", "--unprofiled-runs", str(runs),
                     "--after-runs", str(after), "--json")
    assert result.returncode == 0, result.stderr
    s1, c1 = _itl_sum_count(profiling_server.url)
    record = json.loads(result.stdout)["profile"]
    unprofiled, profiled, each = record["unprofiled_server"], record["profiled_server"], record["unprofiled_runs"]
    assert len(each) == runs and len(record["after_profile_runs"]) == after
    assert unprofiled["itl_metric"] == profiled["itl_metric"] == "vllm:inter_token_latency_seconds"
    assert c1 - c0 == (runs + 1 + after) * batch * (tokens - 1)  # each batch: B requests × (N - 1) gaps
    by_hand_ms = (s1 - s0) / (c1 - c0) * 1000
    every = [*each, record["profiled_server"], *record["after_profile_runs"]]
    assert sum(r["itl_ms"] for r in every) / len(every) == pytest.approx(by_hand_ms, rel=1e-3)
    assert record["after_profile_server"]["itl_ms"] == sorted(r["itl_ms"] for r in record["after_profile_runs"])[0]
    assert unprofiled["itl_ms"] == sorted(r["itl_ms"] for r in each)[1] and profiled["itl_ms"] > 0
    doc = json.loads(result.stdout)
    assert doc["unprofiled"]["runs_us"] == pytest.approx([r["itl_ms"] * 1000 for r in each], abs=0.1)
    # the analysis takes that step as its reference, and the live process's flags as its deployment
    doc = json.loads(result.stdout)
    assert doc["unprofiled"]["step_us"] == pytest.approx(unprofiled["itl_ms"] * 1000, rel=1e-3)
    tp = doc["deployment"]["tensor_parallel_size"]
    assert tp["source"] == "server" and tp["value"] == str(profiling_server.tp)
    assert "--tensor-parallel-size" in tp["detail"] and "/proc/" in tp["detail"]
    assert doc["deployment"]["async_scheduling"]["source"] in ("server", "default")


def test_profile_times_other_batches_without_the_profiler(profiling_server: ProfilingServer) -> None:
    """`--unprofiled-batches`: the same runs at each other batch, every one of them counted by the server's own
    histogram (read by hand); each batch's median run becomes its step in the analysis' reference."""
    batch, tokens, runs, others = 2, 10, 3, (1, 3)
    s0, c0 = _itl_sum_count(profiling_server.url)
    result = run_cli("profile", profiling_server.url, "--batch", str(batch), "--output-tokens", str(tokens),
                     "--trace-dir", str(profiling_server.trace_dir), "--no-warmup", "--unprofiled-runs", str(runs),
                     "--unprofiled-batches", "3,1,2", "--after-runs", "0", "--json")
    assert result.returncode == 0, result.stderr
    s1, c1 = _itl_sum_count(profiling_server.url)
    doc = json.loads(result.stdout)
    timed = doc["profile"]["unprofiled_batches"]
    assert [t["batch"] for t in timed] == list(others)  # its own batch (2) is not timed twice
    # every request of every run and of the profiled batch: B × (N - 1) gaps each
    assert c1 - c0 == (runs * (batch + sum(others)) + batch) * (tokens - 1)
    sums = [r["itl_ms"] * b * (tokens - 1) for b, rs in [(batch, doc["profile"]["unprofiled_runs"]),
                                                          *((t["batch"], t["runs"]) for t in timed)] for r in rs]
    profiled = doc["profile"]["profiled_server"]["itl_ms"] * batch * (tokens - 1)
    assert (sum(sums) + profiled) / 1000 == pytest.approx(s1 - s0, rel=1e-3)
    reference = doc["unprofiled"]["other_batches"]
    assert [r["batch"] for r in reference] == list(others)
    for ref, t in zip(reference, timed, strict=True):
        assert len(t["runs"]) == runs and ref["step_us"] == pytest.approx(
            sorted(r["itl_ms"] for r in t["runs"])[1] * 1000, rel=1e-3)
    bad = run_cli("profile", profiling_server.url, "--trace-dir", str(profiling_server.trace_dir),
                  "--unprofiled-batches", "1,x")
    assert bad.returncode == 2 and "--unprofiled-batches" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_a_server_profiled_before_is_named_in_the_header_and_the_reference(profiling_server: ProfilingServer) -> None:
    """The second profile of one server finds the first one's rank traces in its profiler directory, written since
    the process started (its /proc start time): the header says so, and the analysis' unprofiled reference carries
    it into `plan --calibrate`'s host note."""
    args = ("profile", profiling_server.url, "--batch", "1", "--output-tokens", "4", "--unprofiled-runs", "1",
            "--after-runs", "0", "--trace-dir", str(profiling_server.trace_dir))
    assert run_cli(*args).returncode == 0
    out = profiling_server.trace_dir.parent / "profiled-before.json"
    text = run_cli(*args, "-o", str(out))
    assert text.returncode == 0, text.stderr
    assert "this server was profiled before this run" in text.stdout and "restart it" in text.stdout
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert "this server was profiled before this run" in doc["profile"]["profiled_before"]
    assert doc["unprofiled"]["source"].endswith(doc["profile"]["profiled_before"])
