"""A GPU's hardware profile (``data/hardware/*.toml`` or a user's file): memory, bandwidths, interconnect.

Profiles are data, written by hand from datasheets (``quality = "datasheet"``) or measured. This loader is
tolerant: it reads the fields below and ignores every other key, so profiles may carry more than plan uses.

Fields read (top level unless a table is named):

- ``name`` (str, default: the file name), ``gpu`` (str), ``quality`` (str, default ``"datasheet"``),
  ``source`` (str), ``match`` (list of str: substrings of the device name, used to pick bundled curves).
- ``memory_gb`` (number, required): memory per GPU in 10⁹ bytes.
- ``hbm_gbps`` (number, required): memory bandwidth, GB/s.
- ``nvlink_gbps`` (number, default 0 = no NVLink): NVLink bandwidth per GPU, bidirectional total, GB/s.
- ``pcie_gbps`` (number, default 64 = PCIe Gen4 x16 bidirectional): GB/s.
- ``[dense_tflops]`` (table of dtype → TFLOP/s, default empty): dense tensor-core rates; missing dtypes
  fall back to ``bfloat16``'s, and a missing ``bfloat16`` means "no compute bound".
- ``interconnect``: either a string (``"nvlink"`` or ``"pcie"``) or a table whose ``kind`` is one; default
  ``"nvlink"`` when ``nvlink_gbps`` > 0, else ``"pcie"``.
- ``p2p_gbps`` (top level or in the ``[interconnect]`` table): per-direction GPU-to-GPU bandwidth, GB/s;
  default half of ``nvlink_gbps`` for NVLink or half of ``pcie_gbps`` for PCIe (marked "assumed").
- ``base_us``, ``hop_us`` (top level or in ``[interconnect]``, optional): the α terms of plan's α-β
  collective estimate; defaults by kind in ``data/plan.toml``.
- ``[kernel_floor_us]`` (optional table, keys among ``gemm``, ``attention``, ``other``; ``source`` names where
  they were measured; ``origin``, ``"measured"`` (default) or ``"assumed"`` for floors taken from another card;
  ``from``, a bundled profile whose measured floors and ``[other_floor_by_batch_us]`` this card takes as assumed):
  the duration of one small kernel of that kind however little it reads, µs, without the gap between two
  kernels (measured with ``tools/bench_kernel_floor.py``). ``--calibrate`` uses them to split a capture's time
  into floors and per-request work; a profile without them has none (plan says so in its notes), and assumed
  ones are named in its notes.
- ``[attention_kernel_floor_us]`` (optional table, a piece of a kernel's name → µs; ``source`` names where they
  were measured): an engine's own decode attention kernel's least duration, for the kernels whose name holds
  the key; it replaces ``kernel_floor_us.attention`` (a plain PyTorch attention) for them. FlashAttention 3
  takes ~8 µs a call on an H200 however few tokens it reads, the PyTorch one ~5.
- ``[attention_kernel_rate]`` (optional table, a piece of a kernel's name → the fraction of ``hbm_gbps`` it reads
  the KV cache at, above 0 and at most 1; ``source`` names where it was measured): an engine's own decode
  attention kernel's stream rate at a long context, which ``--calibrate`` takes for the KV bytes of those kernels
  in place of the assumed one (a short capture cannot tell the rate from the kernel's work per request).
- ``[other_floor_by_batch_us]`` (optional table, batch size → µs, e.g. ``"16" = 1.93``): the mean duration of
  a decoder layer's small activation-sized kernels (norms, rotary, residual adds, SiLU, KV-cache writes) at
  that many requests, from the same benchmark. Between two measured batches the floor is interpolated
  linearly, outside them held at the nearest; without the table it is ``kernel_floor_us.other`` at every
  batch.

- ``p2p`` (bool, default true), ``nvlink_multicast`` (bool, default false), ``compute_capability`` (str, e.g.
  ``"9.0"``, default empty), ``platform`` (``"cuda"`` or ``"rocm"``, default ``"cuda"``): what decides the
  all-reduce path vLLM takes (:mod:`servescope.plan.paths`).

Other keys (``pcie_gen``, ``tdp_w``, …) are ignored.

Example:
    >>> load_hardware("h200").hbm_gbps
    4800.0
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

from servescope.core.errors import InputError
from servescope.core.files import HARDWARE_DIR, hardware_profile_names

__all__ = ["FLOOR_KINDS", "INTERCONNECT_KINDS", "HardwareProfile", "list_hardware_profiles", "load_hardware"]

INTERCONNECT_KINDS = ("nvlink", "pcie")
FLOOR_KINDS = ("gemm", "attention", "other")
_DEFAULT_PCIE_GBPS = 64.0


@dataclass(frozen=True, kw_only=True)
class HardwareProfile:
    """The numbers of one GPU model that plan's cost model uses; bandwidths in GB/s (10⁹ bytes/s).

    Attributes:
        name: profile name (file name without ``.toml``).
        gpu: marketing name.
        quality: where the numbers come from (``datasheet``, ``measured``).
        source: the document they were written from.
        match: device-name substrings this profile describes.
        memory_gb: memory per GPU, 10⁹ bytes.
        hbm_gbps: memory bandwidth.
        nvlink_gbps: NVLink per GPU, bidirectional total; 0 without NVLink.
        pcie_gbps: PCIe per GPU, bidirectional total.
        dense_tflops: dense tensor-core TFLOP/s by dtype.
        interconnect: ``nvlink`` or ``pcie``: the path collectives take.
        p2p_gbps: per-direction GPU-to-GPU bandwidth collectives get.
        p2p_origin: ``datasheet`` when the profile states ``p2p_gbps``, else ``assumed`` (derived from the
            link's bidirectional figure).
        base_us, hop_us: α terms of the α-β collective estimate; ``None`` means plan's default for the kind.
        kernel_floor_us: per kernel kind (``gemm``, ``attention``, ``other``), the measured time of one
            small kernel, µs; a kind absent is not known.
        kernel_floor_source: where the floors were measured.
        kernel_floor_origin: ``measured`` on this kind of card, or ``assumed`` (another card's measurement).
        attention_kernel_floor_us: a piece of an attention kernel's name → its least duration, µs (an engine's
            own kernel, whose floor is not the plain one's).
        attention_kernel_floor_source: where those were measured.
        attention_kernel_rate: a piece of an attention kernel's name → the fraction of the datasheet HBM rate it
            reads the KV cache at (measured at a long context).
        attention_kernel_rate_source: where those were measured.
        other_floor_by_batch_us: batch size → mean duration of a decoder layer's small kernels, µs; empty
            when not measured.
        p2p, nvlink_multicast, compute_capability, platform: GPU peer-to-peer, NVLink SHARP multicast, the CUDA
            compute capability and the platform, as the engine's all-reduce choice reads them.
    """

    name: str
    gpu: str
    quality: str
    source: str
    match: tuple[str, ...]
    memory_gb: float
    hbm_gbps: float
    nvlink_gbps: float
    pcie_gbps: float
    dense_tflops: dict[str, float] = field(default_factory=dict)
    interconnect: str
    p2p_gbps: float
    p2p_origin: str
    base_us: float | None = None
    hop_us: float | None = None
    kernel_floor_us: dict[str, float] = field(default_factory=dict)
    kernel_floor_source: str = ""
    kernel_floor_origin: str = "measured"
    attention_kernel_floor_us: dict[str, float] = field(default_factory=dict)
    attention_kernel_floor_source: str = ""
    attention_kernel_rate: dict[str, float] = field(default_factory=dict)
    attention_kernel_rate_source: str = ""
    other_floor_by_batch_us: dict[int, float] = field(default_factory=dict)
    p2p: bool = True
    nvlink_multicast: bool = False
    compute_capability: str = ""
    platform: str = "cuda"

    def attention_floor_us(self, kernel: str) -> float | None:
        """The least duration of one call of the attention kernel named ``kernel``, µs: its own measured floor
        where ``[attention_kernel_floor_us]`` has a key in its name, else ``kernel_floor_us.attention``."""
        for key, us in self.attention_kernel_floor_us.items():
            if key in kernel:
                return us
        return self.kernel_floor_us.get("attention")

    def attention_rate(self, kernel: str) -> float | None:
        """The fraction of the datasheet HBM rate the attention kernel named ``kernel`` reads its KV cache at,
        where ``[attention_kernel_rate]`` has a key in its name; ``None`` when not measured."""
        return next((rate for key, rate in self.attention_kernel_rate.items() if key in kernel), None)

    def other_floor_us(self, batch: int) -> float | None:
        """The duration of one small "other" kernel at ``batch`` requests, µs; ``None`` when not measured.

        Linear between the two measured batches around ``batch``, the nearest one's outside them, and
        ``kernel_floor_us.other`` at every batch when the profile has no ``[other_floor_by_batch_us]``.
        """
        curve = sorted(self.other_floor_by_batch_us.items())
        if not curve:
            return self.kernel_floor_us.get("other")
        if batch <= curve[0][0]:
            return curve[0][1]
        for (b0, f0), (b1, f1) in zip(curve, curve[1:], strict=False):
            if batch <= b1:
                return f0 + (f1 - f0) * (batch - b0) / (b1 - b0)
        return curve[-1][1]

    def tflops_for(self, dtype: str) -> float | None:
        """Dense TFLOP/s for weights of ``dtype`` (int4/fp8 labels map to their math type), ``None`` if unknown.

        Quantized integer weights (``int4-g32``, ``gptq4-g128``) are dequantized to bf16 for the math, as
        Marlin kernels do; ``fp8-*`` uses the ``float8`` rate when the profile has one.
        """
        if dtype.startswith("fp8") and "float8" in self.dense_tflops:
            return self.dense_tflops["float8"]
        if dtype in self.dense_tflops:
            return self.dense_tflops[dtype]
        return self.dense_tflops.get("bfloat16")


list_hardware_profiles = hardware_profile_names


def load_hardware(source: str | Path) -> HardwareProfile:
    """The hardware profile in a ``.toml`` file or the bundled one of that name.

    Raises:
        InputError: the file cannot be read or parsed, a required field is missing or of the wrong type,
            or no bundled profile has the name (the message lists them).
    """
    path = Path(source)
    if path.suffix == ".toml":
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise InputError(str(path), exc.strerror or "cannot read") from None
        return _profile_from_text(text, str(path), default_name=path.stem)
    name = str(source)
    resource = files("servescope").joinpath(*HARDWARE_DIR, f"{name}.toml")
    if not resource.is_file():
        raise InputError(name, f"no such hardware profile; profiles: {', '.join(list_hardware_profiles())}")
    return _profile_from_text(resource.read_text(encoding="utf-8"), f"hardware profile {name}", default_name=name)


def _number(data: dict[str, Any], key: str, where: str, default: float | None = None) -> float:
    value = data.get(key, default)
    if value is None:
        raise InputError(where, f"missing field {key!r}")
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise InputError(where, f"{key}: expected a number ≥ 0, got {value!r}")
    return float(value)


def _text(data: dict[str, Any], key: str, where: str, default: str) -> str:
    value = data.get(key, default)
    if not isinstance(value, str):
        raise InputError(where, f"{key}: expected a string, got {value!r}")
    return value


def _profile_from_text(text: str, where: str, *, default_name: str) -> HardwareProfile:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(where, f"not TOML: {exc}") from None
    memory = _number(data, "memory_gb", where)
    hbm = _number(data, "hbm_gbps", where)
    if memory <= 0 or hbm <= 0:
        raise InputError(where, "memory_gb and hbm_gbps must be positive")
    nvlink = _number(data, "nvlink_gbps", where, 0.0)
    pcie = _number(data, "pcie_gbps", where, _DEFAULT_PCIE_GBPS)
    rates = data.get("dense_tflops", {})
    if not isinstance(rates, dict):
        raise InputError(where, "dense_tflops: expected a table of dtype = TFLOP/s")
    tflops = {str(k): _number(rates, k, f"{where}: dense_tflops") for k in rates}
    match = data.get("match", [])
    if not isinstance(match, list) or not all(isinstance(m, str) for m in match):
        raise InputError(where, "match: expected a list of strings")
    link = data.get("interconnect", {})
    if not isinstance(link, dict):  # a profile may say `interconnect = "pcie"` instead of a table
        link = {"kind": link}
    kind = link.get("kind", "nvlink" if nvlink > 0 else "pcie")
    if kind not in INTERCONNECT_KINDS:
        raise InputError(where, f"interconnect.kind: expected one of {', '.join(INTERCONNECT_KINDS)}, got {kind!r}")
    inner = f"{where}: interconnect"
    link = {**{k: data[k] for k in ("p2p_gbps", "base_us", "hop_us") if k in data}, **link}
    if "p2p_gbps" in link:
        p2p, p2p_origin = _number(link, "p2p_gbps", inner), "datasheet"
    else:
        p2p, p2p_origin = (nvlink if kind == "nvlink" and nvlink > 0 else pcie) / 2, "assumed"
    if p2p <= 0:
        raise InputError(where, "interconnect: p2p bandwidth must be positive")
    floors = data.get("kernel_floor_us", {})
    if not isinstance(floors, dict):
        raise InputError(where, "kernel_floor_us: expected a table of kind = µs")
    bad = sorted(set(floors) - {*FLOOR_KINDS, "source", "origin", "from"})
    if bad:
        raise InputError(where, f"kernel_floor_us: unknown kind {bad[0]!r}; kinds: {', '.join(FLOOR_KINDS)}")
    floor_us = {k: _number(floors, k, f"{where}: kernel_floor_us") for k in FLOOR_KINDS if k in floors}
    floor_origin = _text(floors, "origin", where, "measured")
    if floor_origin not in ("measured", "assumed"):
        raise InputError(where, f"kernel_floor_us.origin: {floor_origin!r} is neither 'measured' nor 'assumed'")
    floor_source = _text(floors, "source", where, "")
    donor = _floor_donor(floors, where)
    if donor is not None:  # another card's measured floors, this card's own kinds over them
        floor_us = {**donor.kernel_floor_us, **floor_us}
        floor_origin = "assumed"
        floor_source = f"{donor.name}'s measured floors ({donor.kernel_floor_source}), taken for this card" + \
            (f": {floor_source}" if floor_source else "")
    by_kernel = data.get("attention_kernel_floor_us", {})
    if not isinstance(by_kernel, dict):
        raise InputError(where, "attention_kernel_floor_us: expected a table of kernel name = µs")
    attention_floors = {k: _number(by_kernel, k, f"{where}: attention_kernel_floor_us")
                        for k in by_kernel if k != "source"}
    by_rate = data.get("attention_kernel_rate", {})
    if not isinstance(by_rate, dict):
        raise InputError(where, "attention_kernel_rate: expected a table of kernel name = fraction of hbm_gbps")
    rates = {k: _number(by_rate, k, f"{where}: attention_kernel_rate") for k in by_rate if k != "source"}
    for key, rate in rates.items():
        if not 0 < rate <= 1:
            raise InputError(where, f"attention_kernel_rate.{key}: {rate} is not a fraction of hbm_gbps (0 < x <= 1)")
    by_batch = data.get("other_floor_by_batch_us", {})
    if not isinstance(by_batch, dict):
        raise InputError(where, "other_floor_by_batch_us: expected a table of batch = µs")
    curve: dict[int, float] = {}
    for key in by_batch:
        if not (isinstance(key, str) and key.isdigit() and int(key) >= 1):
            raise InputError(where, f"other_floor_by_batch_us: {key!r} is not a batch size (an integer >= 1)")
        curve[int(key)] = _number(by_batch, key, f"{where}: other_floor_by_batch_us")
    if donor is not None and not curve:
        curve = dict(donor.other_floor_by_batch_us)
    return HardwareProfile(
        kernel_floor_us=floor_us, other_floor_by_batch_us=curve, kernel_floor_source=floor_source,
        kernel_floor_origin=floor_origin, attention_kernel_floor_us=attention_floors,
        attention_kernel_floor_source=_text(by_kernel, "source", where, ""),
        attention_kernel_rate=rates, attention_kernel_rate_source=_text(by_rate, "source", where, ""),
        name=_text(data, "name", where, default_name), gpu=_text(data, "gpu", where, default_name),
        quality=_text(data, "quality", where, "datasheet"), source=_text(data, "source", where, where),
        match=tuple(match), memory_gb=memory, hbm_gbps=hbm, nvlink_gbps=nvlink, pcie_gbps=pcie,
        dense_tflops=tflops, interconnect=kind, p2p_gbps=p2p, p2p_origin=p2p_origin,
        base_us=_number(link, "base_us", inner) if "base_us" in link else None,
        hop_us=_number(link, "hop_us", inner) if "hop_us" in link else None,
        p2p=_flag(data, "p2p", where, True), nvlink_multicast=_flag(data, "nvlink_multicast", where, False),
        compute_capability=_text(data, "compute_capability", where, ""),
        platform=_text(data, "platform", where, "cuda"),
    )


def _floor_donor(floors: dict[str, Any], where: str) -> HardwareProfile | None:
    """The bundled profile whose measured floors ``[kernel_floor_us] from`` names; ``None`` without the key."""
    if "from" not in floors:
        return None
    name = _text(floors, "from", where, "")
    if name not in hardware_profile_names():
        raise InputError(where, f"kernel_floor_us.from: {name!r} is not a bundled profile; profiles: "
                                f"{', '.join(hardware_profile_names())}")
    donor = load_hardware(name)
    if donor.kernel_floor_origin != "measured" or not donor.kernel_floor_us:
        raise InputError(where, f"kernel_floor_us.from: {name} has no measured kernel floors to take")
    return donor


def _flag(data: dict[str, Any], key: str, where: str, default: bool) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise InputError(where, f"{key}: expected true or false, got {value!r}")
    return value
