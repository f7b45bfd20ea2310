"""The taxonomy names real work: little time left as "other", known kernels in their families, overrides."""

from __future__ import annotations

import string
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servescope.core.categories import CATEGORY_OTHER
from servescope.core.errors import InputError
from servescope.trace.classify.taxonomy import Taxonomy, load_taxonomy
from servescope.trace.classify.work import select_work
from servescope.trace.read.table import KIND_NAMES
from servescope.trace.read.trace_json import decode_trace
from tracefiles import all_shared_traces, load_events

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
# The API server's own trace: Python functions only, no operator or kernel runs in that process.
NO_WORK = {"tp2_b4_16tok_frontend.async_llm.pt.trace.json.gz", "frontend.async_llm.pt.trace.json.gz"}
EXAMPLE_TRACES = sorted((Path(__file__).resolve().parents[2] / "src/servescope/data/examples").glob("*/*.json.gz"))
MAX_OTHER_SHARE = 0.05


@pytest.fixture(scope="module")
def taxonomy() -> Taxonomy:
    return load_taxonomy()


def _work_time_by_name(path: Path) -> Counter[tuple[str, str]]:
    """Work time in µs per (kind, name): device events by plain json.load, else CPU operators' self time."""
    by_name: Counter[tuple[str, str]] = Counter()
    for event in load_events(path):
        if event.get("ph") == "X" and event.get("cat") in DEVICE_CATS:
            by_name[(event["cat"], event["name"])] += float(event.get("dur", 0.0))
    if by_name:
        return by_name
    data = decode_trace(path)
    work = select_work(data)
    assert work.kind == "cpu_op"
    table = work.table
    for row, dur_us in zip(work.rows, work.dur_us, strict=True):
        by_name[(KIND_NAMES[table.kind[row]], data.names[table.name[row]])] += float(dur_us)
    return by_name


@pytest.mark.parametrize("path", all_shared_traces() + EXAMPLE_TRACES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_other_is_under_5_percent_of_work_time(path: Path, taxonomy: Taxonomy) -> None:
    by_name = _work_time_by_name(path)
    total = sum(by_name.values())
    if path.name in NO_WORK:
        assert total == 0 and not by_name
        assert not any(e.get("cat") in (*DEVICE_CATS, "cpu_op") for e in load_events(path))
        return
    assert total > 0
    other = Counter({
        name: dur for (kind, name), dur in by_name.items() if taxonomy.classify(name, kind) == CATEGORY_OTHER
    })
    share = sum(other.values()) / total
    top = "; ".join(f"{dur / total:.2%} {name[:120]}" for name, dur in other.most_common(10))
    assert share < MAX_OTHER_SHARE, f"{share:.2%} of work time is 'other': {top}"


KNOWN_NAMES = Path(__file__).with_name("known_names.txt")


def _known_names() -> list[tuple[str, str, str]]:
    """(name as a trace spells it, event kind, category) of each line of ``known_names.txt``: the kind, the category,
    then the name to the end of the line (a note after two spaces and ``# `` aside)."""
    cases = []
    for line in KNOWN_NAMES.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            kind, category, rest = line.split(maxsplit=2)
            cases.append((rest.split("  # ")[0].rstrip(), kind, category))
    return cases


KNOWN = _known_names()


@pytest.mark.parametrize(("name", "kind", "category"), KNOWN, ids=lambda v: str(v)[:70])
def test_known_names_land_in_their_family(taxonomy: Taxonomy, name: str, kind: str, category: str) -> None:
    assert taxonomy.classify(name, kind) == category


def test_custom_all_reduce_is_communication(taxonomy: Taxonomy) -> None:
    # HTA's known miss: vLLM's custom all-reduce counted as compute.
    for stage in ("1stage", "2stage"):
        category = taxonomy.classify(f"void vllm::cross_device_reduce_{stage}<float, 4>(...)", "kernel")
        assert taxonomy.is_communication(category)
    assert not taxonomy.is_communication("gemm")
    assert not taxonomy.is_communication("no-such-category")


def test_copies_and_sets_are_memory_whatever_their_name(taxonomy: Taxonomy) -> None:
    assert taxonomy.classify("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "gpu_memcpy") == "memcpy"
    assert taxonomy.classify("anything at all", "gpu_memset") == "memset"
    assert taxonomy.categories["memcpy"] == taxonomy.categories["memset"] == "memory"


def test_unknown_kind_is_refused(taxonomy: Taxonomy) -> None:
    with pytest.raises(ValueError, match="kernel, gpu_memcpy, gpu_memset, cpu_op"):
        taxonomy.classify("aten::mm", "python_function")


def test_categories_and_builtin_rules_are_well_formed(taxonomy: Taxonomy) -> None:
    assert taxonomy.source == "builtin"
    assert set(taxonomy.categories.values()) <= {"communication", "compute", "memory", "other"}
    required = {
        "communication": ["comm.all_reduce", "comm.all_gather", "comm.reduce_scatter", "comm.all_to_all",
                          "comm.send_recv", "comm.other"],
        "compute": ["attention", "gemm", "moe", "elementwise", "norm", "rotary", "activation", "sampling"],
        "memory": ["memcpy", "memset"],
        "other": ["other"],
    }
    for group, names in required.items():
        for name in names:
            assert taxonomy.categories.get(name) == group, name
    assert list(taxonomy.categories)[-1] == CATEGORY_OTHER
    assert taxonomy.rules
    for rule in taxonomy.rules:
        assert rule.category in taxonomy.categories, rule
        assert rule.note.strip(), rule
        assert rule.kinds and rule.kinds <= {"kernel", "cpu_op"}
        assert rule.patterns


def _first_matching_rule(taxonomy: Taxonomy, name: str, kind: str) -> str:
    """The slow route: each rule's whole regex, in order."""
    if kind in ("gpu_memcpy", "gpu_memset"):
        return {"gpu_memcpy": "memcpy", "gpu_memset": "memset"}[kind]
    for rule in taxonomy.rules:
        if kind in rule.kinds and rule.pattern.search(name):
            return rule.category
    return CATEGORY_OTHER


@pytest.mark.needs_shared
def test_fast_matching_agrees_with_whole_regexes_on_real_names(taxonomy: Taxonomy) -> None:
    names = {(kind, name) for name, kind, _ in KNOWN}
    for path in all_shared_traces():
        data = decode_trace(path)
        for table in (data.device, data.cpu_ops):
            names.update((KIND_NAMES[k], data.names[n]) for k, n in zip(table.kind, table.name, strict=True))
    assert len(names) > 300
    for kind, name in sorted(names):
        assert taxonomy.classify(name, kind) == _first_matching_rule(taxonomy, name, kind), name


def _fragments() -> list[str]:
    tax = load_taxonomy()
    plain = {p for rule in tax.rules for p in rule.patterns if p.replace("_", "").replace(":", "").isalnum()}
    return sorted(plain) + ["::", "_", "<", ">", " ", "void ", "aten::", "_C::", "K", "İ", "ß"]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    parts=st.lists(st.one_of(st.sampled_from(_fragments()), st.text(string.ascii_letters + "_:", max_size=4)),
                   max_size=6),
    upper=st.booleans(),
    kind=st.sampled_from(["kernel", "cpu_op"]),
)
def test_fast_matching_agrees_with_whole_regexes_on_made_up_names(parts: list[str], upper: bool,
                                                                  kind: str) -> None:
    tax = load_taxonomy()
    name = "".join(parts)
    name = name.upper() if upper else name
    assert tax.classify(name, kind) == _first_matching_rule(tax, name, kind)


USER_FILE = """
version = 1

[categories]
"sgemm_fp32" = "compute"

[[rule]]
category = "sgemm_fp32"
regex = '^ampere_sgemm_'
note = "fp32 SIMT GEMMs, kept apart from tensor-core ones"

[[rule]]
category = "comm.other"
regex = ['CROSS_DEVICE_REDUCE']
ignore_case = true

[[rule]]
category = "elementwise"
regex = ['^_C::onednn_mm$']
kinds = ["kernel"]
"""


def test_user_rules_win_and_may_add_categories(tmp_path: Path, taxonomy: Taxonomy) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(USER_FILE, encoding="utf-8")
    mine = load_taxonomy(path)
    assert mine.source == str(path)
    assert taxonomy.classify("ampere_sgemm_128x128_tn", "kernel") == "gemm"
    assert mine.classify("ampere_sgemm_128x128_tn", "kernel") == "sgemm_fp32"
    assert mine.categories["sgemm_fp32"] == "compute"
    assert list(mine.categories)[-1] == CATEGORY_OTHER
    assert list(mine.categories)[: len(taxonomy.categories) - 1] == list(taxonomy.categories)[:-1]
    # ignore_case, and a user rule beating a bundled one for a communication kernel
    assert mine.classify("void vllm::cross_device_reduce_2stage<float, 4>(...)", "kernel") == "comm.other"
    # kinds: the rule is for kernels only, so the CPU operator keeps its bundled category
    assert mine.classify("_C::onednn_mm", "cpu_op") == "gemm"
    assert mine.classify("_C::onednn_mm", "kernel") == "elementwise"
    # everything else as bundled
    assert mine.classify("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x4_tn", "kernel") == "gemm"
    assert mine.classify("_C::shm_allreduce", "cpu_op") == "comm.all_reduce"
    assert load_taxonomy().classify("ampere_sgemm_128x128_tn", "kernel") == "gemm"


RULE = '[[rule]]\ncategory = "gemm"\nregex = "x"\n'
BAD_FILES = {
    "bad_toml": ("[[rule]\ncategory = ", "bad TOML"),
    "unknown_top_field": ('colour = "blue"\n', "unknown field 'colour'"),
    "unknown_rule_field": (RULE + "priority = 3\n", "rule 1: unknown field 'priority'"),
    "bad_regex": (RULE * 2 + '[[rule]]\ncategory = "gemm"\nregex = ["ok", "("]\n', "rule 3: bad regex '('"),
    "undeclared_category": ('[[rule]]\ncategory = "nope"\nregex = "x"\n', "rule 1: category 'nope'"),
    "bad_group": ('[categories]\nmine = "gpu"\n', "group 'gpu'"),
    "moved_builtin": ('[categories]\ngemm = "memory"\n', "categories.gemm"),
    "inline_flag": ('[[rule]]\ncategory = "gemm"\nregex = "(?i)foo"\n', "use ignore_case"),
    "inline_flag_with_ignore_case": ('[[rule]]\ncategory = "gemm"\nregex = ["a", "(?i)foo"]\n'
                                     "ignore_case = true\n", "use ignore_case"),
    "bad_kind": (RULE + 'kinds = ["gpu_memcpy"]\n', "rule 1: kinds"),
    "empty_regex": ('[[rule]]\ncategory = "gemm"\nregex = []\n', "rule 1: regex"),
    "regex_not_text": ('[[rule]]\ncategory = "gemm"\nregex = 3\n', "rule 1: regex"),
    "ignore_case_not_bool": (RULE + 'ignore_case = "yes"\n', "rule 1: ignore_case"),
    "rule_not_array": ('rule = "gemm"\n', "rule: must be an array"),
    "bad_version": ("version = 2\n", "version"),
}


@pytest.mark.parametrize(("text", "problem"), BAD_FILES.values(), ids=BAD_FILES.keys())
def test_bad_user_file_is_one_input_error_naming_it(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputError) as caught:
        load_taxonomy(path)
    assert caught.value.source == str(path)
    assert problem in caught.value.problem
    assert str(caught.value).startswith(f"{path}: ")
    assert "\n" not in str(caught.value)


def test_missing_user_file_is_an_input_error(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"
    with pytest.raises(InputError) as caught:
        load_taxonomy(str(path))
    assert caught.value.source == str(path)
    assert "no such file" in caught.value.problem
