"""bench.moe_config: the fused-MoE config search's pure parts (the expert shape, vLLM's file name, the candidates,
the pick within a budget). The kernel's timing needs a GPU and vLLM: it ran on the lent H100 (tests/tune/
test_tune_recorded.py reads what it wrote and what vLLM said of it); here a timer stands in for it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tests.plan.test_model import DEEPSEEK_V3, KIMI_K25, QWEN3_235B

from servescope.bench.moe_config import (
    TIMINGS_SUFFIX,
    MoeShape,
    candidates,
    config_file_name,
    kernel_gain,
    moe_shape,
    read_timings,
    search,
    write_configs,
)

LOG = Path(__file__).resolve().parents[1] / "data" / "tune" / "h100" / "moe" / "server-moe-lines.txt"
# Qwen3-30B-A3B's config.json fields, the shape of the MoE model the H100 server ran (gpu-vllm/make_models.py)
QWEN3_30B = {"hidden_size": 2048, "num_experts": 128, "moe_intermediate_size": 768, "num_experts_per_tok": 8}
DEFAULT = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "SPLIT_K": 1,
           "num_warps": 4, "num_stages": 3}


def test_the_file_name_is_the_one_vllm_looked_for_on_the_h100() -> None:
    """vLLM's own warning on the H100 names the file it wanted; the model's config.json and the device's name
    (as torch reports it) give the same one."""
    wanted = re.search(r"Config file not found at \S*/(E=[^/]+\.json)", LOG.read_text())
    assert wanted is not None
    assert config_file_name(moe_shape(QWEN3_30B), "NVIDIA H100 80GB HBM3") == wanted[1]


@pytest.mark.parametrize(("config", "tp", "shape"), [
    (QWEN3_235B, 4, (QWEN3_235B["num_experts"], QWEN3_235B["moe_intermediate_size"] // 4,
                     QWEN3_235B["hidden_size"], QWEN3_235B["num_experts_per_tok"])),
    (DEEPSEEK_V3, 8, (DEEPSEEK_V3["n_routed_experts"], DEEPSEEK_V3["moe_intermediate_size"] // 8,
                      DEEPSEEK_V3["hidden_size"], DEEPSEEK_V3["num_experts_per_tok"])),
    (KIMI_K25, 8, (KIMI_K25["text_config"]["n_routed_experts"], KIMI_K25["text_config"]["moe_intermediate_size"] // 8,
                   KIMI_K25["text_config"]["hidden_size"], KIMI_K25["text_config"]["num_experts_per_tok"])),
])
def test_the_expert_shape_of_real_configs_split_by_tp(config: dict, tp: int, shape: tuple[int, ...]) -> None:
    assert moe_shape(config, tp) == MoeShape(*shape)


def test_a_dense_model_or_an_uneven_split_is_one_clear_error() -> None:
    with pytest.raises(ValueError, match="no mixture of experts"):
        moe_shape({"hidden_size": 4096, "intermediate_size": 14336})
    with pytest.raises(ValueError, match="does not split over 5 ranks"):
        moe_shape(QWEN3_30B, tp=5)


def test_the_h200_family_shares_one_name() -> None:
    assert config_file_name(MoeShape(128, 768, 2048, 8), "NVIDIA H200 NVL").endswith("device_name=NVIDIA_H200.json")


def test_candidates_start_at_the_default_and_only_vary_its_own_keys() -> None:
    seen = list(candidates(DEFAULT, 64))
    assert seen[0] == DEFAULT
    assert len({tuple(sorted(c.items())) for c in seen}) == len(seen)  # each once
    assert all(set(c) == set(DEFAULT) and c["SPLIT_K"] == 1 for c in seen)
    # a tile many times the batch wastes the kernel: none above 4x the tokens (at least 16)
    assert all(c["BLOCK_SIZE_M"] <= 16 for c in candidates(DEFAULT, 2))


def test_the_search_keeps_the_fastest_and_never_one_slower_than_the_default() -> None:
    def timer(batch: int, config: dict[str, int]) -> float | None:
        if config["num_warps"] == 8 and batch == 1:
            return None  # a config the kernel cannot take: skipped
        return 100.0 - config["BLOCK_SIZE_N"] / 8 + (config["num_stages"] - 3) * 5

    found = search((1, 64), lambda m: dict(DEFAULT), timer, budget_s=1e9)
    for m in (1, 64):
        config, took, default = found[m]
        assert took == min(t for c in candidates(DEFAULT, m) if (t := timer(m, c)) is not None)
        assert took <= default == timer(m, DEFAULT)


def test_the_budget_is_shared_among_the_batches() -> None:
    now = [0.0]

    def clock() -> float:
        return now[0]

    def timer(batch: int, config: dict[str, int]) -> float:
        now[0] += 1.0  # each timing takes a second
        return 50.0

    tried: dict[int, int] = {}
    found = search((1, 2, 4, 8), lambda m: dict(DEFAULT), lambda m, c: tried.update({m: tried.get(m, 0) + 1})
                   or timer(m, c), budget_s=20.0, clock=clock)
    assert sorted(found) == [1, 2, 4, 8] and sum(tried.values()) <= 20 + len(tried)
    assert max(tried.values()) - min(tried.values()) <= 2


def test_the_written_file_is_what_vllm_reads(tmp_path: Path) -> None:
    found = {64: (dict(DEFAULT, BLOCK_SIZE_N=64), 10.0, 12.0), 1: (DEFAULT, 5.0, 5.0)}
    path = tmp_path / "cfg" / config_file_name(moe_shape(QWEN3_30B), "NVIDIA H100 80GB HBM3")
    write_configs(path, found)
    body = json.loads(path.read_text())
    assert list(body) == ["1", "64"] and body["64"]["BLOCK_SIZE_N"] == 64  # vLLM keys by int(M)
    # beside it the timings behind it, and no temporary
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name, path.name + TIMINGS_SUFFIX]
    assert read_timings(path) == {1: (5.0, 5.0), 64: (10.0, 12.0)}
    assert kernel_gain(read_timings(path) or {}, 50) == pytest.approx(0.2)  # 64 is nearest 50: 12 / 10 - 1
    assert kernel_gain(read_timings(path) or {}, 8) == 0.0
    assert read_timings(tmp_path / "none.json") is None


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """A missing or dense config, or a Python without vLLM (this one): one line naming what is wrong, exit 2."""
    dense = tmp_path / "dense"
    dense.mkdir()
    (dense / "config.json").write_text(json.dumps({"hidden_size": 4096, "intermediate_size": 14336}))
    for model, said in ((tmp_path / "none", "No such file"), (dense, "no mixture of experts")):
        proc = subprocess.run([sys.executable, "-m", "servescope.bench.moe_config", "--model", str(model), "--out",
                               str(tmp_path / "out")], capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 2 and proc.stdout == ""
        [line] = proc.stderr.splitlines()
        assert said in line and str(model) in line
    assert not (tmp_path / "out").exists()  # nothing written
