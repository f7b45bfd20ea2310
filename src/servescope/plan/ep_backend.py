"""How vLLM 0.26 runs an MoE layer under expert parallelism, from ``data/comm/vllm-0.26.toml`` ``[ep]``.

- **DP = 1** (``TP=N EP=N``): no all2all backend runs (``use_all2all_kernels`` needs DP > 1). Every rank sees every
  token, computes its own experts' share, and the routed + shared output is all-reduced over TP: the same
  all-reduce a TP layout runs.
- **DP > 1** (``DP=N EP=N``): the backend named by ``--all2all-backend`` (default ``allgather_reducescatter``)
  dispatches and combines: an all-gather of every rank's tokens and a reduce-scatter of the outputs for the
  default, a dispatch and a combine all-to-all for DeepEP, MoRI, nixl-ep and FlashInfer.

The backend comes from the unit's environment as plan takes it (``--env``): ``VLLM_ALL2ALL_BACKEND`` names it, and
since vLLM 0.26 does not read that variable (removed; the server takes ``--all2all-backend``) the note says that a
unit must pass the flag for the backend priced to be the one that runs. ``naive`` and ``pplx`` are removed
backends that vLLM replaces with ``allgather_reducescatter``, and so does plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from servescope.plan.paths import engine_rules

__all__ = ["EpBackend", "ep_backend"]


@dataclass(frozen=True, kw_only=True)
class EpBackend:
    """The all2all backend vLLM runs for a DP > 1 EP layout, what it does per MoE layer, and why it was chosen.

    Attributes:
        name: the backend (``allgather_reducescatter``, ``deepep_low_latency``, …).
        dispatch: the collective before the experts (``all_gather`` or ``all_to_all``).
        combine: the collective after them (``reduce_scatter`` or ``all_to_all``).
        extra_bytes_per_routed: bytes the dispatch moves per routed token-expert pair beside the hidden vectors
            (the default gathers top-k weights and ids).
        why: how it was chosen, with its source (default, flag, a removed name replaced).
        how: what vLLM runs, with the class that runs it.
        notes: lines for the plan's notes (the environment variable vLLM 0.26 does not read).
        min_dp: the data-parallel size from which vLLM runs the backend at all.
        dp1_why: why a DP = 1 EP layout runs no backend, for the path of its all-reduce.
        needs: the interconnect the backend's kernels need (``nvlink``), empty when any; ``needs_source`` says
            where that is known from.
    """

    name: str
    dispatch: str
    combine: str
    extra_bytes_per_routed: int
    why: str
    how: str
    notes: tuple[str, ...]
    min_dp: int
    dp1_why: str
    needs: str = ""
    needs_source: str = ""

    def unmet(self, interconnect: str) -> str | None:
        """A note when the GPUs' ``interconnect`` cannot run this backend, else None."""
        if not self.needs or self.needs == interconnect:
            return None
        return (f"--all2all-backend {self.name} needs {self.needs} between the GPUs ({self.needs_source}); these "
                f"are joined by {interconnect}: a DP > 1 EP layout will not run with it there (priced as if it "
                f"did); deepep_low_latency and allgather_reducescatter run on PCIe")


def ep_backend(env: dict[str, str]) -> EpBackend:
    """The backend vLLM 0.26 runs under ``env`` (the module doc); an unknown name falls back to the default, said."""
    rules = engine_rules()
    ep = rules["ep"]
    where = f"vLLM {rules['version']}"
    backends: dict[str, dict[str, Any]] = ep["backends"]
    aliases = {a: name for name, b in backends.items() for a in b.get("aliases", [])}
    default = str(ep["default"])
    notes: list[str] = []
    asked = env.get(str(ep["env"]), "").strip()
    name, why = default, f"{ep['flag']} default {default} ({where} config/parallel.py)"
    if asked:
        if not ep["env_read"]:
            notes.append(f"{ep['env']}={asked}: {where} does not read this variable ({ep['env_source']}); "
                         f"plan prices {ep['flag']} {asked}, which the unit must pass as the flag")
        if asked in ep["removed"]:
            why = (f"{asked} is a removed backend: {where} falls back to {default} with a warning "
                   f"(config/parallel.py)")
        elif asked in backends or asked in aliases:
            name = aliases.get(asked, asked)
            why = f"{ep['flag']} {asked} (as {ep['env']} asks; {where} all2all.py)"
        else:
            notes.append(f"{ep['env']}={asked}: not a backend of {where} (config/parallel.py All2AllBackend); "
                         f"priced as the default {default}")
    b = backends[name]
    return EpBackend(name=name, dispatch=str(b["dispatch"]), combine=str(b["combine"]),
                     extra_bytes_per_routed=int(b.get("dispatch_extra_bytes_per_routed", 0)),
                     why=why, how=str(b["how"]), notes=tuple(notes), min_dp=int(ep["all2all_min_dp"]),
                     needs=str(b.get("needs", "")), needs_source=str(b.get("needs_source", "")),
                     dp1_why=(f"EP with DP = 1 runs no all2all backend ({where} fused_moe/config.py "
                              "use_all2all_kernels needs DP > 1): the routed + shared output is all-reduced over TP "
                              "(fused_moe/runner/moe_runner.py _maybe_reduce_final_output)"))
