"""The parallel layouts plan compares for a model on N GPUs, and why any were left out.

Kinds (``tp``: attention and dense-MLP tensor-parallel size; ``ep``: expert-parallel size; ``pp``: pipeline
stages; ``dp``: attention data-parallel replicas):

- ``tp``: TP=N. Everything split over N ranks; routed experts split inside each expert (vLLM's default).
- ``tp_ep``: TP=N attention with EP=N experts: each GPU holds E/N whole experts.
- ``dp_ep``: DP=N attention (every GPU a full copy of attention and dense layers, serving B/N requests)
  with EP=N experts (SGLang ``--enable-dp-attention``, vLLM ``--data-parallel-size N
  --enable-expert-parallel``).
- ``pp``: PP=N, one GPU per stage.
- ``tp_pp``: TP=a × PP=b for each a·b = N with a, b ≥ 2.

EP kinds exist only for MoE models. One GPU gives one layout, ``tp`` with TP=1.
"""

from __future__ import annotations

from dataclasses import dataclass

from servescope.plan.model import ModelArch

__all__ = ["LAYOUT_KINDS", "Layout", "candidate_layouts"]

LAYOUT_KINDS = ("tp", "tp_ep", "dp_ep", "pp", "tp_pp")


@dataclass(frozen=True, kw_only=True)
class Layout:
    """One parallel layout: sizes of each kind of parallelism; ``gpus = tp × pp × dp``."""

    kind: str
    tp: int = 1
    ep: int = 1
    pp: int = 1
    dp: int = 1

    @property
    def name(self) -> str:
        """``TP=8``, ``TP=8 EP=8``, ``DP=8 EP=8``, ``PP=8``, ``TP=4 PP=2``."""
        if self.kind == "dp_ep":
            return f"DP={self.dp} EP={self.ep}"
        parts = [f"TP={self.tp}"] if self.kind != "pp" else []
        if self.ep > 1:
            parts.append(f"EP={self.ep}")
        if self.pp > 1:
            parts.append(f"PP={self.pp}")
        return " ".join(parts)

    @property
    def gpus(self) -> int:
        """GPUs the layout uses."""
        return self.tp * self.pp * self.dp

    @property
    def moe_tp(self) -> int:
        """How many ranks split each routed expert: ``tp`` without EP, else 1."""
        return 1 if self.ep > 1 else self.tp


def _tp_problem(arch: ModelArch, tp: int, *, experts_split: bool) -> str | None:
    """Why ``tp`` cannot split the model's attention and MLPs evenly, ``None`` when it can."""
    if arch.heads % tp:
        return f"{arch.heads} attention heads do not split over {tp}"
    if not arch.is_mla and arch.kv_heads % tp and tp % arch.kv_heads:
        return f"{arch.kv_heads} KV heads do not split over {tp}"
    if arch.layers > arch.moe_layers and arch.intermediate % tp:
        return f"MLP width {arch.intermediate} does not split over {tp}"
    if experts_split and arch.moe_layers and arch.moe_intermediate % tp:
        return f"expert width {arch.moe_intermediate} does not split over {tp}"
    return None


def candidate_layouts(arch: ModelArch, gpus: int) -> tuple[list[Layout], list[str]]:
    """The layouts of ``arch`` on ``gpus`` GPUs, and one line per layout left out saying why.

    Raises:
        ValueError: ``gpus`` below 1.
    """
    if gpus < 1:
        raise ValueError(f"gpus must be >= 1, got {gpus}")
    if gpus == 1:
        return [Layout(kind="tp")], []
    out: list[Layout] = []
    skipped: list[str] = []

    def consider(layout: Layout, problem: str | None) -> None:
        if problem is None:
            out.append(layout)
        else:
            skipped.append(f"{layout.name}: {problem}")

    consider(Layout(kind="tp", tp=gpus), _tp_problem(arch, gpus, experts_split=True))
    if arch.experts:
        ep_problem = f"{arch.experts} experts do not split over {gpus}" if arch.experts % gpus else None
        consider(Layout(kind="tp_ep", tp=gpus, ep=gpus),
                 ep_problem or _tp_problem(arch, gpus, experts_split=False))
        consider(Layout(kind="dp_ep", dp=gpus, ep=gpus), ep_problem)
    consider(Layout(kind="pp", pp=gpus),
             None if arch.layers >= gpus else f"{arch.layers} layers are fewer than {gpus} stages")
    for tp in range(2, gpus // 2 + 1):
        if gpus % tp == 0 and gpus // tp >= 2:
            pp = gpus // tp
            problem = _tp_problem(arch, tp, experts_split=True)
            if problem is None and arch.layers < pp:
                problem = f"{arch.layers} layers are fewer than {pp} stages"
            consider(Layout(kind="tp_pp", tp=tp, pp=pp), problem)
    return out, skipped
