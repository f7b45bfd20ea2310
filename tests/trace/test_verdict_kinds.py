"""Every rule declares its verdict kind in findings.toml; an unknown kind is an error naming the file and the rule."""

from __future__ import annotations

import copy

import pytest

from servescope.core.errors import InputError
from servescope.trace.rules.findings import check_verdicts, load_rules


def test_every_rule_declares_a_known_verdict_kind() -> None:
    data = load_rules()
    kinds = set(data["verdict"]["kinds"])
    assert all(spec["verdict"] in kinds for spec in data["rules"].values())
    assert all(data["rules"][r]["verdict"] != "none" for r in data["verdict"]["order"])


def test_an_unknown_kind_is_an_error_naming_file_and_rule() -> None:
    data = copy.deepcopy(load_rules())
    data["rules"]["launch_bound"]["verdict"] = "hostish"
    with pytest.raises(InputError, match=r"findings\.toml: rules\.launch_bound: verdict 'hostish'"):
        check_verdicts(data, "data/findings.toml")


def test_a_rule_without_a_kind_is_an_error() -> None:
    data = copy.deepcopy(load_rules())
    del data["rules"]["cpu_overhead"]["verdict"]
    with pytest.raises(InputError, match="rules.cpu_overhead: verdict None"):
        check_verdicts(data, "data/findings.toml")


def test_order_naming_an_unknown_rule_is_an_error() -> None:
    data = copy.deepcopy(load_rules())
    data["verdict"]["order"].append("no_such_rule")
    with pytest.raises(InputError, match="'no_such_rule', which"):
        check_verdicts(data, "data/findings.toml")


def test_order_naming_a_rule_without_a_verdict_is_an_error() -> None:
    data = copy.deepcopy(load_rules())
    data["verdict"]["order"].append("host_gap")
    with pytest.raises(InputError, match="'host_gap', whose verdict is 'none'"):
        check_verdicts(data, "data/findings.toml")
