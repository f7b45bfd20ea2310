#!/usr/bin/env python3
"""Independent per-kernel labels for servescope's classification tests (tests/labels/*.labels.json).

Plain Python (stdlib only); it never imports servescope nor reads its taxonomy. For every device event
(kernel, gpu_memcpy, gpu_memset) it follows the correlation id to the runtime launch (cuda_runtime /
cuda_driver) and takes the host events that enclose that launch on the launching thread (cpu_op,
user_annotation, python_function: nn.Module and python frames), innermost last. For CPU-only traces the work
is every cpu_op with its self time (dur minus its direct cpu_op children) and its context is its own
enclosing stack. A category is then decided per event from that context and the name by the rules in
``decide`` below (written from looking at the traces), with ``OVERRIDES`` for names looked at one by one.
Kernels replayed from a CUDA/HIP graph have no launching op: they take the category their name got where it
was launched by an op, in the same trace, else in a reference trace (the graph capture, or the eager run of
the same model).

    python3 tools/label_traces.py dump TRACE [--ref REF]    # per name: count, µs, launch ops, frames
    python3 tools/label_traces.py write [--only SUBSTRING]  # (re)write tests/labels/*.labels.json
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import re
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"
OUT = ROOT / "tests" / "labels"

DEVICE_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
RUNTIME_CATS = {"cuda_runtime", "cuda_driver"}
HOST_CATS = {"cpu_op", "user_annotation", "python_function"}
NO_RUNTIME = "<no runtime event>"
NO_OP = "<no cpu op>"


# ----------------------------------------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------------------------------------

def load_events(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        doc = json.load(handle)
    return doc["traceEvents"] if isinstance(doc, dict) else doc


@dataclass
class Work:
    """One unit of work: a device event, or a cpu_op (self time) in a CPU-only trace."""

    name: str
    kind: str  # kernel | memcpy | memset | cpu_op
    dur: float
    launch: str | None  # runtime call name (None: no runtime event found)
    stack: tuple[tuple[str, str, float], ...]  # enclosing host events (cat, name, ts), outermost first
    ts: float = 0.0
    thread: tuple = ()
    corr: Any = None

    @property
    def launch_op(self) -> str:
        if self.kind == "cpu_op":
            return self.name
        if self.launch is None:
            return NO_RUNTIME
        ops = [n for c, n, _ in self.stack if c == "cpu_op"]
        return ops[-1] if ops else NO_OP

    @property
    def graph(self) -> bool:
        return self.launch is not None and "GraphLaunch" in self.launch


@dataclass
class Trace:
    path: Path
    events: list[dict[str, Any]]
    cpu_only: bool
    work: list[Work] = field(default_factory=list)
    # capture traces: the launches recorded while capturing a graph (name from args.kernel), with context
    captured: list[Work] = field(default_factory=list)
    host: dict[tuple, list[dict[str, Any]]] = field(default_factory=dict)


def _sweep(host: list[dict[str, Any]], queries: list[tuple[float, int]]) -> tuple[dict[int, tuple], dict[int, tuple]]:
    """Enclosing stacks on one thread. ``host``: X events; ``queries``: (time, id).

    Returns (stack at each query, parent stack of each host event by index into ``host``)."""
    items: list[tuple[float, int, float, int]] = []  # (ts, order, -dur, idx); order 0 host, 1 query
    for i, e in enumerate(host):
        items.append((float(e["ts"]), 0, -float(e.get("dur", 0) or 0), i))
    for t, qid in queries:
        items.append((t, 1, 0.0, qid))
    items.sort()
    stack: list[tuple[float, tuple[str, str, float]]] = []  # (end, (cat, name, ts))
    at_query: dict[int, tuple] = {}
    parents: dict[int, tuple] = {}
    for ts, order, negdur, idx in items:
        while stack and stack[-1][0] <= ts:
            stack.pop()
        if order == 1:
            at_query[idx] = tuple(s[1] for s in stack)
        else:
            e = host[idx]
            parents[idx] = tuple(s[1] for s in stack)
            stack.append((ts - negdur, (e["cat"], e["name"], ts)))
    return at_query, parents


def read_trace(path: Path) -> Trace:
    events = load_events(path)
    xs = [e for e in events if e.get("ph") == "X"]
    device = [e for e in xs if e.get("cat") in DEVICE_CATS]
    host_by_thread: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for e in xs:
        if e.get("cat") in HOST_CATS:
            host_by_thread[(e.get("pid"), e.get("tid"))].append(e)
    trace = Trace(path=path, events=events, cpu_only=not device, host=host_by_thread)
    if trace.cpu_only:
        for thread, host in host_by_thread.items():
            _, parents = _sweep(host, [])
            # self time: dur minus direct cpu_op children (nearest enclosing cpu_op is the parent)
            child_dur: dict[int, float] = defaultdict(float)
            open_ops: list[tuple[float, int]] = []
            order = sorted(range(len(host)), key=lambda i: (float(host[i]["ts"]), -float(host[i].get("dur", 0))))
            for i in order:
                e = host[i]
                if e["cat"] != "cpu_op":
                    continue
                ts = float(e["ts"])
                while open_ops and open_ops[-1][0] <= ts:
                    open_ops.pop()
                if open_ops:
                    child_dur[open_ops[-1][1]] += float(e.get("dur", 0))
                open_ops.append((ts + float(e.get("dur", 0)), i))
            for i, e in enumerate(host):
                if e["cat"] != "cpu_op" or e["name"].startswith("ProfilerStep#"):
                    continue
                self_us = max(0.0, float(e.get("dur", 0)) - child_dur[i])
                trace.work.append(Work(e["name"], "cpu_op", self_us, None, parents[i], float(e["ts"]), thread))
        return trace
    runtime: dict[Any, dict[str, Any]] = {}
    for e in xs:
        if e.get("cat") in RUNTIME_CATS:
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                runtime[corr] = e
    queries: dict[tuple, list[tuple[float, int]]] = defaultdict(list)
    launch_of: dict[int, dict[str, Any]] = {}
    for i, e in enumerate(device):
        r = runtime.get((e.get("args") or {}).get("correlation"))
        if r is not None:
            launch_of[i] = r
            queries[(r.get("pid"), r.get("tid"))].append((float(r["ts"]), i))
    # launches made while capturing a graph: runtime events that name the kernel (ROCm: args.kernel)
    launched = [(j, r) for j, r in enumerate(e for e in xs if e.get("cat") in RUNTIME_CATS)
                if "kernel" in (r.get("args") or {})]
    cap_q: dict[tuple, list[tuple[float, int]]] = defaultdict(list)
    for j, r in launched:
        cap_q[(r.get("pid"), r.get("tid"))].append((float(r["ts"]), -1 - j))
    stacks: dict[int, tuple] = {}
    for thread in set(queries) | set(cap_q):
        at, _ = _sweep(host_by_thread.get(thread, []), queries.get(thread, []) + cap_q.get(thread, []))
        stacks.update(at)
    for i, e in enumerate(device):
        r = launch_of.get(i)
        trace.work.append(Work(e["name"], DEVICE_CATS[e["cat"]], float(e.get("dur", 0)),
                               r["name"] if r else None, stacks.get(i, ()), float(e["ts"]),
                               (r.get("pid"), r.get("tid")) if r else (), (e.get("args") or {}).get("correlation")))
    done = {(e.get("args") or {}).get("correlation") for e in device}
    for j, r in launched:
        if (r.get("args") or {}).get("correlation") in done:
            continue  # executed too: already labelled as a kernel
        trace.captured.append(Work(r["args"]["kernel"], "kernel", 0.0, r["name"], stacks.get(-1 - j, ()),
                                   float(r["ts"]), (r.get("pid"), r.get("tid"))))
    return trace


# ----------------------------------------------------------------------------------------------------------
# Deciding: context first (launching op, enclosing ops / modules / frames / annotations), then the name
# ----------------------------------------------------------------------------------------------------------

def _has(pattern: str, text: str) -> bool:
    return re.search(pattern, text, re.I) is not None


COMM = [  # (name pattern, category)
    (r"all_?reduce|allreduce|cross_device_reduce|reduce_scatter_?\w*allreduce", "comm.all_reduce"),
    (r"all_?gather|allgather", "comm.all_gather"),
    (r"reduce_?scatter|reducescatter", "comm.reduce_scatter"),
    (r"all_?to_?all|alltoall|all2all", "comm.all_to_all"),
    (r"sendrecv|send_recv|\bsend\b|\brecv\b|ncclDevKernel_Send|ncclDevKernel_Recv|ncclKernel_Send|ncclKernel_Recv",
     "comm.send_recv"),
    (r"broadcast|ncclKernel|ncclDevKernel|rccl", "comm.other"),
]
GEMM_NAME = (r"gemm|^Cijk_|nvjet|xmma|cutlass.*(tensorop|sgemm|simt)|splitKreduce|cublas|hipblas|"
             r"^ampere_\w*gemm|^sm\d+_\w*gemm|^(?!.*(sdpa|fmha|flash)).*wgmma|onednn_mm|_matmul(?!_ogs)")
GEMM_OP = (r"^(aten::(mm|addmm|bmm|baddbmm|addbmm|matmul|linear|_scaled_mm)|_C::\w*(onednn_mm|linear|gemm)\w*|"
           r"vllm::\w*gemm\w*|aiter::gemm\w*)$")
# aten op -> category when nothing in the context says more (the op's own meaning)
OP_CATEGORY = [
    (r"^aten::(embedding|embedding_bag|_embedding_bag\w*)$|^fbgemm::\w*embedding|split_embedding", "embedding"),
    (r"^aten::(index|index_select|gather|scatter\w*|index_put_?|_index_put_impl_|index_copy_?|masked_select|"
     r"masked_scatter_?|take|nonzero|where|masked_fill_?|upsample\w*|_unsafe_index)$", "indexing"),
    (r"^aten::(sort|argsort|topk|cumsum|cumprod|histc|bincount|unique\w*|searchsorted)$", "sort_scan"),
    (r"^aten::(sum|mean|max|min|amax|amin|prod|norm|var|std|var_mean|all|any|argmin|logsumexp)$", "reduction"),
    (r"^aten::argmax$", "sampling"),
    (r"^aten::(silu|gelu|relu|relu_|sigmoid|tanh|threshold\w*|hardtanh|leaky_relu|elu|mish|softplus|"
     r"silu_backward|gelu_backward|tanh_backward|sigmoid_backward|clamp_min_?)$", "activation"),
    (r"^aten::(native_layer_norm|layer_norm|native_layer_norm_backward|batch_norm|cudnn_batch_norm\w*|"
     r"native_batch_norm\w*|group_norm|native_group_norm\w*|rms_norm|_fused_rms_norm)$", "norm"),
    (r"^aten::(_?softmax|_?log_softmax|_softmax_backward_data)$", "reduction"),
    (r"convolution|conv\d?d|cudnn_conv|miopen_conv", "conv"),
    (r"^aten::(max_pool\w*|avg_pool\w*|adaptive\w*pool\w*)", "conv"),
    (r"^aten::(_foreach\w*|_fused_adam\w*|_fused_sgd\w*)", "optimizer"),
]
NAME_CATEGORY = [  # kernel / op name -> category (used when the context says nothing special)
    (r"attn|attention|flash_fwd|fmha|paged_attention|reshape_and_cache|store_kvcache|kv_cache|"
     r"sdpa|FlashAttn|flash::|unified_attention|mha_|reduce_segments|merge_attn", "attention"),
    (r"matmul_ogs|moe|topk_softmax|_combined_routing|bitmatrix|_topk_forward|_finalize_matmul|expert", "moe"),
    (r"rms_?norm|layer_?norm|layernorm|bn_fw|bn_bw|batch_?norm|GammaBetaBackward|group_?norm", "norm"),
    (r"rotary|rope", "rotary"),
    (r"act_and_mul|silu|gelu|swiglu|relu|sigmoid|tanh|threshold|clamp_scalar", "activation"),
    (r"argmax|sampl|gumbel|multinomial|penalt", "sampling"),
    (r"embedding|embed", "embedding"),
    (r"conv|im2col|Im2d2Col|nchwToNhwc|nhwcToNchw|igemm_fwd|igemm_bwd|igemm_wrw|pool", "conv"),
    (r"sort|scan|topk|cumsum|histogram", "sort_scan"),
    (r"gather|scatter|index|masked_fill|where_kernel|upsample|permute_\w*indices|bounds_check|linearize", "indexing"),
    (r"reduce_kernel|ReduceOp|sum_functor|MeanOps|softmax", "reduction"),
    (r"adam|adagrad|sgd|multi_tensor_apply|optimizer", "optimizer"),
]


def _frames(w: Work) -> str:
    return " | ".join(n for _, n, _ in w.stack)


def _modules(w: Work) -> str:
    return " | ".join(n for c, n, _ in w.stack if c == "python_function" and
                      (n.startswith("nn.Module:") or not _boring_py(n)))


def decide(w: Work, region: str | None = None) -> tuple[str, str, bool]:
    """(category, evidence, arguable) for one unit of work."""
    name = w.name
    if w.kind in ("memcpy", "memset"):
        return w.kind, f"{w.kind} event", False
    op = w.launch_op
    ops = [n for c, n, _ in w.stack if c == "cpu_op"] + ([name] if w.kind == "cpu_op" else [])
    ops_text = " | ".join(ops)
    frames = _frames(w) + (" | " + name if w.kind == "cpu_op" else "")
    mods = _modules(w)
    # communication: the name, or a collective op around the launch
    for pat, cat in COMM:
        if _has(pat, name) and (w.kind != "cpu_op" or _has(r"shm_|all_?reduce|all_?gather|c10d::|nccl|gloo|"
                                                              r"reduce_scatter|all_to_all|broadcast", name)):
            if cat == "comm.send_recv" and _has(r"all_?to_?all", _frames(w)):
                return "comm.all_to_all", "SendRecv kernel launched inside an all_to_all op: NCCL runs all-to-all " \
                                          "as grouped send/recv", False
            return cat, "collective kernel/op name", False
    if w.kind == "cpu_op" and _has(VIEW_OPS, name):
        return "framework", f"tensor bookkeeping op {name} (no compute)", _has(r"gloo:|nccl:|c10d::", frames)
    if w.kind == "kernel" and _has(r"nccl:|c10d::|record_param_comms", frames):
        for pat, cat in COMM:
            if _has(pat, frames):
                return cat, f"launched inside collective {op}", True
    # optimizer step (annotation / op), fused embedding backward with the optimizer update
    if _has(r"Optimizer\.step|## optimizer ##|optimizer\.py.*step|zero_grad", frames):
        return "optimizer", "inside the optimizer step (annotation Optimizer.step)", False
    if _has(r"SplitLookupFunction|split_embedding|fbgemm::\w*(embedding|jagged)", ops_text + " | " + name):
        return "embedding", f"fused embedding table op ({op})", _has("backward|adagrad", name)
    if _has(r"permute_pooled_embs|permute_sparse|bounds_check_indices|recat_embedding", ops_text + name):
        return "embedding", f"embedding-bag input/output permutation ({op})", True
    # convolution / pooling ops (cuDNN/MIOpen implicit-GEMM, layout transposes they launch)
    if any(_has(r"^aten::\w*(convolution|cudnn_conv|miopen_conv|conv\dd)\w*$", o) for o in ops):
        return "conv", f"launched by convolution op {op}", False
    if any(_has(r"^aten::\w*(max_pool|avg_pool|adaptive_\w*pool)", o) for o in ops):
        return "conv", f"pooling op {op}", True
    # GEMM kernels / GEMM ops (inside MoE: grouped expert GEMMs are moe)
    is_gemm = (w.kind == "kernel" and _has(GEMM_NAME, name)) or _has(GEMM_OP, op) or \
        (w.kind == "cpu_op" and _has(GEMM_OP, name))
    if _has(r"_grouped_mm|fused_moe|moe_forward|matmul_ogs", ops_text + " | " + name):
        # vLLM >= 0.2x runs the router gate (aten::linear, hidden x experts) and the expert activation inside
        # vllm::moe_forward; HF runs them outside the MoE op (gemm / activation there): arguable either way
        if is_gemm and _has(r"^aten::(mm|addmm|linear|matmul)$", op) and \
                not _has(r"_grouped_mm|fused_moe|matmul_ogs|moe|expert", name):
            return "gemm", f"dense GEMM {op} inside the MoE op ({_last(ops_text, 'moe')}): the router gate " \
                           "(hidden x experts) or a shared expert, not the experts' grouped GEMM", True
        if _has(r"silu|gelu|act_and_mul|swiglu", op) and not is_gemm and \
                not _has(r"matmul|gemm|fused_moe|moe_forward", name + " | " + op):
            return "activation", f"expert activation {op} inside the MoE op ({_last(ops_text, 'moe')})", True
        return "moe", f"MoE expert GEMM/op ({op})", False
    if is_gemm and _has(r"RotaryEmbedding|rotary", mods):
        return "rotary", f"GEMM {op} computing the RoPE cos/sin table inside RotaryEmbedding", True
    if is_gemm and region == "rotary":
        return "rotary", f"{op} computing the RoPE cos/sin table (op sequence matmul cat cos sin)", True
    if is_gemm:
        return "gemm", f"GEMM kernel; launched by {op}", False
    # attention ops and modules
    if _has(r"scaled_dot_product|flash_attention|_efficient_attention|_cudnn_attention|unified_attention|"
            r"cpu_attn|cpu_attention|kv_cache_update|reshape_and_cache|paged_attention|_fa\d?_C::|flash_attn|"
            r"vllm::\w*attention", ops_text):
        return "attention", f"inside attention op ({[o for o in ops if _has('attn|attention|cache', o)][:1]})", \
            not _has(r"attn|attention|flash|fmha|cache|softmax", name)
    if _has(r"sdpa_attention|eager_attention|attention_interface|flash_attention_forward", frames):
        return "attention", f"op {op} inside the attention function (sdpa_attention_forward)", \
            _has(r"copy|clone|contiguous", op)
    if region == "attention":
        return "attention", f"op {op} in the attention sequence (repeat_kv / sdpa / KV-cache index_copy_)", \
            not _has(r"attn|attention|flash|sdpa", name)
    # MoE blocks (routing, experts)
    if _has(r"moe|experts?_|SparseMoe|fused_experts|router", mods) or region == "moe":
        if _has(r"silu|gelu|^aten::mul$|act_and_mul", op + " " + name) and region in (None, "moe", "activation"):
            if region == "activation" or _has(r"silu|gelu", op):
                return "activation", f"expert activation {op} inside the MoE block", True
        return "moe", f"op {op} in the MoE block (routing / dispatch / combine)", False
    if region == "activation":
        return "activation", f"{op} in the MLP (silu(gate) * up)", False
    # norm / rotary / activation / sampling modules and frames
    if _has(r"RMSNorm|LayerNorm|rms_norm|layernorm|\bNorm_|BatchNorm|GroupNorm", mods) or region == "norm":
        where = _last(mods, "RMSNorm|LayerNorm|Norm") or "RMSNorm sequence"
        return "norm", f"decomposed norm op {op} inside {where}", False
    if _has(r"apply_rotary|rotate_half|RotaryEmbedding|rotary", mods) or region == "rotary":
        where = _last(mods, "rotary|rotate_half|Rotary") or "RoPE sequence"
        return "rotary", f"decomposed RoPE op {op} in {where}", False
    if _has(r"Sampler|sampler\.py|sample_tokens|_sample\b|topk_topp|logits_processor|compute_logits", frames) or \
            region == "sampling":
        return "sampling", f"op {op} inside the sampler", not _has("argmax|sampl|gumbel|topk", name + op)
    if _has(r"MLP|FeedForward|\bFFN", mods) and _has(r"^aten::(mul|silu|gelu)$|act", op):
        return "activation", "gate*up multiply / activation inside MLP (GLU)", False
    if _has(r"nn\.Module: (Embedding|VocabParallelEmbedding)|vocab_parallel_embedding\.py.*forward|embed_tokens",
            mods) or _has(r"^aten::embedding", ops_text):
        return "embedding", f"op {op} inside the embedding lookup", False
    if _has(r"nn\.Module: \w*Attention|self_attn|attention\.py", mods) and _has(r"softmax", name + op):
        return "attention", "softmax inside attention module", False
    # the op's own meaning, then the name
    for o in reversed(ops):
        for pat, cat in OP_CATEGORY:
            if _has(pat, o):
                return cat, f"op {o}", False
    for pat, cat in NAME_CATEGORY:
        if _has(pat, name):
            return cat, "kernel/op name", False
    if w.kind == "cpu_op":
        return _cpu_generic(name)
    if op in (NO_OP, NO_RUNTIME) and w.graph:
        return "elementwise", "graph replay, no capture context", True
    layer_frame = _has(r"norm|rotary|rope|/attention/|attn", _frames(w))
    return "elementwise", f"generic elementwise/copy kernel ({op})" + (
        "; launched inside a norm/rotary/attention python frame (arguable)" if layer_frame else ""), layer_frame


VIEW_OPS = (r"^aten::(slice|as_strided|view|reshape|_reshape_alias|empty|empty_strided|empty_like|new_empty\w*|"
            r"select|t|transpose|permute|expand|expand_as|unsqueeze|squeeze|detach|detach_|alias|lift_fresh|"
            r"lift_fresh_copy|item|_local_scalar_dense|is_nonzero|chunk|split|split_with_sizes|unbind|narrow|"
            r"contiguous|resolve_conj|resolve_neg|flatten|unflatten|view_as|numpy_T|set_|resize_|_unsafe_view|"
            r"is_same_size|result_type|to|pin_memory|_pin_memory|record_stream|__getitem__|_has_compatible_\w*)$")


def _cpu_generic(name: str) -> tuple[str, str, bool]:
    if _has(VIEW_OPS, name):
        return "framework", f"tensor bookkeeping op {name} (no compute)", False
    if _has(r"Pregraph bytecode|AOTDispatcher|Torch-Compiled Region|TorchDynamo|Runtime Wrapper|"
            r"autograd::engine|CompiledFunction|profiler|record_function", name):
        return "framework", f"torch.compile / runtime wrapper ({name})", False
    if _has(r"CompiledFxGraph", name):
        return "elementwise", ("self time of the compiled graph: inductor's fused C++ kernels (RMSNorm, RoPE, "
                               "silu*mul, residual adds)"), True
    return "elementwise", f"generic CPU op {name}", True


def _last(text: str, pat: str) -> str:
    parts = [p.strip() for p in text.split("|") if re.search(pat, p, re.I)]
    if not parts:
        return ""
    return re.sub(r"^.*/", "", parts[-1].replace("nn.Module: ", ""))[:60]


# ----------------------------------------------------------------------------------------------------------
# Regions from the op sequence (eager traces recorded without modules/stack: the H200 skeleton captures).
# The top-level aten ops of an HF Qwen3 / Qwen3-MoE decoder layer come in a fixed order; the patterns below
# are that order, read from the traces (see `dump`).
# ----------------------------------------------------------------------------------------------------------

REGION_PATTERNS = [  # later patterns win where they overlap
    ("moe", r"softmax topk(?: \S+)*? view sum"),
    ("activation", r"silu linear mul|chunk silu mul"),
    ("norm", r"to pow mean add rsqrt mul to mul"),
    ("rotary", r"matmul transpose cat cos mul sin mul(?: to)*"),
    ("rotary", r"unsqueeze unsqueeze mul slice slice neg cat mul add mul slice slice neg cat mul add"),
    ("attention", r"arange add add_ index_copy_ index_copy_"),
    ("attention", r"(?:unsqueeze expand reshape ){2}scaled_dot_product_attention"),
    ("sampling", r"argmax"),
]


def regions(trace: Trace) -> dict[tuple, str]:
    """(thread, ts of a top-level cpu_op) -> region name, for traces without python frames."""
    out: dict[tuple, str] = {}
    for thread, host in trace.host.items():
        if any(e["cat"] == "python_function" for e in host):
            continue
        ops = sorted((e for e in host if e["cat"] == "cpu_op"), key=lambda e: (float(e["ts"]), -float(e["dur"])))
        top: list[dict[str, Any]] = []
        end = -1.0
        for e in ops:
            if float(e["ts"]) >= end:
                top.append(e)
                end = float(e["ts"]) + float(e["dur"])
        tokens = [e["name"].replace("aten::", "") for e in top]
        text = " ".join(tokens)
        starts = []
        pos = 0
        for tok in tokens:
            starts.append(pos)
            pos += len(tok) + 1
        label = [None] * len(tokens)
        for region, pat in REGION_PATTERNS:
            for m in re.finditer(r"(?<!\S)" + pat + r"(?!\S)", text):
                i = bisect.bisect_left(starts, m.start())
                j = bisect.bisect_left(starts, m.end())
                for k in range(i, j):
                    if region == "activation" and tokens[k] not in ("silu", "mul"):
                        continue
                    label[k] = region
        for e, lab in zip(top, label, strict=True):
            if lab:
                out[(thread, float(e["ts"]))] = lab
    return out


def region_of(w: Work, regs: dict[tuple, str]) -> str | None:
    tops = [ts for c, _, ts in w.stack if c == "cpu_op"]
    if w.kind == "cpu_op":
        tops.append(w.ts)
    if not tops:
        return None
    return regs.get((w.thread, tops[0]))


# ----------------------------------------------------------------------------------------------------------
# Labelling a trace: per event, then per name
# ----------------------------------------------------------------------------------------------------------

@dataclass
class Decision:
    category: str
    evidence: str
    arguable: bool


def decide_all(trace: Trace, ref: Trace | None = None) -> list[Decision]:
    regs = regions(trace)
    out: list[Decision | None] = []
    for w in trace.work:
        if w.kind != "cpu_op" and (w.launch is None or w.graph):
            out.append(None)  # decided below: graph replay / no runtime event
        else:
            out.append(Decision(*decide(w, region_of(w, regs))))
    # graph replays: align each graph's kernel sequence with the reference sequence (capture launches or an
    # eager decode step of the same model), position by position where names differ but the shape agrees
    pending = [i for i, d in enumerate(out) if d is None and trace.work[i].graph]
    if pending:
        refseq = _reference_sequence(trace, ref)
        by_corr: dict[Any, list[int]] = defaultdict(list)
        for i in pending:
            by_corr[trace.work[i].corr].append(i)
        for idxs in by_corr.values():
            idxs.sort(key=lambda i: trace.work[i].ts)
            _align(trace, idxs, refseq, out)
    # no runtime event: the dominant category of the same name where it was launched by an op
    dominant: dict[str, Counter] = defaultdict(Counter)
    for w, d in zip(trace.work, out, strict=True):
        if d is not None:
            dominant[w.name][d.category] += w.dur or 1e-9
    for i, d in enumerate(out):
        if d is None:
            w = trace.work[i]
            if dominant.get(w.name):
                cat = dominant[w.name].most_common(1)[0][0]
                split = len(dominant[w.name]) > 1
                out[i] = Decision(cat, "no runtime event; dominant category of this name", split)
            else:
                cat, ev, arg = decide(w)
                out[i] = Decision(cat, "no runtime event; " + ev, arg)
    return [d for d in out if d is not None]


def _reference_sequence(trace: Trace, ref: Trace | None) -> list[tuple[str, Decision]]:
    if ref is None:
        return []
    if ref.captured:
        seq = sorted(ref.captured, key=lambda w: w.ts)
        regs = regions(ref)
        return [(w.name, Decision(*decide(w, region_of(w, regs)))) for w in seq]
    # eager reference: its first decode step (vLLM-style annotation ..._generation_N(N) with context_0)
    decided = decide_all(ref)
    steps: dict[float, list[int]] = defaultdict(list)
    for i, w in enumerate(ref.work):
        for c, n, ts in w.stack:
            if c == "user_annotation" and n.startswith("execute_context_0(0)"):
                steps[ts].append(i)
                break
    if not steps:
        return []
    first = sorted(steps)[1] if len(steps) > 1 else sorted(steps)[0]
    idxs = sorted(steps[first], key=lambda i: ref.work[i].ts)
    return [(ref.work[i].name, decided[i]) for i in idxs]


def _align(trace: Trace, idxs: list[int], refseq: list[tuple[str, Decision]], out: list) -> None:
    import difflib
    names = [trace.work[i].name for i in idxs]
    rnames = [n for n, _ in refseq]
    sm = difflib.SequenceMatcher(None, names, rnames, autojunk=False)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        for k in range(i1, i2):
            w = trace.work[idxs[k]]
            if tag == "equal" or (tag == "replace" and i2 - i1 == j2 - j1):
                d = refseq[j1 + k - i1][1]
                how = "same kernel" if tag == "equal" else "same position, other kernel variant"
                out[idxs[k]] = Decision(d.category, f"graph replay; aligned to the reference ({how}): {d.evidence}",
                                        d.arguable or tag != "equal")
            else:
                same = Counter(d.category for n, d in refseq if n == w.name)
                if same:
                    out[idxs[k]] = Decision(same.most_common(1)[0][0],
                                            "graph replay; category of the same name in the reference", True)
                else:
                    cat, ev, _ = decide(w)
                    out[idxs[k]] = Decision(cat, "graph replay, not in the reference; " + ev, True)


def label(trace: Trace, ref: Trace | None = None) -> list[dict[str, Any]]:
    decisions = decide_all(trace, ref)
    groups: dict[str, dict[str, Any]] = {}
    for w, d in zip(trace.work, decisions, strict=True):
        g = groups.setdefault(w.name, {"name": w.name, "count": 0, "total_us": 0.0, "category_us": Counter(),
                                       "evidence": Counter(), "launch_op": Counter(), "arguable_us": 0.0})
        g["count"] += 1
        g["total_us"] += w.dur
        g["category_us"][d.category] += w.dur
        g["evidence"][d.evidence] += w.dur
        g["launch_op"][w.launch_op] += 1
        if d.arguable:
            g["arguable_us"] += w.dur
    rows = sorted(groups.values(), key=lambda g: -g["total_us"])
    total = sum(g["total_us"] for g in rows)
    acc = 0.0
    out = []
    for g in rows:
        top = acc < 0.95 * total
        acc += g["total_us"]
        row = {
            "name": g["name"], "count": g["count"], "total_us": round(g["total_us"], 3),
            "category_us": {c: round(v, 3) for c, v in g["category_us"].most_common()},
            "launch_op": dict(g["launch_op"].most_common(4)),
            "arguable_us": round(g["arguable_us"], 3),
        }
        if top:
            row["evidence"] = [e for e, _ in g["evidence"].most_common(3)]
        out.append(row)
    return out


# ----------------------------------------------------------------------------------------------------------
# Looking at a trace
# ----------------------------------------------------------------------------------------------------------

def _frame(cat: str, name: str) -> str:
    if cat == "python_function":
        name = re.sub(r"^.*/", "", name)
    return {"cpu_op": "op", "user_annotation": "ua", "python_function": "py"}[cat] + ":" + name[:70]


def context_signature(w: Work, depth: int = 5) -> str:
    frames = [_frame(c, n) for c, n, _ in w.stack if not (c == "python_function" and _boring_py(n))]
    return " > ".join(frames[-depth:])


def _boring_py(name: str) -> bool:
    return bool(re.search(r"torch/nn/modules/module\.py|_call_impl|_wrapped_call_impl|contextlib|"
                          r"torch/_ops\.py|<built-in|torch/utils/_contextlib|_compile\.py|eval_frame", name))


def dump(trace: Trace, limit: int = 60) -> None:
    by_name: dict[str, list[Work]] = defaultdict(list)
    for w in trace.work:
        by_name[w.name].append(w)
    total = sum(w.dur for w in trace.work)
    print(f"{trace.path.name}: {len(trace.work)} work events, {total:.1f} us, cpu_only={trace.cpu_only}, "
          f"captured launches={len(trace.captured)}")
    for name, ws in sorted(by_name.items(), key=lambda kv: -sum(w.dur for w in kv[1]))[:limit]:
        t = sum(w.dur for w in ws)
        print(f"\n{t:12.1f} {100 * t / total:5.1f}% n={len(ws):5d} {ws[0].kind} {name[:150]}")
        print("      ops:", dict(Counter(w.launch_op for w in ws).most_common(4)))
        for sig, n in Counter(context_signature(w) for w in ws).most_common(3):
            print(f"      {n:5d} {sig[-330:]}")


# ----------------------------------------------------------------------------------------------------------
# The traces and what they mark as steps
# ----------------------------------------------------------------------------------------------------------

STEP_RE = re.compile(r"^execute(?:_\d+)?_context_(\d+)\([^)]*\)_generation_(\d+)\([^)]*\)")


def expected_steps(trace: Trace) -> dict[str, Any] | None:
    ua = [e for e in trace.events if e.get("ph") == "X" and e.get("cat") == "user_annotation"]
    phases: Counter = Counter()
    for e in ua:
        m = STEP_RE.match(e["name"])
        if m:
            ctx, gen = int(m.group(1)), int(m.group(2))
            phases["empty" if ctx == gen == 0 else "prefill" if gen == 0 else "decode" if ctx == 0 else "mixed"] += 1
    if phases:
        return {"steps": sum(phases.values()), "phases": dict(phases),
                "basis": f"{sum(phases.values())} vLLM execute_context_X(Y)_generation_Z(W) user annotations"}
    prof = {e["name"] for e in ua if e["name"].startswith("ProfilerStep#")}
    if prof:
        return {"steps": len(prof), "phases": {},
                "basis": f"{len(prof)} ProfilerStep# annotations ({', '.join(sorted(prof)[:3])}...)"}
    return None


def targets() -> list[tuple[Path, Path | None]]:
    """(trace, reference) for every trace to label."""
    out: list[tuple[Path, Path | None]] = []
    tl = SHARED / "tracelens"
    for p in sorted(tl.glob("*.json.gz")):
        ref = None
        if "vllm_decode_full_graph_replay" in p.name:
            ref = tl / "vllm_decode_full_graph_capture_rank0.pt.trace.json.gz"
        elif "sglang_qwen3-8b_decode_graph_replay" in p.name:
            ref = tl / "sglang_qwen3-8b_decode_graph_capture_bs32.json.gz"
        out.append((p, ref))
    out += [(p, None) for p in sorted((SHARED / "hta").glob("*.json.gz"))]
    out += [(p, None) for p in sorted((SHARED / "vllm-cpu").glob("*.json.gz")) if ".async_llm." not in p.name]
    h200 = ROOT / "tests" / "data" / "h200"
    for p in sorted(h200.glob("*.pt.trace.json.gz")):
        ref = None
        if "_graphs_" in p.name:
            kind, batch = re.match(r"(dense|moe)_b(\d+)_", p.name).groups()
            eager = {1: 1, 4: 1, 16: 16, 32: 16, 64: 64, 128: 64}[int(batch)]
            ref = h200 / f"{kind}_b{eager}_rank0.pt.trace.json.gz"
        out.append((p, ref))
    # real vLLM 0.26 captures (tests/data/h200-vllm/<model>-<mode>-b<batch>/rank0...): a graphs capture replays
    # its kernels from CUDA graphs; its reference is the eager capture of the same model and batch
    vllm = ROOT / "tests" / "data" / "h200-vllm"
    for p in sorted(vllm.glob("*/rank*.pt.trace.json.gz")):
        ref = None
        for mode in ("-graphs-", "-admit-"):  # admit: CUDA graphs too, the window from the first step
            if mode in p.parent.name:
                ref = vllm / p.parent.name.replace(mode, "-eager-") / p.name
        out.append((p, ref))
    for p in sorted((ROOT / "src" / "servescope" / "data" / "examples").glob("*/*.pt.trace.json.gz")):
        if ".async_llm." in p.name:
            continue
        ref = None
        if p.parent.name == "h200-moe-b16-graphs":
            ref = ROOT / "tests/data/h200/moe_b16_rank0.pt.trace.json.gz"
        elif p.parent.name == "h200-vllm-moe-b16":  # tests/data/h200-vllm/moe-graphs-b16
            ref = vllm / "moe-eager-b16" / p.name
        out.append((p, ref))
    return out


def out_name(path: Path) -> str:
    stem = path.name.removesuffix(".gz").removesuffix(".json")
    if path.is_relative_to(ROOT / "src"):
        stem = f"example_{path.parent.name}_{stem}"
    elif path.is_relative_to(ROOT / "tests" / "data" / "h200-vllm"):
        stem = f"h200-vllm_{path.parent.name}_{stem}"
    return stem + ".labels.json"


def rel(path: Path) -> str:
    if path.is_relative_to(ROOT):
        return str(path.relative_to(ROOT))
    return "../shared/traces/" + str(path.relative_to(SHARED))


ABOUT = ("Independent labels (tools/label_traces.py, no servescope import): each work name of the trace with the "
         "time it spends in each category (servescope category names), decided from the runtime launch (by "
         "correlation id) and the cpu_op / user_annotation / python_function stack enclosing it on that thread, "
         "then the name; graph-replayed kernels from the matching capture or the eager run of the same model. "
         "CPU-only traces: every cpu_op (not ProfilerStep#) with its self time. 'evidence' for the names making "
         "95% of the time; 'arguable_us': time reasonable people could file elsewhere.")


def write(only: str | None) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    cache: dict[Path, Trace] = {}

    def get(p: Path) -> Trace:
        if p not in cache:
            cache[p] = read_trace(p)
        return cache[p]

    for path, ref in targets():
        if only and only not in str(path):
            continue
        trace = get(path)
        rows = label(trace, get(ref) if ref else None)
        total = sum(r["total_us"] for r in rows)
        share: Counter = Counter()
        for r in rows:
            for c, v in r["category_us"].items():
                share[c] += v
        doc: dict[str, Any] = {
            "about": ABOUT,
            "source": rel(path),
            "reference": rel(ref) if ref else None,
            "work": "cpu_op self time" if trace.cpu_only else "device (kernel, gpu_memcpy, gpu_memset)",
            "kernel_total_us": round(total, 3),
        }
        steps = expected_steps(trace)
        if steps and path.name in STEPS_UNSURE:
            steps = None
        if steps:
            doc["expected_steps"] = steps
        doc["category_share"] = {c: round(v / total, 5) if total else 0.0 for c, v in share.most_common()}
        doc["kernels"] = rows
        target = OUT / out_name(path)
        target.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"{target.relative_to(ROOT)}: {len(rows)} names, {total:.1f} us, "
              f"{dict((c, round(v, 3)) for c, v in list(doc['category_share'].items())[:6])}")


STEPS_UNSURE: set[str] = set()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("trace")
    d.add_argument("--limit", type=int, default=60)
    wr = sub.add_parser("write")
    wr.add_argument("--only")
    args = ap.parse_args(argv)
    if args.cmd == "write":
        write(args.only)
    if args.cmd == "dump":
        t = read_trace(Path(args.trace))
        dump(t, args.limit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
