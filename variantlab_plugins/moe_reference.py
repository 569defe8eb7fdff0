"""The naive per-token reference of the ``moe`` feed-forward (:mod:`variantlab_plugins.moe`):
each token routed on its own, each chosen expert applied to it alone, capacity granted by
walking the assignments in priority order (top-1 choices first, in token order; GShard,
Lepikhin et al. 2020). Slow and plain on purpose; the tests hold the grouped dispatch equal
to it (outputs and gradients, float64) for every routing option."""

from __future__ import annotations

import torch

from variantlab_plugins.moe import MoE, capacity


def moe_reference(module: MoE, x: torch.Tensor) -> torch.Tensor:
    """``module``'s output for x (B, T, D), token by token."""
    spec = module.spec
    flat = x.reshape(-1, x.shape[-1])  # (N, D)
    n = flat.shape[0]
    routes = []
    for t in range(n):
        logits = module.gate(flat[t])  # (E,)
        probs = torch.softmax(logits, -1)
        scores = probs if spec.router == "softmax_topk" else logits
        if module.expert_bias is not None:
            scores = scores + module.expert_bias
        chosen = [int(i) for i in torch.topk(scores, spec.top_k).indices]
        if spec.router == "topk_softmax":
            weights = torch.softmax(torch.stack([logits[i] for i in chosen]), -1)
        else:
            weights = torch.stack([probs[i] for i in chosen])
            if spec.renormalize:
                weights = weights / weights.sum()
        routes.append((chosen, weights))
    cap = capacity(spec, n)
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
                out = out + routes[t][1][j] * module.expert_forward(e, flat[t:t + 1])[0]
        shared = module.shared(flat[t:t + 1])
        if shared is not None:
            out = out + shared[0]
        rows.append(out)
    return torch.stack(rows).reshape(x.shape)
