"""The naive per-token reference of the ``moe`` feed-forward (:mod:`variantlab_plugins.moe`),
for the tests only. It reads the module's parameters and nothing else of it: the router, the
expert math (``F.linear`` with each expert's weight and bias, the activation, the gate
product), the shared FFN and its sigmoid gate, and the capacity formula are written out here
again, so a bug in the module's own ``expert_forward``, ``shared``, ``route`` or ``capacity``
cannot hide in both. Each token is routed on its own, each chosen expert applied to it alone,
and capacity is granted by walking the assignments in priority order: top-1 choices first,
in token order, then top-2, ... (GShard, Lepikhin et al. 2020). Slow and plain on purpose."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

Activation = Callable[[torch.Tensor], torch.Tensor]


def capacity_by_formula(capacity_factor: float | None, n_tokens: int, top_k: int,
                        n_experts: int) -> int | None:
    """ceil(capacity_factor * tokens * top_k / n_experts), at least 1 (docs/moe.md)."""
    if capacity_factor is None:
        return None
    return max(1, math.ceil(capacity_factor * n_tokens * top_k / n_experts))


def _expert(module: nn.Module, e: int, x: torch.Tensor, act: Activation) -> torch.Tensor:
    """Expert e on one token x (D,): W_down(act(W_gate x + b_gate) * (W_up x + b_up)) + b_down
    for glu experts, W_down act(W_up x + b_up) + b_down for mlp experts."""
    def bias(name: str) -> torch.Tensor | None:
        b = getattr(module, name)
        return None if b is None else b[e]

    up = F.linear(x, module.W_up[e], bias("b_up"))  # (H,)
    if module.W_gate is not None:
        hidden = act(F.linear(x, module.W_gate[e], bias("b_gate"))) * up
    else:
        hidden = act(up)
    return F.linear(hidden, module.W_down[e], bias("b_down"))  # (D,)


def shared_ffn(module: nn.Module, x: torch.Tensor, act: Activation) -> torch.Tensor | None:
    """The shared FFN on one token x (D,), times sigmoid(w . x) when gated (Qwen2-MoE)."""
    ffn = module.shared_expert
    if ffn is None:
        return None
    if hasattr(ffn, "W_gate"):  # glu: three Linear layers by name
        hidden = act(F.linear(x, ffn.W_gate.weight, ffn.W_gate.bias)) \
            * F.linear(x, ffn.W_up.weight, ffn.W_up.bias)
        out = F.linear(hidden, ffn.W_down.weight, ffn.W_down.bias)
    else:  # mlp: Sequential(Linear, activation, Linear)
        first, last = ffn.layers[0], ffn.layers[2]
        out = F.linear(act(F.linear(x, first.weight, first.bias)), last.weight, last.bias)
    if module.shared_expert_gate is not None:
        out = torch.sigmoid(torch.dot(module.shared_expert_gate.weight[0], x)) * out
    return out


def moe_reference(module: nn.Module, x: torch.Tensor, act: Activation = F.silu) -> torch.Tensor:
    """``module``'s output for x (B, T, D), token by token, with activation ``act``."""
    spec = module.spec
    flat = x.reshape(-1, x.shape[-1])  # (N, D)
    n = flat.shape[0]
    bias = getattr(module, "expert_bias", None)
    routes = []
    for t in range(n):
        logits = module.gate.weight @ flat[t]  # (E,)
        probs = torch.exp(logits - logits.max())
        probs = probs / probs.sum()
        scores = (probs if spec.router == "softmax_topk" else logits).detach().tolist()
        if bias is not None:
            scores = [s + float(b) for s, b in zip(scores, bias)]
        order = sorted(range(len(scores)), key=lambda i: -scores[i])  # stable: ties by index
        chosen = order[:spec.top_k]
        if spec.router == "topk_softmax":
            picked = torch.stack([logits[i] for i in chosen])
            weights = torch.exp(picked - picked.max())
            weights = weights / weights.sum()
        else:
            weights = torch.stack([probs[i] for i in chosen])
            if spec.renormalize:
                weights = weights / weights.sum()
        routes.append((chosen, weights))
    cap = capacity_by_formula(spec.capacity_factor, n, spec.top_k, spec.n_experts)
    used = [0] * spec.n_experts
    kept = [[False] * spec.top_k for _ in range(n)]
    for j in range(spec.top_k):
        for t in range(n):
            e = routes[t][0][j]
            if cap is None or used[e] < cap:
                used[e] += 1
                kept[t][j] = True
    rows = []
    for t in range(n):
        out = torch.zeros_like(flat[t])
        for j, e in enumerate(routes[t][0]):
            if kept[t][j]:
                out = out + routes[t][1][j] * _expert(module, e, flat[t], act)
        shared = shared_ffn(module, flat[t], act)
        if shared is not None:
            out = out + shared
        rows.append(out)
    return torch.stack(rows).reshape(x.shape)


def dropped_by_formula(module: nn.Module, x: torch.Tensor) -> tuple[list[int], float]:
    """``(assignments per expert, dropped share)`` for x (B, T, D): the router's top-k counts
    (from the gate weight and expert bias), each capped at the formula's capacity."""
    spec = module.spec
    flat = x.reshape(-1, x.shape[-1]).detach()  # (N, D)
    n = flat.shape[0]
    logits = flat @ module.gate.weight.detach().t()  # (N, E)
    scores = logits.softmax(-1) if spec.router == "softmax_topk" else logits
    if getattr(module, "expert_bias", None) is not None:
        scores = scores + module.expert_bias
    counts = [0] * spec.n_experts
    for row in scores.tolist():
        for e in sorted(range(spec.n_experts), key=lambda i: -row[i])[:spec.top_k]:
            counts[e] += 1
    cap = capacity_by_formula(spec.capacity_factor, n, spec.top_k, spec.n_experts)
    kept = sum(c if cap is None else min(c, cap) for c in counts)
    return counts, 1 - kept / (n * spec.top_k)
