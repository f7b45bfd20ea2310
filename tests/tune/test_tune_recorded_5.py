"""The fifth H100 session (tests/data/tune/h100, README.md there): the MoE server, vLLM's defaults and async
scheduling off, each run of `tune --launch` read with plain ``json.load`` and checked against what it ran on: vLLM's
own log lines, the search's own timings, `vllm bench serve` on the server tune left running."""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

import pytest

from tune.test_tune_recorded import DATA, _decisions_follow


def _raw(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / f"tune-{name}-5.json").read_text())
    return data


def _anchor(name: str, load: int) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / "anchors" / f"vbench-tune-{name}-5-c{load}.json").read_text())
    return data


def test_vllms_defaults_try_the_chunk_budget_vllm_logs_and_keep_the_original() -> None:
    """The defaults server: its knee's cause is prefill chunks stalling the streams, and the budget tune halves is
    the one vLLM logs for its defaults (8192 tokens: its own "Chunked prefill is enabled" line); the shorter chunks
    lost tokens/s, so the original stays, and vLLM's bench at the final knee ran on that original server."""
    doc = _raw("defaults")
    _decisions_follow(doc, "tokens_per_s")
    [trial] = doc["trials"]
    logged = re.search(r"max_num_batched_tokens=(\d+)", (DATA / "defaults-log-lines.txt").read_text())
    assert logged is not None
    assert trial["change"]["current"] == logged[1]
    assert trial["change"]["edit"]["set_flags"] == {"--max-num-batched-tokens": str(int(logged[1]) // 2)}
    assert trial["outcome"] == "rolled_back" and trial["knee"]["tokens_per_s"] < doc["baseline"][1]["tokens_per_s"]
    assert doc["keep"]["changes"] == [] and doc["keep"]["command_line"] == doc["target"]["original"]
    load = int(doc["final"]["load"])
    anchor = _anchor("defaults", load)
    assert anchor["max_concurrency"] == load and anchor["completed"] == anchor["num_prompts"] == 4 * load


def test_async_scheduling_is_kept_and_vllms_bench_sees_the_gain() -> None:
    """Async scheduling off: tune keeps it on (the decisions follow from the tokens/s and the noise), and vLLM's own
    bench at the final knee on the server left running delivers more than the original's knee did."""
    doc = _raw("async")
    mean, noise, reference = _decisions_follow(doc, "tokens_per_s")
    original, kept = shlex.split(doc["target"]["original"]), shlex.split(doc["keep"]["command_line"])
    assert "--no-async-scheduling" in original
    assert "--async-scheduling" in kept and "--no-async-scheduling" not in kept
    assert reference > mean * (1 + noise)
    anchor = _anchor("async", int(doc["final"]["load"]))
    assert anchor["completed"] == anchor["num_prompts"] and anchor["output_throughput"] > mean * (1 + noise)


def test_the_moe_servers_cold_first_search_made_every_change_look_like_noise() -> None:
    """Why a search now warms the server with a burst first: on the fresh MoE server the first search met the
    targets only up to a few streams, the second (on the server the first had warmed) up to 128; the two made a
    noise of over 100%, within which neither the tuned config (its own search timed it ~1% faster than vLLM's
    default at the knee's batch) nor a second API process could be told from the noise, so nothing was tried."""
    doc = _raw("moe")
    first, second = doc["baseline"]
    assert first["load"] <= 4 and second["load"] >= 64
    a, b = first["tokens_per_s"], second["tokens_per_s"]
    noise = abs(a - b) / ((a + b) / 2)
    assert doc["noise"] == pytest.approx(noise) and noise > 1
    assert doc["trials"] == [] and {n["id"]: n["reason"] for n in doc["not_tried"]} == {
        "api-server-count": "below_noise", "fused-moe-config": "below_noise"}
    timed = {int(m[1]): float(m[3]) / float(m[2]) - 1 for m in re.finditer(
        r"M=(\d+): ([\d.]+) us \(default ([\d.]+) us", (DATA / "moe-5" / "moe-search.txt").read_text())}
    at_knee = timed[min(timed, key=lambda m: abs(m - second["load"]))]
    [config] = [n for n in doc["not_tried"] if n["id"] == "fused-moe-config"]
    assert f"+0%..{at_knee:+.0%}" in config["detail"] and at_knee < 0.02


def test_the_moe_ab_servers_log_says_it_read_the_searched_config() -> None:
    """The A/B server (tune left the default config running; the A/B started one with the searched folder): vLLM's
    own line says it read the file the search wrote, under the name vLLM looks for on this GPU."""
    [file] = (DATA / "moe-5").glob("E=*[0-9].json")
    [line] = (DATA / "moe-5" / "server-moe-ab-lines.txt").read_text().splitlines()
    assert line.endswith(f"Using configuration from /tmp/tune/moe-configs/{file.name} for MoE layer.")
    assert "device_name=NVIDIA_H100_80GB_HBM3" in file.name
    tuned = json.loads((DATA / "anchors" / "vbench-moe-5-ab-tuned-c128.json").read_text())
    assert tuned["max_concurrency"] == int(_raw("moe")["final"]["load"]) and tuned["completed"] == 512

