"""Mixture-of-experts classes: ``MixtralForCausalLM``, ``Qwen3MoeForCausalLM`` and
``OlmoeForCausalLM``, each a Llama-like model whose feed-forward is ``feedforward: {kind: moe}``
(variantlab_plugins/moe.py), and the expert mapping Qwen3-Next and Jamba share.

Routing in all five (transformers 5.x ``*TopKRouter``): softmax over all experts of the
router logits ``gate(x)``, the top ``num_experts_per_tok`` probabilities as weights
(``router: softmax_topk``), divided by their sum in Mixtral always, in Qwen3-MoE, OLMoE and
Qwen3-Next when ``norm_topk_prob`` (``renormalize``), never in Jamba. The experts are stored fused, as
``experts.gate_up_proj`` (E, 2 x hidden, D), the gate rows first, and ``experts.down_proj``
(E, D, hidden): split into our stacked ``W_gate``, ``W_up`` and ``W_down``. Qwen3-MoE and
Qwen3-Next keep a dense SwiGLU on layers in ``mlp_only_layers`` and off the
``decoder_sparse_step`` (a ``layout`` with a ``dense`` layer kind).
"""

from __future__ import annotations

from typing import Any

import torch

from . import table
from .common import period, reject
from .llama import MLP, llama_spec, llama_state, mistral_spec, olmo2_spec, qk_norms
from .table import load_state


def moe_feedforward(cfg: Any, hidden: int, renormalize: bool,
                    shared_hidden: int | None = None) -> dict[str, Any]:
    """The ``moe`` spec of a transformers MoE config: ``hidden`` is each expert's width;
    ``shared_hidden`` the width of a sigmoid-gated shared expert (Qwen3-Next). The
    load-balancing coefficient is ``router_aux_loss_coef`` where transformers adds that loss
    (``output_router_logits``), else 0."""
    n_experts = getattr(cfg, "num_local_experts", None) or cfg.num_experts
    coef = float(cfg.router_aux_loss_coef) if getattr(cfg, "output_router_logits", False) else 0.0
    data: dict[str, Any] = {
        "kind": "moe", "n_experts": int(n_experts), "top_k": int(cfg.num_experts_per_tok),
        "expert": {"kind": "glu", "hidden_dim": int(hidden)}, "router": "softmax_topk",
        "renormalize": bool(renormalize), "aux_loss_coef": coef}
    if shared_hidden:
        data.update(n_shared_experts=1, shared_hidden_dim=int(shared_hidden), shared_gate=True)
    return data


def sparse_layers(cfg: Any) -> list[bool]:
    """Which layers have the MoE feed-forward (Qwen3-MoE / Qwen3-Next's rule: not in
    ``mlp_only_layers``, ``num_experts > 0`` and ``(i + 1) % decoder_sparse_step == 0``)."""
    only = set(getattr(cfg, "mlp_only_layers", None) or [])
    step = getattr(cfg, "decoder_sparse_step", 1) or 1
    return [i not in only and cfg.num_experts > 0 and (i + 1) % step == 0
            for i in range(cfg.num_hidden_layers)]


def with_dense_layers(data: dict[str, Any], cfg: Any, moe: dict[str, Any]) -> dict[str, Any]:
    """``data`` (whose feed-forward is the dense SwiGLU) with ``moe`` as the model's feed-
    forward when every layer is sparse, none when none is, else a layout of ``moe`` and
    ``dense`` layer kinds (the dense one keeps the SwiGLU of width ``intermediate_size``)."""
    sparse = sparse_layers(cfg)
    if not any(sparse):
        return data
    dense = data["feedforward"]
    data["feedforward"] = moe
    if not all(sparse):
        kinds = ["moe" if s else "dense" for s in sparse]
        data["layout"] = {"kinds": {"moe": {}, "dense": {"feedforward": dense}},
                          "pattern": period(kinds)}
    return data


def hybrid_layout(mixers: list[str], mixer_slots: dict[str, dict[str, Any]],
                  sparse: list[bool], dense: dict[str, Any]) -> dict[str, Any] | None:
    """The layout of a hybrid whose layers differ by mixer (``mixers``: each layer's mixer
    kind name, ``mixer_slots``: its slot overrides) and by feed-forward (``sparse``: each
    layer's; the model's own is the MoE when any layer is sparse). With both sparse and dense
    layers, a dense layer's kind is its mixer's name plus ``_dense``, overriding the
    feed-forward with ``dense``. None when every layer is the model itself."""
    mixed = any(sparse) and not all(sparse)
    names = [m + ("_dense" if mixed and not s else "") for m, s in zip(mixers, sparse)]
    kinds: dict[str, dict[str, Any]] = {}
    for name, mixer in zip(names, mixers):
        slots = dict(mixer_slots.get(mixer, {}))
        if name.endswith("_dense"):
            slots["feedforward"] = dense
        kinds[name] = slots
    if not any(kinds.values()):
        return None
    return {"kinds": kinds, "pattern": period(names)}


def experts_state(out: dict[str, torch.Tensor], ours: str, sd: dict[str, torch.Tensor],
                  theirs: str, router: str = "gate") -> None:
    """Copy a transformers sparse MoE block at ``theirs`` (``...mlp``) into our ``moe``
    feed-forward at ``ours``: router (HF's ``router``: ``gate``, Jamba's ``router``), fused
    experts split, shared expert and its gate."""
    out[f"{ours}.gate.weight"] = sd[f"{theirs}.{router}.weight"]
    fused_experts(out, ours, sd, f"{theirs}.experts")
    if f"{theirs}.shared_expert.gate_proj.weight" in sd:
        for mine, name in MLP.items():
            out[f"{ours}.shared_expert.{mine}.weight"] = sd[f"{theirs}.shared_expert.{name}.weight"]
        out[f"{ours}.shared_expert_gate.weight"] = sd[f"{theirs}.shared_expert_gate.weight"]


def fused_experts(out: dict[str, torch.Tensor], ours: str, sd: dict[str, torch.Tensor],
                  theirs: str) -> None:
    """Split transformers' fused experts at ``theirs`` into our ``W_gate``, ``W_up``,
    ``W_down`` (the table of :func:`variantlab.hf.table.fused_experts`)."""
    out.update(load_state(table.fused_experts(ours, theirs), sd))


def _moe_state(out: dict[str, torch.Tensor], hf: Any) -> dict[str, torch.Tensor]:
    """Add the expert weights of every sparse layer of ``hf`` to ``out``."""
    sd = hf.state_dict()
    for i in range(hf.config.num_hidden_layers):
        if f"model.layers.{i}.mlp.gate.weight" in sd:
            experts_state(out, f"trf_blocks.{i}.ff.sublayer", sd, f"model.layers.{i}.mlp")
    return out


def _no_jitter(cfg: Any) -> None:
    if getattr(cfg, "router_jitter_noise", 0.0):
        reject("router_jitter_noise", cfg.router_jitter_noise, "multiplicative input noise "
               "before routing (in training) is not in the moe feed-forward")


def mixtral_spec(cfg: Any) -> dict[str, Any]:
    """Mistral (sliding window when set) with ``num_local_experts`` SwiGLU experts of width
    ``intermediate_size``, the chosen weights always renormalised."""
    _no_jitter(cfg)
    data = mistral_spec(cfg)
    data["feedforward"] = moe_feedforward(cfg, cfg.intermediate_size, renormalize=True)
    return data


def mixtral_state(hf: Any) -> dict[str, torch.Tensor]:
    return _moe_state(llama_state(hf), hf)


def qwen3moe_spec(cfg: Any) -> dict[str, Any]:
    """Qwen3 (per-head QK RMSNorm) with experts of width ``moe_intermediate_size`` on the
    sparse layers, renormalised when ``norm_topk_prob``; one sliding window on every layer
    when ``use_sliding_window`` (transformers then sets ``sliding_window``, else None)."""
    data = llama_spec(cfg)
    data["attention"]["qk_norm"] = {"kind": "rms", "eps": cfg.rms_norm_eps}
    data["attention"]["qk_norm_scope"] = "head"
    if getattr(cfg, "sliding_window", None) is not None:
        data["attention"]["window"] = int(cfg.sliding_window)
    moe = moe_feedforward(cfg, cfg.moe_intermediate_size, renormalize=cfg.norm_topk_prob)
    return with_dense_layers(data, cfg, moe)


def qwen3moe_state(hf: Any) -> dict[str, torch.Tensor]:
    return _moe_state(qk_norms(llama_state(hf), hf), hf)


def olmoe_spec(cfg: Any) -> dict[str, Any]:
    """Pre-norm Llama with OLMo 2's QK RMSNorm across each whole projection and experts of
    width ``intermediate_size``, renormalised only when ``norm_topk_prob`` (default off)."""
    if getattr(cfg, "clip_qkv", None) is not None:
        reject("clip_qkv", cfg.clip_qkv, "clamping queries, keys and values is not in "
               "variantlab's attention")
    data = olmo2_spec(cfg)
    data.pop("residual")  # OLMoE normalises each sublayer's input (pre-norm), as Llama
    data["feedforward"] = moe_feedforward(cfg, cfg.intermediate_size,
                                          renormalize=cfg.norm_topk_prob)
    return data


def olmoe_state(hf: Any) -> dict[str, torch.Tensor]:
    return _moe_state(qk_norms(llama_state(hf), hf), hf)
