"""`tune --launch` on three real vLLM 0.26 servers on an H100, each started with one weak setting (issue 36, item 5;
tests/data/tune/h100, README.md there). The test knows each server's weak setting without servescope (the command
line tools/gpu_vllm/tune_session.sh gave it) and reads the documents with plain ``json.load``: tune must have kept
the change that undoes the weak setting, every decision must follow from the measured knees and the noise as
docs/tune.md defines them, and the anchor (`vllm bench serve` on the server tune left running) must have run the
kept configuration at the final knee's load."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from servescope.core.document import decode_as
from servescope.core.tune import TuneDoc
from servescope.report.rerender import render_document

DATA = Path(__file__).resolve().parents[1] / "data" / "tune" / "h100"
# the weak setting each server started with, and the flag whose change must be kept
WEAK = {"seqs": ("--max-num-seqs", "16"), "async": ("--no-async-scheduling", None),
        "kv": ("--kv-cache-memory-bytes", "536870912")}


def _raw(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / f"tune-{name}.json").read_text())
    return data


def _value(words: list[str], flag: str) -> str | None:
    return words[words.index(flag) + 1] if flag in words else None


@pytest.mark.parametrize("name", sorted(WEAK))
def test_the_weak_setting_is_undone_and_kept(name: str) -> None:
    doc = _raw(name)
    flag, weak = WEAK[name]
    original, kept = shlex.split(doc["target"]["original"]), shlex.split(doc["keep"]["command_line"])
    if weak is None:  # a switch: the original has it, the kept line has its opposite
        assert flag in original and flag not in kept and "--async-scheduling" in kept
    else:
        assert _value(original, flag) == weak and _value(kept, flag) not in (None, weak)
    assert doc["keep"]["changes"] and doc["final"]["goodput_tokens_per_s"] > max(
        b["goodput_tokens_per_s"] for b in doc["baseline"])


@pytest.mark.parametrize("name", sorted(WEAK))
def test_every_decision_follows_from_the_knees_and_the_noise(name: str) -> None:
    doc = _raw(name)
    first, second = (b["goodput_tokens_per_s"] for b in doc["baseline"])
    mean = (first + second) / 2
    noise = max(abs(first - second) / mean, doc["options"]["min_noise"])
    assert doc["noise"] == pytest.approx(noise)
    reference = mean
    for trial in doc["trials"]:
        got = trial["knee"]["goodput_tokens_per_s"]
        assert trial["reference_tokens_per_s"] == pytest.approx(reference)
        assert trial["measured_gain"] == pytest.approx(got / reference - 1)
        low, high = trial["change"]["gain_low"], trial["change"]["gain_high"]
        assert trial["within_prediction"] == (low <= got / reference - 1 <= high)
        assert trial["outcome"] == ("kept" if got > reference * (1 + noise) else "rolled_back")
        if trial["outcome"] == "kept":
            reference = got
    assert doc["final"]["goodput_tokens_per_s"] == pytest.approx(reference)


@pytest.mark.parametrize("name", sorted(WEAK))
def test_the_anchor_ran_on_the_server_left_running_at_the_final_knee(name: str) -> None:
    doc = _raw(name)
    load = int(doc["final"]["load"])
    anchor: dict[str, Any] = json.loads((DATA / "anchors" / f"vbench-tune-{name}-c{load}.json").read_text())
    assert anchor["max_concurrency"] == load and anchor["completed"] == anchor["num_prompts"] == 4 * load
    pid = doc["target"]["left_running"]
    assert pid
    # the server the anchor measured is the kept configuration: vLLM's own log line of the process left running
    # (server-args.txt: each start's "non-default args") holds the kept value
    [line] = [x for x in (DATA / "server-args.txt").read_text().splitlines()
              if x.startswith(f"tune-{name} ") and f"(APIServer pid={pid})" in x]
    kept = shlex.split(doc["keep"]["command_line"])
    expected = {"seqs": f"'max_num_seqs': {_value(kept, '--max-num-seqs')}",
                "async": "'async_scheduling': True",
                "kv": f"'kv_cache_memory_bytes': {_value(kept, '--kv-cache-memory-bytes')}"}[name]
    assert expected in line


@pytest.mark.parametrize("name", sorted(WEAK))
def test_the_documents_read_and_render(name: str) -> None:
    doc = decode_as((DATA / f"tune-{name}.json").read_bytes(), name, TuneDoc)
    text = render_document(doc, "text", width=100)
    assert "keep:" in text and "left running: process" in text
