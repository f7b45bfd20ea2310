"""A regex's needles: plain text every match contains. Searching with them first gives the regex's own answer on
every name (the taxonomy's, precision's, findings' and deployment's patterns over the kernel names of the traces
in tests/data), and skips the search where a needle is missing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from servescope.core import needle
from servescope.core.bundled import bundled_toml
from servescope.core.needle import Needled, needle_of
from tracefiles import ROOT


@pytest.mark.parametrize(("pattern", "flags", "expected"), [
    ("(?<!un)quant(?!ile)", re.IGNORECASE, (("quant",), True)),
    ("[Mm]arlin", 0, (("arlin",), False)),
    ("^triton_(poi|red|per)_fused_", 0, (("triton_",), False)),
    (r"(?i)rccl|hipLaunch|_ZN7ck_tile", 0, (("rccl", "hiplaunch", "_zn7ck_tile"), True)),
    (r"(cross_device|one_?shot)_reduce", 0, (("_reduce",), False)),
    (r"(ab|cd)", 0, (("ab", "cd"), False)),
    ("a|bc", 0, None),  # an alternative without a needle
    ("[Tt]op_?[Kk]", 0, (("op",), False)),
    (r"x\d+", 0, None),  # one character: not worth a test
    ("(?i:abc)|de", 0, None),  # a group with flags of its own
    ("ab(?-i:CD)ef", re.IGNORECASE, (("ab",), True)),  # the group's literals are not read ignoring case
    ("(?i)naïve", 0, None),  # non-ASCII under IGNORECASE
    ("(", 0, None),
])
def test_needles(pattern: str, flags: int, expected: tuple[tuple[str, ...], bool] | None) -> None:
    assert needle_of(pattern, flags) == expected


def _patterns() -> list[tuple[str, int]]:
    taxonomy = bundled_toml("taxonomy.toml")
    out = []
    for table in ("rule", "launch", "sequence", "precision"):
        for rule in taxonomy.get(table, []):
            regex = rule["regex"]
            flags = re.IGNORECASE if rule.get("ignore_case") else 0
            out += [(p, flags) for p in ([regex] if isinstance(regex, str) else regex) + rule.get("requires", [])]
    for table in ("kernels", "conditions"):
        for spec in bundled_toml("findings.toml").get(table, {}).values():
            out += [(p, 0) for key in ("patterns", "exclude", "kernels") for p in spec.get(key, [])]
    for spec in bundled_toml("deployment.toml")["settings"].values():
        out += [(p, 0) for key in ("frames_on", "frames_off", "kernels") for p in spec.get(key, [])]
    return out


def _names() -> list[str]:
    import gzip
    import json

    names = {"dynamic_per_token_scaled_fp8_QUANT_kernel", "ſtrange_ﬁ_Kelvin_K_kernel", "UNQUANTILE", ""}
    for path in sorted((ROOT / "tests" / "data").rglob("*.json.gz"))[::6]:
        doc = json.loads(gzip.decompress(path.read_bytes()))
        events = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
        names |= {e.get("name", "") for e in events if isinstance(e, dict) and isinstance(e.get("name"), str)}
    return sorted(names)


def test_the_answer_is_the_regex_own_on_real_names() -> None:
    names = _names()
    assert len(names) > 1000
    skipped = 0
    for pattern, flags in _patterns():
        needled = Needled.of(pattern, flags)
        regex = re.compile(pattern, flags)
        for name in names:
            expected = regex.search(name) is not None
            assert needled.found(name) is expected, (pattern, name)
            assert needled.found(name, name.lower() if name.isascii() else None) is expected, (pattern, name)
            skipped += bool(needled.needles) and not expected
    assert skipped > 0


def test_needles_are_kept_for_the_next_run_by_the_same_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(needle, "_known", None)
    monkeypatch.setattr(needle, "_unsaved", False)
    assert Needled.of("(?<!un)quant(?!ile)", re.IGNORECASE).needles == ("quant",)
    needle.keep_needles()
    assert (tmp_path / "servescope" / "data" / "needles.marshal").is_file()

    def parse(pattern: str, flags: int = 0) -> None:
        raise AssertionError("parsed again")

    monkeypatch.setattr(needle, "_known", None)  # the next run: found in the cache, not parsed
    monkeypatch.setattr(needle, "needle_of", parse)
    assert Needled.of("(?<!un)quant(?!ile)", re.IGNORECASE).needles == ("quant",)
    monkeypatch.setattr(needle, "_known", None)  # other code (another source of this module): parsed again
    monkeypatch.setattr(needle, "_stamp", lambda: "other code")
    with pytest.raises(AssertionError, match="parsed again"):
        Needled.of("(?<!un)quant(?!ile)", re.IGNORECASE)
