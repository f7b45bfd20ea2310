"""Every collective figure says where it came from and which path it assumed, in plan's text and HTML (issue 24
item 6), not only in the JSON.

The expected rows are read from the ``--json`` document with plain ``json`` (each point's
``collectives_per_step.OP.paths``); the text must carry, for each, the path in a few words and the origin with
the figure's source, whole at 80, 100 and 120 columns; the HTML the same and the full source and rule.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from servescope.cli import app
from servescope.plan.collectives import CommCosts, bundled_curves
from servescope.plan.factors import default_factors
from servescope.plan.hardware import load_hardware
from servescope.plan.paths import allreduce_path

KiB = 1024
CASES = {
    "readme": ["plan", "--model", "kimi-k2.5", "--hardware", "rtx-pro-6000", "--gpus", "8", "--batch", "1,8,32"],
    "unit-env": ["plan", "--model", "kimi-k2.5", "--hardware", "rtx-pro-6000", "--gpus", "8", "--batch", "1,8",
                 "--env", "NCCL_PROTO=LL", "--env", "NCCL_ALGO=Ring"],
    "nvlink": ["plan", "--model", "llama-3-70b", "--hardware", "h100-sxm", "--gpus", "4", "--batch", "1,64"],
}


@pytest.mark.parametrize(("hardware", "group", "nbytes", "label"), [
    # csrc/custom_all_reduce.cuh: one-shot below 512 KiB at <= 4 GPUs; custom_all_reduce.py max_size 8 MiB
    ("h100-sxm", 4, 16 * KiB, "custom all-reduce one-shot: NVLink, below 512 KiB"),
    ("h100-sxm", 4, 1024 * KiB, "custom all-reduce two-shot: NVLink, below 8 MiB"),
    # all_reduce_utils.py: 256 KiB with symmetric memory at 8 GPUs on sm_90; symm_mem.py: multimem up to 64 MiB
    ("h100-sxm", 8, 256 * KiB, "torch symmetric memory multimem: NVLink multicast, up to 64 MiB"),
    ("rtx-pro-6000", 8, 14 * KiB, "NCCL (custom: not on > 2 PCIe-only GPUs)"),
    ("rtx4090", 2, 14 * KiB, "NCCL (custom: no GPU P2P)"),
])
def test_path_label(hardware: str, group: int, nbytes: int, label: str) -> None:
    assert allreduce_path(nbytes, group, load_hardware(hardware), {}).label == label


def test_the_nccl_path_names_the_units_knobs() -> None:
    hw = load_hardware("rtx-pro-6000")
    comm = CommCosts(hw, default_factors(), bundled_curves(hw), env={"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"})
    assert comm.price("all_reduce", 8, 14 * KiB).path == ("NCCL (custom: not on > 2 PCIe-only GPUs), NCCL_ALGO=Ring, "
                                                           "NCCL_PROTO=LL")
    assert comm.price("all_gather", 8, 14 * KiB).path == "NCCL, NCCL_ALGO=Ring, NCCL_PROTO=LL"


def _run(args: list[str], width: int) -> str:
    result = CliRunner().invoke(app, args, env={"COLUMNS": str(width)}, terminal_width=width)
    assert result.exit_code == 0, result.output
    return result.stdout


def _rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every priced collective of the document: (op, group, path, origin, source, wait), by plain json."""
    out = {}
    for layout in doc["layouts"]:
        for p in layout["points"]:
            for op, entry in p["collectives_per_step"].items():
                for path in entry["paths"]:
                    key = (op, path["group"], path["path"], path["origin"], path["source"], path["wait_us_each"])
                    out[key] = path | {"op": op}
    return list(out.values())


def _short(source: str) -> str:
    head = source.split(" (")[0].split(": ")[0].split(", ")[0]
    return head.rsplit("/", 1)[-1] if " " not in head and "/" in head else head


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("width", [80, 100, 120])
def test_each_collective_says_its_path_and_source_in_the_text(case: str, width: int) -> None:
    args = CASES[case]
    doc = json.loads(_run([*args, "--json"], 200))
    text = _run(args, width)
    assert max(len(line) for line in text.splitlines()) <= width
    lines = text.splitlines()
    start = lines.index("collectives: the path each takes and where its figure comes from:")
    block = []
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break
        block.append(line)
    prose = " ".join(" ".join(block).split())
    rows = _rows(doc)
    assert rows
    for row in rows:
        wait = f" + {row['wait_us_each']:.1f} µs wait (assumed)" if row["wait_us_each"] else ""
        said = f"{row['path']}; {row['origin']}: {_short(row['source'])}{wait}"
        assert " ".join(said.split()) in prose, said
        assert f"{row['op']} over {row['group']}," in prose


def test_nvlink_names_the_custom_all_reduce_and_the_in_situ_trace() -> None:
    text = " ".join(_run(CASES["nvlink"], 100).split())
    assert ("all_reduce over 4, 16 KiB: custom all-reduce one-shot: NVLink, below 512 KiB; in-situ: "
            "vllm_llama80L_tp4_h100_1p9d_rank0.pt.trace.json.gz") in text


def test_the_html_carries_each_collectives_path_origin_and_sources(tmp_path: Path) -> None:
    import html as htmllib
    page = tmp_path / "plan.html"
    out = tmp_path / "plan.json"
    _run([*CASES["unit-env"], "--html", str(page), "-o", str(out)], 100)
    body = htmllib.unescape(page.read_text(encoding="utf-8"))
    assert "Collectives: the path each takes and where its figure comes from" in body
    for row in _rows(json.loads(out.read_text(encoding="utf-8"))):
        for key in ("path", "origin", "source"):
            assert f"<td>{row[key]}</td>" in body, (key, row[key])
        assert row["why"] in body  # the rule, with this message's size
