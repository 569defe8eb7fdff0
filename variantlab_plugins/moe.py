"""Mixture-of-experts feed-forward: ``feedforward: {kind: moe, ...}``.

A router (``gate``, a Linear emb_dim -> n_experts without bias) scores the experts for each
token; each token goes to ``top_k`` of them and the output is the weighted sum of their
outputs (Shazeer et al. 2017; Switch, Fedus et al. 2021; Mixtral, Jiang et al. 2024), plus
optional shared experts every token goes through (Qwen2-MoE; DeepSeekMoE, Dai et al. 2024),
optionally scaled by a sigmoid gate (Qwen2-MoE's ``shared_expert_gate``).

Routing (what the Hugging Face families do):

- ``softmax_topk``: softmax over all experts, then the top-k probabilities as weights,
  divided by their sum when ``renormalize`` (Mixtral; Qwen3-MoE's ``norm_topk_prob``; OLMoE
  leaves them as they are);
- ``topk_softmax``: the top-k logits, then a softmax over those alone (Switch-style top-k);
- ``sigmoid_topk``: a sigmoid per expert, the top-k of those as weights, divided by their sum
  when ``renormalize`` (DeepSeek-V3, DeepSeek-AI 2024, eq. 13-15); the balancing loss and
  router entropy read the sigmoid scores normalised to sum 1 (V3's eq. 19).

Options for every router (DeepSeek-V2/V3): ``n_group`` / ``topk_group`` limit each token to
the experts of its ``topk_group`` best groups of ``n_experts / n_group`` (a group's score its
best expert's, ``group_score: max``, V2's ``group_limited_greedy``, or the sum of its two best,
``top2_sum``, V3); ``routed_scaling_factor`` multiplies the routed experts' weights;
``choice_bias`` keeps the per-expert choice bias below without updating it (an imported
DeepSeek-V3's ``e_score_correction_bias``).
``scale_input`` (Llama 4) multiplies a chosen expert's input by the weight and adds its
output as it is.

Balancing: the load-balancing loss ``n_experts * sum_e f_e * P_e`` (Switch eq. 4-6, as
transformers' ``load_balancing_loss_func``: f_e the routing assignments to e per token, which
sum to top_k, P_e the mean router probability), the router z-loss ``mean_t
logsumexp(logits_t)^2`` (ST-MoE, Zoph et al. 2022), each with a coefficient in the training
objective; and aux-loss-free balancing (DeepSeek-V3; Wang et al. 2024): a per-expert bias,
a buffer, added to the routing scores for choosing experts only, moved after each optimizer
step by ``bias_update_rate * sign(mean load - load_e)``. ``capacity_factor`` caps each
expert at ``ceil(capacity_factor * tokens * top_k / n_experts)`` assignments; the rest are
dropped (top-1 choices first, then top-2 ..., each in token order: GShard, Lepikhin et al.
2020) and counted.

Dispatch: the (token, choice) assignments are sorted by expert (a stable sort), so each
expert reads one contiguous slice and runs two or three matmuls on it; a loop over experts,
none over tokens. ``tests/moe_reference.py`` computes the same per token, independently.

Parameters (stacked per expert, as transformers 5.x stores experts fused):
``gate.weight`` (n_experts, emb_dim); ``W_gate``, ``W_up`` (n_experts, hidden, emb_dim)
(HF ``gate_up_proj`` is their concatenation on dim 1; ``mlp`` experts have no ``W_gate``);
``W_down`` (n_experts, emb_dim, hidden); ``b_gate``, ``b_up`` (n_experts, hidden), ``b_down``
(n_experts, emb_dim) with ``bias``; ``shared_expert`` (a ``glu``/``mlp`` feed-forward) and
``shared_expert_gate`` (Linear emb_dim -> 1); buffer ``expert_bias`` (n_experts) with
``bias_update_rate`` > 0.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import (
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    model_serializer,
    model_validator,
)
from torch import nn

from variantlab import ComponentSpec, hookimpl
from variantlab.model.specs import omit_added_defaults
from variantlab.plugin.settings import Strict
from variantlab_plugins.feedforwards import GLU, MLP


class ExpertSpec(Strict):
    """One expert: a ``glu`` (gated, SwiGLU with silu), an ``mlp`` feed-forward, or gpt-oss's
    ``clamped_swiglu``: (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g) with
    g = min(gate, limit) (OpenAI 2025, gpt-oss model card; the model's activation unused)."""

    #: options added after the first release: left out of the data at their defaults
    added_options: ClassVar[tuple[str, ...]] = ("alpha", "limit")
    kind: Literal["glu", "mlp", "clamped_swiglu"] = Field(
        "glu", description="glu (gated), mlp, or clamped_swiglu (gpt-oss)")
    hidden_mult: PositiveFloat | None = Field(
        None, description="expert width = hidden_mult * emb_dim (default 8/3 glu, 4 mlp)")
    hidden_dim: PositiveInt | None = Field(
        None, description="expert width; overrides hidden_mult when set")
    bias: bool = Field(False, description="biases in the experts' projections")
    alpha: PositiveFloat = Field(
        1.702, description="clamped_swiglu: the sigmoid's slope (gpt-oss swiglu_alpha)")
    limit: PositiveFloat = Field(
        7.0, description="clamped_swiglu: gate clamped above, up clamped to +-limit "
        "(gpt-oss swiglu_limit)")

    @model_serializer(mode="wrap")
    def _omit_added_defaults(self, handler: Any) -> Any:
        return omit_added_defaults(self, handler(self))

    def hidden(self, emb_dim: int) -> int:
        mult = self.hidden_mult or (4.0 if self.kind == "mlp" else 8 / 3)
        return self.hidden_dim or max(1, round(mult * emb_dim))


class MoESpec(ComponentSpec):
    """Routed mixture of experts (Shazeer et al. 2017; Fedus et al. 2021; Jiang et al. 2024)."""

    kind: Literal["moe"] = "moe"
    added_options: ClassVar[tuple[str, ...]] = (
        "n_group", "topk_group", "group_score", "routed_scaling_factor", "choice_bias",
        "router_bias", "scale_input")
    walk_examples: ClassVar[tuple[dict, ...]] = (  # tests/test_registry_walk.py tries these
        {"kind": "moe", "n_experts": 4, "top_k": 2, "router": "topk_softmax",
         "n_shared_experts": 1, "shared_gate": True, "expert": {"kind": "mlp", "bias": True}},
        {"kind": "moe", "n_experts": 4, "top_k": 1, "aux_loss_coef": 0.01, "z_loss_coef": 0.001,
         "bias_update_rate": 0.001, "capacity_factor": 1.0, "renormalize": False,
         "router_bias": True, "scale_input": True, "expert": {"kind": "clamped_swiglu"}},
        {"kind": "moe", "n_experts": 8, "top_k": 2, "router": "sigmoid_topk", "n_group": 4,
         "topk_group": 2, "group_score": "top2_sum", "routed_scaling_factor": 2.5,
         "choice_bias": True, "n_shared_experts": 1},
    )
    n_experts: int = Field(8, description="routed experts (at least 1)")
    top_k: int = Field(2, description="experts per token (1 .. n_experts)")
    expert: ExpertSpec = Field(ExpertSpec.model_validate({}), description="each expert's FFN")
    router: Literal["softmax_topk", "topk_softmax", "sigmoid_topk"] = Field(
        "softmax_topk", description="softmax_topk: softmax over all, then top-k (Mixtral, "
        "Qwen3-MoE, OLMoE); topk_softmax: top-k logits, then softmax over them; "
        "sigmoid_topk: a sigmoid per expert, then top-k (DeepSeek-V3)")
    renormalize: bool = Field(
        True, description="softmax_topk: divide the chosen weights by their sum (Mixtral, "
        "Qwen3-MoE norm_topk_prob; OLMoE: false)")
    n_shared_experts: NonNegativeInt = Field(
        0, description="shared experts every token goes through (one FFN of their total width)")
    shared_hidden_dim: PositiveInt | None = Field(
        None, description="the shared FFN's width (default n_shared_experts x expert width)")
    shared_gate: bool = Field(
        False, description="scale the shared FFN by sigmoid(Linear(x)) (Qwen2-MoE)")
    aux_loss_coef: NonNegativeFloat = Field(
        0.0, description="weight of the load-balancing loss (Switch / Mixtral form)")
    z_loss_coef: NonNegativeFloat = Field(
        0.0, description="weight of the router z-loss (ST-MoE)")
    bias_update_rate: NonNegativeFloat = Field(
        0.0, description="aux-loss-free balancing (DeepSeek-V3): per-expert bias step; 0 off")
    capacity_factor: PositiveFloat | None = Field(
        None, description="cap per expert: capacity_factor * tokens * top_k / n_experts")
    n_group: PositiveInt | None = Field(
        None, description="group-limited routing (DeepSeek-V2/V3): the experts in n_group "
        "equal groups, each token choosing among its topk_group best groups; unset: none")
    topk_group: PositiveInt | None = Field(
        None, description="groups a token may route to (with n_group)")
    group_score: Literal["max", "top2_sum"] = Field(
        "max", description="a group's score: its best expert's (DeepSeek-V2) or the sum of "
        "its two best (DeepSeek-V3), choice bias included")
    routed_scaling_factor: PositiveFloat = Field(
        1.0, description="multiplies the routed experts' weights (DeepSeek-V2/V3)")
    scale_input: bool = Field(
        False, description="a chosen expert reads weight * x and its output is added as it "
        "is (Llama 4), instead of weight * expert(x)")
    router_bias: bool = Field(
        False, description="a bias in the router's Linear (gpt-oss)")
    choice_bias: bool = Field(
        False, description="a per-expert bias buffer added to the scores for choosing only, "
        "kept even without bias_update_rate (an imported DeepSeek-V3's "
        "e_score_correction_bias)")

    @model_validator(mode="after")
    def _sizes(self) -> MoESpec:
        if self.n_experts < 1:
            raise ValueError(f"n_experts must be at least 1, got {self.n_experts}")
        if self.top_k < 1:
            raise ValueError(f"top_k must be at least 1, got {self.top_k}")
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k ({self.top_k}) must not exceed n_experts "
                             f"({self.n_experts})")
        if (self.shared_gate or self.shared_hidden_dim) and not self.n_shared_experts:
            raise ValueError("shared_gate and shared_hidden_dim need n_shared_experts >= 1")
        if self.expert.kind == "clamped_swiglu" and self.n_shared_experts:
            raise ValueError("shared experts are glu or mlp feed-forwards; clamped_swiglu "
                             "experts take n_shared_experts: 0")
        if (self.n_group is None) != (self.topk_group is None):
            raise ValueError("n_group and topk_group go together: set both or neither")
        if self.n_group is not None and self.topk_group is not None:
            size = self.n_experts // self.n_group
            if self.n_experts % self.n_group:
                raise ValueError(f"n_group={self.n_group} does not divide n_experts="
                                 f"{self.n_experts}")
            if self.topk_group > self.n_group:
                raise ValueError(f"topk_group ({self.topk_group}) must not exceed n_group "
                                 f"({self.n_group})")
            if self.top_k > self.topk_group * size:
                raise ValueError(f"top_k ({self.top_k}) exceeds the experts of topk_group="
                                 f"{self.topk_group} groups of {size}")
            if self.group_score == "top2_sum" and size < 2:
                raise ValueError("group_score top2_sum needs groups of at least 2 experts")
        return self


def route(logits: torch.Tensor, spec: MoESpec, bias: torch.Tensor | None,
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(probs (N, E), weights (N, k), experts (N, k))`` from router logits (N, E): the
    softmax over all experts, and each token's chosen experts with their weights. ``bias``
    (E) is added to the scores for choosing only (aux-loss-free balancing)."""
    sigmoid = spec.router == "sigmoid_topk"
    probs = logits.sigmoid() if sigmoid else logits.softmax(-1)  # (N, E)
    scores = logits if spec.router == "topk_softmax" else probs
    choice = scores if bias is None else scores + bias
    if spec.n_group is not None:
        choice = limit_groups(choice, spec)
    chosen = choice.topk(spec.top_k, dim=-1).indices
    if spec.router == "topk_softmax":
        weights = logits.gather(-1, chosen).softmax(-1)
    else:
        weights = probs.gather(-1, chosen)  # (N, k)
        if spec.renormalize:
            weights = weights / weights.sum(-1, keepdim=True)
    if spec.routed_scaling_factor != 1.0:
        weights = weights * spec.routed_scaling_factor
    if sigmoid:  # the statistics read a distribution over experts
        probs = probs / probs.sum(-1, keepdim=True)
    return probs, weights, chosen


def limit_groups(choice: torch.Tensor, spec: MoESpec) -> torch.Tensor:
    """The choice scores (N, E) with every expert outside the token's ``topk_group`` best
    groups set to -inf (DeepSeek-V2's group-limited greedy, V3's node-limited routing)."""
    assert spec.n_group is not None and spec.topk_group is not None
    n = choice.shape[0]
    grouped = choice.view(n, spec.n_group, -1)  # (N, G, E / G)
    if spec.group_score == "max":
        group = grouped.max(-1).values  # (N, G)
    else:
        group = grouped.topk(2, dim=-1).values.sum(-1)  # (N, G)
    best = group.topk(spec.topk_group, dim=-1).indices  # (N, topk_group)
    keep = torch.zeros_like(group, dtype=torch.bool).scatter(1, best, True)  # (N, G)
    return grouped.masked_fill(~keep[..., None], -torch.inf).view(n, -1)  # (N, E)


def capacity(spec: MoESpec, n_tokens: int) -> int | None:
    """Assignments an expert takes at most, or None without a capacity factor."""
    if spec.capacity_factor is None:
        return None
    return max(1, math.ceil(spec.capacity_factor * n_tokens * spec.top_k / spec.n_experts))


def dispatch(experts: torch.Tensor, n_experts: int, cap: int | None,
             ) -> tuple[torch.Tensor, list[int], torch.Tensor]:
    """``(kept assignments grouped by expert (A,), kept per expert, chosen per expert (E,))``
    from each assignment's expert (k*N,) in priority order: a stable sort by expert, then the
    first ``cap`` of each expert's run. On the meta device (the size guard's estimate, no
    data) a balanced dispatch stands in: the same number of assignments for every expert."""
    if experts.is_meta:
        total = experts.numel()
        sizes = [total // n_experts + (e < total % n_experts) for e in range(n_experts)]
        if cap is not None:
            sizes = [min(c, cap) for c in sizes]
        keep = torch.arange(sum(sizes), device=experts.device)  # (A,)
        return keep, sizes, torch.full((n_experts,), total // n_experts, device=experts.device)
    order = torch.sort(experts, stable=True).indices  # (k*N,) grouped by expert
    counts = torch.bincount(experts, minlength=n_experts)  # (E,)
    if cap is None:
        return order, counts.tolist(), counts
    starts = torch.cumsum(counts, 0) - counts  # (E,) first position of each expert's run
    rank = torch.arange(order.numel(), device=experts.device) - starts[experts[order]]
    return order[rank < cap], counts.clamp(max=cap).tolist(), counts  # (A,)


class MoE(nn.Module):
    """Top-k routed experts with stacked weights, grouped dispatch and balancing terms."""

    def __init__(self, spec: MoESpec, emb_dim: int, make_activation: Any) -> None:
        super().__init__()
        self.spec = spec
        e, d, h = spec.n_experts, emb_dim, spec.expert.hidden(emb_dim)
        self.emb_dim, self.hidden, self.glu = d, h, spec.expert.kind != "mlp"
        self.clamped = spec.expert.kind == "clamped_swiglu"
        self.gate = nn.Linear(d, e, bias=spec.router_bias)
        self.W_gate = nn.Parameter(torch.empty(e, h, d)) if self.glu else None
        self.W_up = nn.Parameter(torch.empty(e, h, d))
        self.W_down = nn.Parameter(torch.empty(e, d, h))
        has_bias = spec.expert.bias
        self.b_gate = nn.Parameter(torch.empty(e, h)) if has_bias and self.glu else None
        self.b_up = nn.Parameter(torch.empty(e, h)) if has_bias else None
        self.b_down = nn.Parameter(torch.empty(e, d)) if has_bias else None
        self.activation = make_activation()
        self.shared_expert: nn.Module | None = None
        self.shared_expert_gate: nn.Linear | None = None
        if spec.n_shared_experts:
            width = spec.shared_hidden_dim or spec.n_shared_experts * h
            ffn = GLU if self.glu else MLP
            self.shared_expert = ffn(d, width, make_activation(), has_bias)
            if spec.shared_gate:
                self.shared_expert_gate = nn.Linear(d, 1, bias=False)
        if spec.bias_update_rate > 0 or spec.choice_bias:
            self.register_buffer("expert_bias", torch.zeros(e))
        else:
            self.expert_bias = None
        # roles of the stacked projections, for the inits (variantlab.model.roles)
        self.variantlab_stacked = [(n, r) for n, r in (
            ("W_gate", "ffn_gate"), ("W_up", "ffn_in"), ("W_down", "ffn_out"))
            if getattr(self, n) is not None]
        self._last: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int] | None = None
        self._terms: dict[str, torch.Tensor] = {}
        self._stats: dict[str, Any] = {}
        self._pending_load: torch.Tensor | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Each expert as a fresh nn.Linear: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
        for w, b in ((self.W_gate, self.b_gate), (self.W_up, self.b_up),
                     (self.W_down, self.b_down)):
            if w is None:
                continue
            bound = 1.0 / math.sqrt(w.shape[-1])
            nn.init.uniform_(w, -bound, bound)
            if b is not None:
                nn.init.uniform_(b, -bound, bound)

    def expert_params(self) -> int:
        """Parameters of one routed expert."""
        return sum(p[0].numel() for p in (self.W_gate, self.W_up, self.W_down, self.b_gate,
                                          self.b_up, self.b_down) if p is not None)

    def inactive_params(self) -> int:
        """The routed experts a token does not use: (n_experts - top_k) experts."""
        return (self.spec.n_experts - self.spec.top_k) * self.expert_params()

    def expert_forward(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert ``e`` on tokens (n, D) -> (n, D)."""
        def proj(w: torch.Tensor | None, b: torch.Tensor | None, inp: torch.Tensor):
            assert w is not None
            return F.linear(inp, w[e], None if b is None else b[e])

        up = proj(self.W_up, self.b_up, x)  # (n, H)
        if self.clamped:
            limit, alpha = self.spec.expert.limit, self.spec.expert.alpha
            g = proj(self.W_gate, self.b_gate, x).clamp(max=limit)  # (n, H)
            hid = (up.clamp(-limit, limit) + 1) * g * torch.sigmoid(alpha * g)
        elif self.glu:
            hid = self.activation(proj(self.W_gate, self.b_gate, x)) * up
        else:
            hid = self.activation(up)
        return proj(self.W_down, self.b_down, hid)  # (n, D)

    def shared(self, x: torch.Tensor) -> torch.Tensor | None:
        """The shared experts' output (N, D), gated when ``shared_gate``; None without them."""
        if self.shared_expert is None:
            return None
        out = self.shared_expert(x)  # (N, D)
        if self.shared_expert_gate is not None:
            out = torch.sigmoid(self.shared_expert_gate(x)) * out
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, D)
        spec, shape = self.spec, x.shape
        flat = x.reshape(-1, shape[-1])  # (N, D)
        n = flat.shape[0]
        logits = self.gate(flat)  # (N, E)
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()  # routing in float32, as transformers does
        probs, weights, chosen = route(logits, spec, self.expert_bias)
        # assignments a = choice * N + token (top-1 choices first, then top-2, ...)
        experts = chosen.t().reshape(-1)  # (k*N,)
        keep, sizes, counts = dispatch(experts, spec.n_experts, capacity(spec, n))
        tokens = keep % n  # (A,) token of each kept assignment, grouped by expert
        w = weights.t().reshape(-1)[keep].to(flat.dtype)  # (A,)
        xs = flat[tokens]  # (A, D)
        if spec.scale_input:  # Llama 4: the weight scales the expert's input, not its output
            xs, w = xs * w[:, None], torch.ones_like(w)
        pieces = []
        start = 0
        for e, c in enumerate(sizes):
            if c:
                pieces.append(self.expert_forward(e, xs[start:start + c]))
            start += c
        out = torch.zeros_like(flat)  # (N, D)
        if pieces:
            out = out.index_add(0, tokens, torch.cat(pieces) * w[:, None])
        extra = self.shared(flat)
        if extra is not None:
            out = out + extra
        self._record(logits, probs, counts, n, spec.top_k * n - sum(sizes))
        return out.reshape(shape)

    def _record(self, logits: torch.Tensor, probs: torch.Tensor, counts: torch.Tensor,
                n: int, dropped: int) -> None:
        """Keep what the last forward's balancing terms and statistics are computed from;
        they are computed when asked for (not in every forward: timing and plain inference
        never ask)."""
        self._last = (logits, probs, counts, n, dropped)
        self._terms, self._stats = {}, {}
        if self.training and self.expert_bias is not None:
            self._pending_load = counts.detach().float()

    def aux_terms(self) -> dict[str, torch.Tensor]:
        """The last forward's load-balancing loss and router z-loss (with gradients)."""
        if not self._terms and self._last is not None:
            logits, probs, counts, n, _ = self._last
            f = counts.to(probs.dtype) / n  # (E,) assignments per token; sums to top_k
            self._terms = {
                "aux_loss": self.spec.n_experts * (f * probs.mean(0)).sum(),
                "z_loss": torch.logsumexp(logits, -1).pow(2).mean(),
            }
        return self._terms

    def aux_weights(self) -> dict[str, float]:
        return {"aux_loss": self.spec.aux_loss_coef, "z_loss": self.spec.z_loss_coef}

    def routing_stats(self) -> dict[str, Any]:
        """The last forward's expert load, router entropy and dropped share (detached)."""
        if not self._stats and self._last is not None:
            _, probs, counts, n, dropped = self._last
            k = self.spec.top_k
            with torch.no_grad():
                p = probs.detach()
                entropy = -(p * p.clamp_min(1e-30).log()).sum(-1).mean()
            self._stats = {"load": (counts.float() / (n * k)).detach(),
                           "router_entropy": entropy,
                           "dropped_fraction": dropped / (n * k),
                           "capacity": self.spec.capacity_factor is not None}
        return self._stats

    @torch.no_grad()
    def after_step(self) -> None:
        """Aux-loss-free balancing: bias_e += rate * sign(mean load - load_e)."""
        if self.expert_bias is None or self._pending_load is None:
            return
        load = self._pending_load
        self.expert_bias += self.spec.bias_update_rate * torch.sign(load.mean() - load)
        self._pending_load = None


@hookimpl
def register_feedforwards(register):
    register("moe", MoESpec, MoE)
