#!/usr/bin/env python3
"""plan --calibrate on the real vLLM 0.26 H200 captures made with distinct prompts per request (issue 24): each
pair calibrated at one batch and predicting the other (16 -> 1, 1 -> 16).

  .venv/bin/python benchmarks/plan_calibrate_pairs.py [SET ...]   # a markdown table per set (docs/measurements.md)

Each capture is analyzed and written as `servescope profile --json` writes it (the analysis and its ``profile``
section: model, batch, tokens, ``"prompts": "distinct"``, from provenance.json); the planner gets the model's shape
from provenance.json, with ``quantization_config: {quant_method: fp8}`` where the server ran ``--quantization
fp8`` (its server_flags: weights one byte, per-tensor scales), and the context in the middle of the profiled window.
Truth by plain gzip + json: the capture's decode step annotations (``execute_context_0(0)_generation_B(B)``,
``gpu_user_annotation``) for the step, the kernels inside them for the device's work, the rest for the host's.
"""

from __future__ import annotations

import gzip
import json
import re
import sys
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

from servescope.core.analysis import StepReference
from servescope.core.document import read_document
from servescope.core.files import hardware_profile_names
from servescope.core.settings import SettingsDoc
from servescope.plan.hardware import load_hardware
from servescope.plan.planner import PlanRequest, run_plan
from servescope.report.profile import encode_profile
from servescope.server.timing import ServerTiming, median_run, step_reference
from servescope.trace.analyze import AnalyzeRequest, analyze
from servescope.trace.rules.deployment import from_settings_doc

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "h200-vllm"
H100 = "../h100-vllm"  # the H100 captures' folders, relative to DATA
# The capture sets: 2026-12-04's (window from engine step 20, admission still settling) and 2026-12-05's steady
# windows (engine steps 64..75, every request decoding since long before), two windows each for dense and MoE.
SETS = {
    "2026-12-04": [("dense", "async", "ab/dense-async"), ("dense", "noasync", "ab/dense-noasync"),
                   ("moe", "async", "ab/moe-async"), ("moe", "noasync", "ab/moe-noasync"),
                   ("dense", "fp8", "dense-fp8"), ("moe", "fp8", "moe-fp8")],
    "steady/w1": [(k, f, f"steady/w1/{k}-{f}") for k in ("dense", "moe") for f in ("async", "noasync", "fp8")],
    "steady/w2": [(k, f, f"steady/w2/{k}-{f}") for k in ("dense", "moe") for f in ("async", "noasync")],
    # 2026-12-05, session 3: the same servers, python stacks off, each capture with five unprofiled runs
    "steady/w3": [(k, f, f"steady/w3/{k}-{f}") for k in ("dense", "moe") for f in ("async", "noasync")],
    # 2026-12-05, session 4, on a lent H100 (tests/data/h100-vllm): bf16 and fp8, async on and off, five runs each
    "h100/w4": [(k, f, f"{H100}/steady/w4/{k}-{f}") for k in ("dense", "moe")
                for f in ("async", "noasync", "fp8-async", "fp8-noasync")],
    # 2026-12-05, session 5, a lent H100: the same, each capture also timing batches 1..32 without the profiler
    # (`profile --unprofiled-batches 1,2,4,8,16,32`)
    "h100/w5": [(k, f, f"{H100}/steady/w5/{k}-{f}") for k in ("dense", "moe")
                for f in ("async", "noasync", "fp8-async", "fp8-noasync")],
}
# 2026-12-05, session 5 (a lent H100): w5 profiled each server at 16 requests first, w6 (new servers, the same flags)
# at 1 first. A vLLM server stays slower after its first profile, so the clean step of a batch is the first capture's
# on its server: 16 -> 1 calibrates on w5's batch-16 capture and checks w6's batch-1 runs, 1 -> 16 the other way.
CLEAN = {"16→1": ("w5", 16, "w6", 1), "1→16": ("w6", 1, "w5", 16)}
CLEAN_KINDS = [(k, f) for k in ("dense", "moe") for f in ("async", "noasync", "fp8-async", "fp8-noasync")]
BATCHES = (1, 16)
# The same model's steady window at a long context (plan word `long-context`: 3,000-token distinct prompts, no async
# scheduling, stacks off), beside the steady capture that calibrates it (77 tokens a request in its window).
LONG = {"dense": (f"{H100}/steady/w4/dense-noasync", f"{H100}/long/dense-long"),
        "moe": (f"{H100}/steady/w4/moe-noasync", f"{H100}/long/moe-long")}
# The KV-reading attention kernel, the plan's attention part: FA3's forward on the H200 (its split combine and the
# KV-cache write are small calls of "other")
ATTENTION_KERNEL = re.compile(r"FlashAttnFwdSm90")
# One server alone (MoE, no async scheduling, python stacks on), its steady window captured three times at each
# batch within two minutes (plan word `repeat-moe`): how far the truth itself moves between windows.
REPEATS = {"steady/repeat": ("steady/repeat/moe-noasync", 3)}
# One server per model, async scheduling on, its steady window at each batch (plan word `sweep-async`, the H100)
SWEEPS = {"h100/sweep": ((f"{H100}/sweep/dense-async", f"{H100}/sweep/moe-async"), (1, 2, 4, 8, 16, 32))}


def hardware(prov: dict[str, Any]) -> str:
    """The bundled hardware profile whose ``match`` names the card the capture ran on (provenance.json's
    ``device``, nvidia-smi's name)."""
    return _profile_for(str(prov["device"]))


@cache
def _profile_for(device: str) -> str:
    found = [name for name in hardware_profile_names()
             if any(m and m.lower() in device.lower() for m in load_hardware(name).match)]
    if len(found) != 1:
        raise SystemExit(f"the capture's card {device!r} matches {len(found)} hardware profiles, not one")
    return found[0]


def provenance(folder: str) -> dict[str, Any]:
    prov: dict[str, Any] = json.loads((DATA / folder / "provenance.json").read_text(encoding="utf-8"))
    return prov


@cache
def window(folder: str, batch: int) -> dict[str, float]:
    """The capture's decode steps of ``batch`` requests by plain json, ms a step: the annotations' span
    (``step``), the kernel time inside them (``device``) and the rest (``host``, the device idle in the step); read
    once a run (callers do not change it)."""
    with gzip.open(DATA / folder / "rank0.pt.trace.json.gz", "rt", encoding="utf-8") as fh:
        events = json.load(fh)["traceEvents"]
    name = f"execute_context_0(0)_generation_{batch}({batch})"
    steps = [e for e in events if e.get("cat") == "gpu_user_annotation" and e.get("name") == name]
    kernels = [(float(k["ts"]), float(k["ts"]) + float(k["dur"])) for k in events if k.get("cat") == "kernel"]
    span = busy = 0.0
    for s in steps:
        a, b = float(s["ts"]), float(s["ts"]) + float(s["dur"])
        span += b - a
        busy += sum(min(end, b) - max(start, a) for start, end in kernels if start < b and end > a)
    n = len(steps) * 1e3
    return {"step": span / n, "device": busy / n, "host": (span - busy) / n}


@cache
def attention_ms(folder: str, batch: int) -> float:
    """The KV-reading attention kernels' time a decode step of ``batch`` requests, ms, by plain json (by name)."""
    with gzip.open(DATA / folder / "rank0.pt.trace.json.gz", "rt", encoding="utf-8") as fh:
        events = json.load(fh)["traceEvents"]
    name = f"execute_context_0(0)_generation_{batch}({batch})"
    steps = [(float(s["ts"]), float(s["ts"]) + float(s["dur"])) for s in events
             if s.get("cat") == "gpu_user_annotation" and s.get("name") == name]
    total = sum(float(k["dur"]) for k in events if k.get("cat") == "kernel" and ATTENTION_KERNEL.search(k["name"])
                and any(a <= float(k["ts"]) < b for a, b in steps))
    return total / len(steps) / 1e3


def long_context(out: Path) -> list[dict[str, Any]]:
    """Per model and batch: the plan calibrated on the steady window (77 tokens a request) for the long window's
    batch and context; its attention part and device part against the long window's own (``truth``)."""
    missing = [f"{long}-b{b}" for _, long in LONG.values() for b in BATCHES if not (DATA / f"{long}-b{b}").is_dir()]
    if missing:
        raise SystemExit(f"no long-context capture in {DATA}: {', '.join(missing)} (the device session's plan word "
                         "long-context makes them)")
    rows = []
    for kind, (short, long) in LONG.items():
        for batch in BATCHES:
            fit, check = f"{short}-b{batch}", f"{long}-b{batch}"
            doc = predict(fit, check, out)
            parts = doc.layouts[0].points[0].parts_ms
            truth = window(check, batch)
            device = doc.layouts[0].points[0].step_ms - window(fit, batch)["host"]
            rows.append({"kind": kind, "batch": batch, "context": context_tokens(provenance(check)),
                         "attention": parts["attention"], "attention_truth": attention_ms(check, batch),
                         "attention_fit": attention_ms(fit, batch), "device": device,
                         "device_truth": truth["device"]})
    return rows


def long_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| model, batch | context | attention at 77 tokens (ms) | attention predicted / measured | error | "
             "device predicted / measured | error |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['kind']} b{r['batch']} | {r['context']} | {r['attention_fit']:.3f} | "
                     f"{r['attention']:.3f} / {r['attention_truth']:.3f} | "
                     f"{r['attention'] / r['attention_truth'] - 1:+.1%} | "
                     f"{r['device']:.2f} / {r['device_truth']:.2f} | "
                     f"{r['device'] / r['device_truth'] - 1:+.1%} |".replace("-", "−"))
    return "\n".join(lines)


def config(folder: str, out: Path) -> Path:
    """The model's config.json for the planner: provenance's shape, quantized as the server ran it."""
    prov = provenance(folder)
    shape = dict(prov["model_shape"])
    flags = prov.get("server_flags", [])
    if "--quantization" in flags and flags[flags.index("--quantization") + 1] == "fp8":
        shape["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    path = out / f"{prov['model']}{'-fp8' if 'quantization_config' in shape else ''}" / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(shape), encoding="utf-8")
    return path


def context_tokens(prov: dict[str, Any]) -> int:
    """Tokens each request holds in the middle of the profiled window: its prompt plus the engine steps before the
    window's middle (``window``: "engine steps A..B ..."); without a window, half the output."""
    found = re.search(r"engine steps (\d+)\.\.(\d+)", prov.get("window", ""))
    done = (int(found[1]) + int(found[2])) // 2 if found else prov["output_tokens"] // 2
    return int(prov["input_tokens"]) + done


def unprofiled_ms(folder: str) -> float:
    """The server's own step without the profiler, ms: ``vllm:inter_token_latency_seconds`` over the same batch
    run just before the capture (provenance.json ``unprofiled_server``), the truth of a production prediction."""
    return float(provenance(folder)["unprofiled_server"]["itl_ms"])


def pooled_doc(folders: list[str], out: Path) -> Path:
    """The first window's capture as `servescope profile` writes it with ``--unprofiled-runs N``, N = the windows:
    the windows' unprofiled steps taken as its runs (each window's own run, minutes apart rather than back to back),
    their median as its production step."""
    first = folders[0]
    timings = [ServerTiming(**provenance(f)["unprofiled_server"]) for f in folders]
    path = out / (first.replace("/", "_") + f".pooled{len(folders)}.profile.json")
    path.write_bytes(_profile_bytes(first, True, step_reference(median_run(timings), timings)))
    return path


def ladder_doc(stem: str, fit: int, timed: tuple[int, ...], out: Path) -> Path:
    """The capture ``{stem}-b{fit}`` as `servescope profile --unprofiled-batches` writes it with the batches
    ``timed``: each one's unprofiled runs taken from the same server's capture at that batch (minutes apart rather
    than back to back)."""
    def runs(batch: int) -> list[ServerTiming]:
        return [ServerTiming(**run) for run in provenance(f"{stem}-b{batch}").get("unprofiled_runs", [])]

    own = runs(fit)
    reference = step_reference(median_run(own), own, {b: runs(b) for b in timed if b != fit})
    path = out / (f"{stem}-b{fit}".replace("/", "_") + "-timed-" + "_".join(map(str, timed)) + ".profile.json")
    path.write_bytes(_profile_bytes(f"{stem}-b{fit}", True, reference))
    return path


def timed_steps(folder: str) -> dict[int, float]:
    """The capture's own step without the profiler at each batch it timed (``--unprofiled-batches``; its own batch
    too), ms: provenance.json's medians."""
    prov = provenance(folder)
    steps = {int(t["batch"]): float(t["itl_ms"]) for t in prov.get("unprofiled_batches", [])}
    return {**steps, int(prov["batch"]): float(prov["unprofiled_server"]["itl_ms"])}


def own_timed_doc(folder: str, timed: tuple[int, ...], out: Path) -> Path:
    """The capture as `profile --unprofiled-batches` wrote it, keeping only the batches ``timed`` (none: as a capture
    of its own batch alone)."""
    prov = provenance(folder)
    own = [ServerTiming(**run) for run in prov["unprofiled_runs"]]
    by_batch = {int(t["batch"]): [ServerTiming(**run) for run in t["runs"]]
                for t in prov.get("unprofiled_batches", []) if int(t["batch"]) in timed}
    path = out / (folder.replace("/", "_") + "-own-" + "_".join(map(str, timed)) + ".profile.json")
    path.write_bytes(_profile_bytes(folder, True, step_reference(median_run(own), own, by_batch)))
    return path


def same_state(pairs: list[tuple[str, str, str]]) -> list[dict[str, Any]]:
    """Per capture and per other batch it timed: the step predicted there from the capture alone, and from the
    capture with its other timed batches but that one (left out), each against the capture's own timed step at
    that batch (the same server in the same state: every run of a capture precedes its profiled window)."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind, flavour, stem in pairs:
            for b in BATCHES:
                folder = f"{stem}-b{b}"
                steps = timed_steps(folder)
                flags = provenance(folder).get("server_flags", [])
                alone = own_timed_doc(folder, (), Path(tmp))  # the capture's own batch only: one document
                for check, truth in sorted(steps.items()):
                    if check == b:
                        continue
                    left = own_timed_doc(folder, tuple(x for x in steps if x not in (b, check)), Path(tmp))
                    got = {name: predict_at(folder, doc, check, Path(tmp)) for name, doc in
                           (("alone", alone), ("timed", left))}
                    rows.append({"kind": kind, "flavour": flavour, "capture": folder, "batch": b, "check": check,
                                 "serial": "--no-async-scheduling" in flags, "truth": truth,
                                 **{f"{k}_error": v / truth - 1 for k, v in got.items()}})
    return rows


def predict_at(folder: str, document: Path, batch: int, out: Path) -> float:
    """The plan calibrated on ``document`` (a profile document of capture ``folder``) at ``batch`` requests and the
    capture's own context, ms a step."""
    prov = provenance(folder)
    doc = run_plan(PlanRequest(model=str(config(folder, out)), hardware=hardware(prov), gpus=1, batches=(batch,),
                               context=context_tokens(prov), calibrate=str(document)))
    return float(doc.layouts[0].points[0].step_ms)


def clean_pairs() -> list[dict[str, Any]]:
    """Per configuration and direction (``CLEAN``): the step predicted at the other batch from the first capture of
    one server, alone and with the batches it timed, against the other server's first capture's own runs."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind, flavour in CLEAN_KINDS:
            for direction, (fit_set, fit, check_set, check) in CLEAN.items():
                folder = f"{H100}/steady/{fit_set}/{kind}-{flavour}-b{fit}"
                truth = unprofiled_ms(f"{H100}/steady/{check_set}/{kind}-{flavour}-b{check}")
                timed = tuple(b for b in timed_steps(folder) if b != fit)
                got = {name: predict_at(folder, own_timed_doc(folder, batches, Path(tmp)), check, Path(tmp))
                       for name, batches in (("alone", ()), ("timed", timed))}
                rows.append({"kind": kind, "flavour": flavour, "direction": direction, "truth": truth,
                             "predicted": got,
                             "serial": "noasync" in flavour,
                             **{f"{k}_error": v / truth - 1 for k, v in got.items()}})
    return rows


def _markdown(head: list[str], rows: list[list[str]], *, fp8: bool = False) -> str:
    """A Markdown table of ``head`` and ``rows``, each row's hyphens typeset as minus signs (``fp8``: but the
    one of ``fp8-``, a name)."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        line = ("| " + " | ".join(row) + " |").replace("-", "−")
        lines.append(line.replace("fp8−", "fp8 ") if fp8 else line)
    return "\n".join(lines)


def clean_table(rows: list[dict[str, Any]]) -> str:
    head = ["configuration", "scheduling", "direction", "other server's step (ms)", "alone (ms)", "error",
            "with the timed batches (ms)", "error"]
    return _markdown(head, [[f"{r['kind']} {r['flavour']}", "serial" if r["serial"] else "async", r["direction"],
                             f"{r['truth']:.2f}", f"{r['predicted']['alone']:.2f}", f"{r['alone_error']:+.1%}",
                             f"{r['predicted']['timed']:.2f}", f"{r['timed_error']:+.1%}"] for r in rows], fp8=True)


def same_state_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| capture | scheduling | " + " | ".join(f"→{b}" for b in (1, 2, 4, 8, 16, 32)) + " |",
             "|---|---|" + "---|" * 6]
    for capture in dict.fromkeys(r["capture"] for r in rows):
        mine = {r["check"]: r for r in rows if r["capture"] == capture}
        cells = [f"{mine[b]['alone_error']:+.0%} / {mine[b]['timed_error']:+.0%}" if b in mine else ""
                 for b in (1, 2, 4, 8, 16, 32)]
        serial = next(iter(mine.values()))["serial"]
        lines.append(f"| {capture.rsplit('/', 1)[-1]} | {'serial' if serial else 'async'} | " + " | ".join(cells)
                     + " |")
    return "\n".join(lines[:2] + [line.replace("-", "−") for line in lines[2:]])


def profile_doc(folder: str, out: Path, *, production: bool = False) -> Path:
    """The capture as `servescope profile --json` writes it, beside nothing (the device is checked from the trace);
    with ``production``, as `profile` writes it with the live server's settings (the folder's settings.json:
    async scheduling) and the same batch timed without the profiler (provenance.json ``unprofiled_server``)."""
    path = out / (folder.replace("/", "_") + (".production" if production else "") + ".profile.json")
    path.write_bytes(_profile_bytes(folder, production))
    return path


@cache
def _profile_bytes(folder: str, production: bool, reference: StepReference | None = None) -> bytes:
    """The profile document of :func:`profile_doc` (with ``reference``, that unprofiled step instead of the
    folder's), analyzed once a run."""
    prov = provenance(folder)
    trace = DATA / folder / "rank0.pt.trace.json.gz"
    request = AnalyzeRequest(paths=[trace])
    if production:
        settings = DATA / folder / "settings.json"
        doc = read_document(settings)
        assert isinstance(doc, SettingsDoc), settings
        if reference is None:
            timing = prov["unprofiled_server"]
            runs = [ServerTiming(**run) for run in prov.get("unprofiled_runs", [])]  # captures since 2026-12-05 (3)
            reference = step_reference(ServerTiming(**timing), runs)
        request = AnalyzeRequest(paths=[trace], settings=[from_settings_doc(doc, str(settings))], reference=reference)
    return encode_profile(analyze(request), [trace], capture={
        "model": prov["model"], "batch": prov["batch"], "input_tokens": prov["input_tokens"],
        "output_tokens": prov["output_tokens"], "prompts": "distinct"})


def predict(fit: str, check: str, out: Path, *, production: bool = False, document: Path | None = None) -> Any:
    """The plan calibrated on capture ``fit`` (or on ``document``, a profile document of it) for the batch and
    context of capture ``check`` (the same model)."""
    target = provenance(check)
    calibrate = document or profile_doc(fit, out, production=production)
    return run_plan(PlanRequest(model=str(config(check, out)), hardware=hardware(target), gpus=1,
                                batches=(target["batch"],), context=context_tokens(target), calibrate=str(calibrate)))


def pooled(stem: str, count: int) -> dict[tuple[int, int], dict[str, Any]]:
    """The repeated windows of one server as one capture with ``count`` unprofiled runs (:func:`pooled_doc`), per
    direction: the production step predicted, the checked batch's runs and their median (the truth), and the error
    against the median and against each single run."""
    runs = {b: [unprofiled_ms(f"{stem}-r{r}-b{b}") for r in range(1, count + 1)] for b in BATCHES}
    found = {}
    with tempfile.TemporaryDirectory() as tmp:
        for fit, check in ((16, 1), (1, 16)):
            folders = [f"{stem}-r{r}-b{fit}" for r in range(1, count + 1)]
            doc = pooled_doc(folders, Path(tmp))
            predicted = predict(folders[0], f"{stem}-r1-b{check}", Path(tmp), document=doc).layouts[0].points[0].step_ms
            median = sorted(runs[check])[(count - 1) // 2]
            found[(fit, check)] = {"predicted_ms": predicted, "runs": runs[check], "median": median,
                                   "error": predicted / median - 1,
                                   "run_errors": [predicted / r - 1 for r in runs[check]]}
    return found


def pair(stem: str, out: Path) -> dict[tuple[int, int], dict[str, Any]]:
    """Per direction (fit, check): the plan calibrated on ``stem``-b``fit`` for the batch of ``stem``-b``check``
    (``doc``, ``predicted_ms``), both windows' truth (``fit``, ``check``), the error of the step and of the device's
    work (the predicted step less the fitted window's host time, which the planner carries), and how far the host's
    time moved between the windows (``host_moved_ms``)."""
    folders = {b: f"{stem}-b{b}" for b in BATCHES}
    for b, f in folders.items():
        assert provenance(f)["batch"] == b, f
    truth = {b: window(f, b) for b, f in folders.items()}
    cases = {}
    for fit, check in ((16, 1), (1, 16)):
        doc = predict(folders[fit], folders[check], out)
        predicted = doc.layouts[0].points[0].step_ms
        cases[(fit, check)] = {"doc": doc, "predicted_ms": predicted, "fit": truth[fit], "check": truth[check],
                               "error": predicted / truth[check]["step"] - 1,
                               "device_error": (predicted - truth[fit]["host"]) / truth[check]["device"] - 1,
                               "host_moved_ms": truth[check]["host"] - truth[fit]["host"]}
    return cases


def measure(pairs: list[tuple[str, str, str]]) -> list[dict[str, Any]]:
    """One row per (kind, flavour): both windows' truth and, per direction, the error of the step and of the
    device's work."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind, flavour, stem in pairs:
            cases = pair(stem, Path(tmp))
            rows.append({"kind": kind, "flavour": flavour, "truth": {1: cases[(16, 1)]["check"],
                                                                      16: cases[(1, 16)]["check"]},
                         "error": {d: c["error"] for d, c in cases.items()},
                         "device": {d: c["device_error"] for d, c in cases.items()}})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    head = ["capture pair", "step b1 / b16 (ms)", "device b1 / b16", "host b1 / b16", "step 16→1", "step 1→16",
            "device 16→1", "device 1→16"]
    return _markdown(head, [[f"{r['kind']} {r['flavour']}",
                             *(f"{r['truth'][1][k]:.2f} / {r['truth'][16][k]:.2f}" for k in ("step", "device", "host")),
                             *(f"{r[k][d]:+.1%}" for k in ("error", "device") for d in ((16, 1), (1, 16)))]
                            for r in rows])


def production(pairs: list[tuple[str, str, str]]) -> list[dict[str, Any]]:
    """One row per (kind, flavour): each window's step without the profiler and device work, the scheduling its
    server ran, and per direction the production step predicted (calibrated with the server's settings and its own
    unprofiled step, as `servescope profile` writes the document) against the other window's unprofiled step."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind, flavour, stem in pairs:
            folders = {b: f"{stem}-b{b}" for b in BATCHES}
            truth = {b: unprofiled_ms(f) for b, f in folders.items()}
            predicted = {(fit, check): predict(folders[fit], folders[check], Path(tmp), production=True)
                         .layouts[0].points[0].step_ms for fit, check in ((16, 1), (1, 16))}
            flags = provenance(folders[1]).get("server_flags", [])
            scheduling = "serial" if "--no-async-scheduling" in flags else "async"
            rows.append({"kind": kind, "flavour": flavour, "scheduling": scheduling, "truth": truth,
                         "device": {b: window(f, b)["device"] for b, f in folders.items()},
                         "predicted": predicted,
                         "error": {d: p / truth[d[1]] - 1 for d, p in predicted.items()}})
    return rows


def production_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| capture pair | scheduling | unprofiled step b1 / b16 (ms) | device b1 / b16 | predicted 16→1 / 1→16 | "
             "16→1 | 1→16 |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        t, d, p, e = r["truth"], r["device"], r["predicted"], r["error"]
        lines.append(f"| {r['kind']} {r['flavour']} | {r['scheduling']} | {t[1]:.2f} / {t[16]:.2f} | "
                     f"{d[1]:.2f} / {d[16]:.2f} | {p[(16, 1)]:.2f} / {p[(1, 16)]:.2f} | {e[(16, 1)]:+.1%} | "
                     f"{e[(1, 16)]:+.1%} |")
    return "\n".join(lines[:2] + [line.replace("-", "−") for line in lines[2:]])


def runs_table(pairs: list[tuple[str, str, str]]) -> str:
    """Each capture's unprofiled runs (the server's own step, ms, in the order run) and how far apart they lay: how
    closely one capture knows its production step."""
    lines = ["| capture | runs (ms) | median | range / median |", "|---|---|---|---|"]
    for _, _, stem in pairs:
        for b in BATCHES:
            runs = [float(r["itl_ms"]) for r in provenance(f"{stem}-b{b}").get("unprofiled_runs", [])]
            if len(runs) < 2:
                continue
            median = sorted(runs)[(len(runs) - 1) // 2]
            lines.append(f"| {stem.rsplit('/', 1)[-1]}-b{b} | {', '.join(f'{r:.2f}' for r in runs)} | {median:.2f} | "
                         f"{(max(runs) - min(runs)) / median:.0%} |")
    return "\n".join(lines)


def sweep_table(stems: tuple[str, ...], batches: tuple[int, ...]) -> str:
    """Per server: its median run at each batch, then the production step calibrated at each batch and predicted at
    every other, as the error against that batch's median run (rows: the calibrating batch)."""
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for stem in stems:
            truth = {b: unprofiled_ms(f"{stem}-b{b}") for b in batches}
            device = [window(f"{stem}-b{b}", b)["device"] for b in batches]
            head = f"| {stem.rsplit('/', 1)[-1]} (device {min(device):.2f}–{max(device):.2f} ms) | "
            lines = [head + " | ".join(str(b) for b in batches) + " |", "|---" * (len(batches) + 1) + "|",
                     "| step (median run, ms) | " + " | ".join(f"{truth[b]:.2f}" for b in batches) + " |"]
            for fit in batches:
                cells = []
                for check in batches:
                    doc = None if check == fit else predict(f"{stem}-b{fit}", f"{stem}-b{check}", Path(tmp),
                                                            production=True)
                    cells.append("" if doc is None else f"{doc.layouts[0].points[0].step_ms / truth[check] - 1:+.0%}")
                lines.append(f"| from {fit} | " + " | ".join(cells) + " |")
            out.append("\n".join(line.replace("-", "−") if line.startswith("| from") else line for line in lines))
    return "\n\n".join(out)


def ladder_table(stems: tuple[str, ...], batches: tuple[int, ...]) -> str:
    """Per server: calibrated at each batch with the server's own steps at every other batch but the checked one
    (`profile --unprofiled-batches`, the checked batch left out), the step predicted at the checked batch against its
    median run: how well the timed batches stand for a batch between or beside them."""
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for stem in stems:
            truth = {b: unprofiled_ms(f"{stem}-b{b}") for b in batches}
            lines = [f"| {stem.rsplit('/', 1)[-1]}, timed at the others | " + " | ".join(str(b) for b in batches)
                     + " |", "|---" * (len(batches) + 1) + "|",
                     "| step (median run, ms) | " + " | ".join(f"{truth[b]:.2f}" for b in batches) + " |"]
            for fit in batches:
                cells = []
                for check in batches:
                    if check == fit:
                        cells.append("")
                        continue
                    doc = ladder_doc(stem, fit, tuple(b for b in batches if b != check), Path(tmp))
                    step = predict(f"{stem}-b{fit}", f"{stem}-b{check}", Path(tmp), document=doc)
                    cells.append(f"{step.layouts[0].points[0].step_ms / truth[check] - 1:+.0%}")
                lines.append(f"| from {fit} | " + " | ".join(cells) + " |")
            out.append("\n".join(line.replace("-", "−") if line.startswith("| from") else line for line in lines))
    return "\n\n".join(out)


def repeats(stem: str, count: int) -> dict[str, Any]:
    """The repeated windows of one server: per batch, each window's truth (``truth``); per direction (fit, check),
    the step predicted from each fitted window (``predicted``) and its error against each checked window
    (``errors``, count x count), and the same for the device's work (``device_errors``: the prediction less the
    fitted window's host time)."""
    folders = {(r, b): f"{stem}-r{r}-b{b}" for r in range(1, count + 1) for b in BATCHES}
    truth = {b: [window(folders[(r, b)], b) for r in range(1, count + 1)] for b in BATCHES}
    study: dict[str, Any] = {"truth": truth, "predicted": {}, "errors": {}, "device_errors": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for fit, check in ((16, 1), (1, 16)):
            predicted = [predict(folders[(r, fit)], folders[(1, check)], Path(tmp)).layouts[0].points[0].step_ms
                         for r in range(1, count + 1)]
            study["predicted"][(fit, check)] = predicted
            study["errors"][(fit, check)] = [[p / t["step"] - 1 for t in truth[check]] for p in predicted]
            study["device_errors"][(fit, check)] = [
                [(p - f["host"]) / t["device"] - 1 for t in truth[check]]
                for p, f in zip(predicted, truth[fit], strict=True)]
    return study


def repeat_table(study: dict[str, Any]) -> str:
    """Each window's step, device and host time per batch; then each direction's predictions against the
    checked windows' range."""
    lines = ["| window | step b1 / b16 (ms) | device b1 / b16 | host b1 / b16 |", "|---|---|---|---|"]
    t = study["truth"]
    for r, (one, sixteen) in enumerate(zip(t[1], t[16], strict=True), start=1):
        lines.append(f"| r{r} | {one['step']:.2f} / {sixteen['step']:.2f} | {one['device']:.2f} / "
                     f"{sixteen['device']:.2f} | {one['host']:.2f} / {sixteen['host']:.2f} |")
    lines += ["", "| direction | predicted (ms), from r1 / r2 / r3 | checked windows (ms) | step errors, min .. max | "
              "device errors, min .. max |", "|---|---|---|---|---|"]
    for (fit, check), predicted in study["predicted"].items():
        errors = [e for row in study["errors"][(fit, check)] for e in row]
        device = [e for row in study["device_errors"][(fit, check)] for e in row]
        steps = sorted(w["step"] for w in t[check])
        lines.append(f"| {fit}→{check} | {' / '.join(f'{p:.2f}' for p in predicted)} | "
                     f"{' .. '.join(f'{x:.2f}' for x in (steps[0], steps[-1]))} | "
                     f"{min(errors):+.1%} .. {max(errors):+.1%} | {min(device):+.1%} .. {max(device):+.1%} |"
                     .replace("-", "−"))
    return "\n".join(lines)


if __name__ == "__main__":
    chosen = sys.argv[1:] or [*SETS, *REPEATS]
    for name in chosen:
        if name.startswith("runs:"):
            sys.stdout.write(f"\n{name}\n\n{runs_table(SETS[name[5:]])}\n")
        elif name == "long":
            with tempfile.TemporaryDirectory() as tmp:
                sys.stdout.write(f"\nlong context\n\n{long_table(long_context(Path(tmp)))}\n")
        elif name == "clean":
            sys.stdout.write(f"\nclean\n\n{clean_table(clean_pairs())}\n")
        elif name.startswith("state:") and name[6:] in SETS:
            sys.stdout.write(f"\n{name}\n\n{same_state_table(same_state(SETS[name[6:]]))}\n")
        elif name.startswith("timed:") and name[6:] in SWEEPS:
            sys.stdout.write(f"\n{name}\n\n{ladder_table(*SWEEPS[name[6:]])}\n")
        elif name in SWEEPS:
            sys.stdout.write(f"\n{name}\n\n{sweep_table(*SWEEPS[name])}\n")
        elif name in REPEATS:
            sys.stdout.write(f"\n{name}\n\n{repeat_table(repeats(*REPEATS[name]))}\n")
        elif name in SETS:
            sys.stdout.write(f"\n{name}\n\n{table(measure(SETS[name]))}\n")
        elif name.startswith("production:") and name.removeprefix("production:") in SETS:
            sys.stdout.write(f"\n{name}\n\n{production_table(production(SETS[name.removeprefix('production:')]))}\n")
        else:
            raise SystemExit(f"unknown capture set {name!r}: one of {', '.join([*SETS, *REPEATS, *SWEEPS])}")
