"""Which work quantizes, dequantizes or casts, and whether in a kernel of its own or fused into another layer's.

Orthogonal to the category: a kernel keeps its category (norm, activation, gemm, quantize, elementwise…) and
gets a *precision role* (``quantize``, ``dequantize``, ``cast``, or none) by the taxonomy's ``[[precision]]``
rules, read as data from ``servescope/data/taxonomy.toml``:

* by its **name** (each distinct kernel name once, demangled), read from what the name is evidence of
  (:mod:`servescope.trace.classify.kernel_types`): an attention, GEMM or MoE kernel by its operation words only,
  never by a word or an operand type among its template parameters; a typed quantization kernel whose stated types
  are all high precision writes high precision (aiter's ``add_rmsnorm_quant_kernel<bf16, bf16, …>``): no role. vLLM's
  ``dynamic_per_token_scaled_fp8_quant_kernel``,
  Inductor's ``triton_red_fused__to_copy_abs_clamp_…_fused_add_rms_norm_…`` (abs, clamp and ``_to_copy`` in
  one kernel: dynamic fp8 activation scales), PyTorch's ``unrolled_elementwise_kernel<direct_copy…,
  LoadWithCast…>`` dtype conversions;
* else by its **launching op**: the innermost ``cpu_op`` around its launch that a ``launch`` precision rule
  matches (``_C::dynamic_scaled_fp8_quant`` launches ``vllm::segmented_max_reduction``; ``aten::_to_copy``
  launches a cast);
* a kernel replayed from a graph, or with no launch record, has no launching op: it takes the role its name got
  from a launching op where it was launched eagerly in the same trace, else in the graph-capture trace.

Copies and sets (``gpu_memcpy``, ``gpu_memset``) never carry a role. A kernel with a role whose category is one
of the taxonomy's ``precision_standalone`` categories *by its name* (wherever it was launched: a cast launched in a
RoPE module is still a kernel of its own) does nothing else (*standalone*); any other carries the
quantization *fused* into its layer's kernel, and the whole kernel's time is counted as fused quantization time
(an upper bound of what the quantization costs there: the norm or activation around it would run anyway).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from servescope.core.analysis import PhaseStats
from servescope.core.kernel_names import shorten_kernel_name
from servescope.trace.classify.kernel_types import name_role
from servescope.trace.classify.launch import frame_categories
from servescope.trace.classify.taxonomy import Taxonomy
from servescope.trace.classify.taxonomy_file import PRECISION_ROLES, Rule
from servescope.trace.classify.work import Work
from servescope.trace.classify.work_category import CaptureReference, Classified
from servescope.trace.read.table import KIND_KERNEL, TraceData

__all__ = ["Precision", "precision_of", "quant_facts"]

NO_ROLE = 0  # role codes: 0 none, else 1 + the index in PRECISION_ROLES


class Precision(msgspec.Struct, frozen=True):
    """Per work row (in ``Work.rows`` order): its role code (0: none, else 1 + index into ``roles``) and whether
    the role is fused into a kernel of another category."""

    role: npt.NDArray[np.int8]
    fused: npt.NDArray[np.bool_]
    roles: tuple[str, ...] = PRECISION_ROLES


def _code(role: str | None) -> int:
    return 0 if role is None else 1 + PRECISION_ROLES.index(role)


def _frame_taxonomy(taxonomy: Taxonomy) -> Taxonomy:
    """The ``launch`` precision rules as launch rules of a taxonomy whose categories are the roles, so that the
    launch machinery finds each kernel's innermost matching op."""
    rules = []
    for rule in taxonomy.precision_rules:
        if rule.on != "launch":
            continue
        patterns = rule.patterns
        if rule.requires:
            ahead = "".join(f"(?=.*?(?:{r}))" for r in rule.requires)
            patterns = tuple(f"^{ahead}.*?(?:{p})" for p in patterns)
        rules.append(Rule(rule.role, patterns, rule.ignore_case, frozenset({"cpu_op"}), rule.note, rule.source,
                          rule.index, table="launch"))
    return Taxonomy(categories=dict.fromkeys(PRECISION_ROLES, "compute"), source=taxonomy.source,
                    launch_rules=tuple(rules))


def precision_of(data: TraceData, work: Work, taxonomy: Taxonomy, classified: Classified,
                 capture: CaptureReference | None = None) -> Precision:
    """The precision role of every work row of one trace, and whether it is fused (see the module's text)."""
    n = len(work.rows)
    role = np.zeros(n, dtype=np.int8)
    fused = np.zeros(n, dtype=bool)
    if n == 0 or work.kind != "device" or not taxonomy.precision_rules:
        return Precision(role, fused)
    table = work.table
    names = table.name[work.rows]
    kernel = table.kind[work.rows] == KIND_KERNEL
    rows = np.flatnonzero(kernel)
    distinct, first, inverse = np.unique(names[rows], return_index=True, return_inverse=True)
    categories = list(taxonomy.categories)
    by_name = np.array([_code(name_role(taxonomy, data.names[k], categories[int(classified.by_name[rows[f]])]))
                        for k, f in zip(distinct.tolist(), first.tolist(), strict=True)], dtype=np.int8)
    role[rows] = by_name[inverse.ravel()]

    frames = _frame_taxonomy(taxonomy)
    if frames.launch_rules:
        _by_launch(data, work, frames, names, kernel, role, capture, taxonomy)

    # fused or not is what the kernel itself computes: its name's category (a cast launched inside a RoPE module
    # is still a kernel of its own)
    standalone = np.array([c in taxonomy.precision_standalone for c in taxonomy.categories], dtype=bool)
    fused = (role != NO_ROLE) & ~standalone[classified.by_name]
    return Precision(role, fused)


def _by_launch(data: TraceData, work: Work, frames: Taxonomy, names: npt.NDArray[np.int32],
               kernel: npt.NDArray[np.bool_], role: npt.NDArray[np.int8], capture: CaptureReference | None,
               taxonomy: Taxonomy) -> None:
    """Roles from the ops around each eager launch; replayed and unlaunched kernels take their name's role."""
    launch, replayed = work.launch, work.replayed
    eager = np.flatnonzero(kernel & (role == NO_ROLE) & (launch >= 0) & ~replayed)
    if len(eager):
        at = launch[eager]
        start = data.launches.ts_us[at]
        found, _, _ = frame_categories(data, frames, {r: i for i, r in enumerate(PRECISION_ROLES)}, start,
                                       start + data.launches.dur_us[at], data.launches.thread[at])
        role[eager] = np.where(found >= 0, found + 1, NO_ROLE).astype(np.int8)
    # no launching op of their own: the role the same name got from its launching op (eager, else the capture)
    peer: dict[int, int] = {}
    decided = eager[role[eager] != NO_ROLE]
    for name, code in zip(names[decided].tolist(), role[decided].tolist(), strict=True):
        peer.setdefault(name, code)
    if capture is not None:
        ids = {name: i for i, name in enumerate(data.names)}
        for name, frame in zip(capture.names, capture.frames, strict=True):
            code = _code(taxonomy.precision(frame, "launch")) if frame is not None else NO_ROLE
            if code != NO_ROLE and name in ids:
                peer.setdefault(ids[name], code)
    if not peer:
        return
    orphans = np.flatnonzero(kernel & (role == NO_ROLE) & (replayed | (launch < 0)))
    if len(orphans):
        lut = np.zeros(len(data.names), dtype=np.int8)
        lut[list(peer)] = list(peer.values())
        role[orphans] = lut[names[orphans]]


def phase_quant(stats_device_us: float, steps: int, standalone_us: float, fused_us: float,
                by_role: Mapping[str, float], top: tuple[str, str, float] | None) -> dict[str, Any]:
    """The quantization / cast fields of one phase's :class:`PhaseStats` from its totals over ``steps`` steps
    (``stats_device_us``: the phase's device time, all steps)."""
    def share(us: float) -> float:
        return us / stats_device_us if stats_device_us > 0 else 0.0

    return {
        "quant_standalone_us_per_step": standalone_us / steps,
        "quant_fused_us_per_step": fused_us / steps,
        "quant_standalone_share": share(standalone_us),
        "quant_fused_share": share(fused_us),
        "quant_role_us_per_step": {r: us / steps for r, us in by_role.items() if us > 0},
        "quant_top_kernel": top[0] if top else None,
        "quant_top_category": top[1] if top else None,
        "quant_top_share": share(top[2]) if top else 0.0,
    }


def quant_facts(phases: Sequence[PhaseStats]) -> dict[str, Any]:
    """Rank-wide facts for the findings: the quantization / cast share of the rank's device time (standalone,
    fused, both), and the kernel with the most of it (its share and category)."""
    device = sum(p.device_us_per_step * p.steps for p in phases)
    standalone = sum(p.quant_standalone_us_per_step * p.steps for p in phases)
    fused = sum(p.quant_fused_us_per_step * p.steps for p in phases)
    top = max((p for p in phases if p.quant_top_kernel), default=None,
              key=lambda p: p.quant_top_share * p.device_us_per_step * p.steps)

    def share(us: float) -> float:
        return us / device if device > 0 else 0.0

    return {
        "quant_share": share(standalone + fused), "quant_standalone_share": share(standalone),
        "quant_fused_share": share(fused),
        "top_quant": shorten_kernel_name(top.quant_top_kernel, max_chars=100) if top and top.quant_top_kernel else None,
        "top_quant_category": top.quant_top_category if top else None,
        "top_quant_pct": 100 * share(top.quant_top_share * top.device_us_per_step * top.steps) if top else 0.0,
    }
