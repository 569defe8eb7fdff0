"""Llama 4 text, both ways: ``Llama4ForCausalLM`` with a ``Llama4TextConfig`` (Meta 2025,
Llama 4 model card, "iRoPE").

A Llama-like pre-norm decoder (RMSNorm, grouped-query attention, SwiGLU) with three per-layer
choices, each a layer kind of a ``layout`` (the shortest repeating ``pattern``):

- rotary layers (``no_rope_layers`` 1) attend within chunks of ``attention_chunk_size``
  positions (``attention.chunk``) with the parameter-free QK "L2 norm" (``qk_norm: {kind:
  l2}``) when ``use_qk_norm``; NoPE layers (0) attend to the whole sequence with neither
  (``positional: none``);
- MoE layers (``moe_layers``) hold ``feedforward: moe`` with ``router: sigmoid_topk`` (the
  top-k router logits through a sigmoid, not renormalised), ``scale_input`` (a chosen expert
  reads weight * x), and one ungated shared SwiGLU expert of ``intermediate_size``; the other
  layers a SwiGLU of ``intermediate_size_mlp`` (kinds ending in ``_dense``).

Llama 4's rotary pairs are interleaved (complex form): the query and key rows of each head
are reordered on import (even dims, then odd ones), which leaves every score unchanged and
makes the rotate-half rotary equal, and put back on export; the L2 norm has no parameters,
so taking it before rotary (as variantlab does) equals Hugging Face's after.
:func:`llama4_table` names every weight on both sides.
"""

from __future__ import annotations

from typing import Any

import torch

from .common import (
    Spec,
    check_attention,
    check_common,
    check_dropout,
    check_moe,
    hf_activation,
    layers,
    need,
    one,
    period,
    reject,
    rotary_parameters,
    token_ids,
)
from .gpt2 import hidden_of
from .llama import llama_spec
from .table import (
    Pair,
    ends,
    glu,
    halves,
    interleaved_rows,
    linear,
    load_state,
    norms,
    permuted,
    same,
    transposed,
)

CLS = "Llama4ForCausalLM"
BIASES = "attention biases"


def llama4_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of a ``Llama4TextConfig``."""
    unknown = sorted(set(cfg.layer_types) - {"chunked_attention", "full_attention"})
    if unknown:
        reject("layer_types", unknown, "supported: chunked_attention, full_attention")
    data = llama_spec(cfg)
    dense = {"kind": "glu", "hidden_dim": int(cfg.intermediate_size_mlp)}
    moe = {"kind": "moe", "n_experts": int(cfg.num_local_experts),
           "top_k": int(cfg.num_experts_per_tok), "router": "sigmoid_topk",
           "renormalize": False, "scale_input": True,
           "expert": {"kind": "glu", "hidden_dim": int(cfg.intermediate_size)},
           "n_shared_experts": 1, "shared_hidden_dim": int(cfg.intermediate_size)}
    sparse = [i in set(cfg.moe_layers) for i in range(cfg.num_hidden_layers)]
    data["feedforward"] = moe if any(sparse) else dense
    plain = data["attention"]
    names: list[str] = []
    layers: dict[str, dict[str, Any]] = {}
    for i, (rope, kind) in enumerate(zip(cfg.no_rope_layers, cfg.layer_types)):
        attention = dict(plain)
        if rope and cfg.use_qk_norm:
            attention["qk_norm"] = {"kind": "l2", "eps": cfg.rms_norm_eps}
        if kind == "chunked_attention":
            attention["chunk"] = int(cfg.attention_chunk_size)
        name = ("rope" if rope else "nope") + ("" if sparse[i] or not any(sparse) else "_dense")
        slots: dict[str, Any] = {"attention": attention}
        if not rope:
            slots["positional"] = {"kind": "none"}
            if cfg.attn_temperature_tuning:  # the NoPE layers' queries scaled by position
                slots["positional"] = {"kind": "query_temperature",
                                       "floor_scale": int(cfg.floor_scale),
                                       "scale": float(cfg.attn_scale)}
        if name.endswith("_dense"):
            slots["feedforward"] = dense
        names.append(name)
        layers[name] = slots
    data["attention"] = layers[names[0]]["attention"]  # the model's own: layer 0's
    kinds = {name: {slot: comp for slot, comp in slots.items()
                    if not (slot == "attention" and comp == data["attention"])}
             for name, slots in layers.items()}
    if any(kinds.values()):
        data["layout"] = {"kinds": kinds, "pattern": period(names)}
    return data


def llama4_table(cfg: Any) -> list[Pair]:
    """Every weight of a ``Llama4ForCausalLM`` of ``cfg`` and ours, both ways."""
    bias, hd = bool(cfg.attention_bias), cfg.head_dim
    rows = {"W_query": interleaved_rows(cfg.num_attention_heads * hd, 0, hd, hd),
            "W_key": interleaved_rows(cfg.num_key_value_heads * hd, 0, hd, hd)}
    pairs = ends()
    for i in range(cfg.num_hidden_layers):
        ours, theirs = f"trf_blocks.{i}", f"model.layers.{i}"
        pairs += norms(i, "input_layernorm", "post_attention_layernorm")
        att, hf_att = f"{ours}.att.sublayer", f"{theirs}.self_attn"
        for mine, name in (("W_query", "q_proj"), ("W_key", "k_proj")):
            pairs.append(permuted(f"{att}.{mine}.weight", f"{hf_att}.{name}.weight", rows[mine]))
            if bias:
                pairs.append(permuted(f"{att}.{mine}.bias", f"{hf_att}.{name}.bias", rows[mine],
                                      BIASES))
        pairs += linear(f"{att}.W_value", f"{hf_att}.v_proj", bias, BIASES)
        pairs += linear(f"{att}.out_proj", f"{hf_att}.o_proj", bias, BIASES)
        ff, hf_ff = f"{ours}.ff.sublayer", f"{theirs}.feed_forward"
        if i not in set(cfg.moe_layers):
            pairs += glu(ff, hf_ff)
            continue
        pairs += [same(f"{ff}.gate.weight", f"{hf_ff}.router.weight"),
                  # (E, D, 2 hidden): transposed, the gate half first
                  halves((f"{ff}.W_gate", f"{ff}.W_up"), f"{hf_ff}.experts.gate_up_proj", dim=1,
                         transposed=True),
                  transposed(f"{ff}.W_down", f"{hf_ff}.experts.down_proj"),  # (E, hidden, D)
                  *glu(f"{ff}.shared_expert", f"{hf_ff}.shared_expert")]
    return pairs


def llama4_state(hf: Any) -> dict[str, torch.Tensor]:
    """Our state dict from a ``Llama4ForCausalLM`` (text)."""
    return load_state(llama4_table(hf.config), hf.state_dict())


# --- export ---------------------------------------------------------------------------

def _experts(spec: Spec, ffs: list[Spec]) -> tuple[list[int], Spec | None, int | None]:
    """The expert layers, their experts, and the dense layers' width."""
    sparse = [i for i, ff in enumerate(ffs) if ff.kind == "moe"]
    moe = one(spec, CLS, "layout.feedforward", [ffs[i] for i in sparse], "expert feed-forwards")
    if moe is not None:
        check_moe(spec, CLS, moe, "feedforward", router="sigmoid_topk", renormalize=False,
                  scale_input=True, n_shared_experts=1)
        hidden = moe.expert.hidden(spec.emb_dim)
        need(spec, CLS, "feedforward.expert.bias", not moe.expert.bias,
             "Llama 4's experts have no biases")
        need(spec, CLS, "feedforward.shared_hidden_dim", moe.shared_hidden_dim in (None, hidden),
             f"shared width {moe.shared_hidden_dim}: Llama 4's shared expert is as wide as "
             f"each expert ({hidden})")
    widths = []
    for ff in (ff for ff in ffs if ff.kind != "moe"):
        need(spec, CLS, "layout.feedforward.kind", ff.kind == "glu",
             f"feedforward {ff.kind!r}: Llama 4's dense layers are a SwiGLU (glu)")
        need(spec, CLS, "feedforward.bias", not ff.bias, "Llama 4 has no feed-forward biases")
        widths.append(hidden_of(spec.model_copy(update={"feedforward": ff})))
    return sparse, moe, one(spec, CLS, "layout.feedforward.hidden_dim", widths, "dense widths")


def llama4_config(spec: Spec, cls: str = CLS) -> Any:
    """The ``Llama4TextConfig`` of a spec with chunked attention, L2 QK-norm, NoPE layers or
    input-scaled experts."""
    import transformers

    specs = layers(spec, CLS, ("attention", "positional", "feedforward"))
    parameters = rotary_parameters(spec, CLS, specs)
    check_common(spec.model_copy(update={"layout": None, "positional": specs[0].positional
                                         if specs[0].positional.kind == "rotary" else
                                         spec.positional}), CLS, norm="rms", rotary=False)
    need(spec, CLS, "residual.kind", spec.residual.kind == "pre_norm",
         f"residual {spec.residual.kind!r}: Llama 4 is pre_norm")
    check_dropout(spec, CLS, ("attn",))
    rope = [layer.positional.kind == "rotary" for layer in specs]
    nope = [layer.positional for layer in specs if layer.positional.kind != "rotary"]
    tuning = one(spec, CLS, "layout.positional", nope, "NoPE positionals (none, or "
                 "query_temperature with one floor_scale and scale)")
    for layer, rotates in zip(specs, rope):
        qk = layer.attention.qk_norm
        check_attention(layer, CLS, gqa=True, head_dim_free=True, chunk=True, qk_kind="l2",
                        qk_norm="head" if qk is not None else None)
        need(spec, CLS, "layout.attention.qk_norm", rotates or qk is None,
             "Llama 4's NoPE layers have no QK norm")
    base = one(spec, CLS, "layout.attention", [
        layer.attention.model_copy(update={"chunk": None, "qk_norm": None, "impl": "naive"})
        for layer in specs], "attentions (apart from chunk and QK norm)")
    qk_norm = one(spec, CLS, "layout.attention.qk_norm", [
        layer.attention.qk_norm is not None for layer, r in zip(specs, rope) if r],
        "QK norm (on, off) on the rotary layers")
    chunks = [layer.attention.chunk for layer in specs]
    chunk = one(spec, CLS, "layout.attention.chunk", [c for c in chunks if c], "chunk sizes")
    sparse, moe, width = _experts(spec, [layer.feedforward for layer in specs])
    hidden: int = moe.expert.hidden(spec.emb_dim) if moe is not None else int(width or 1)
    head_dim = base.head_dim or spec.emb_dim // spec.n_heads
    config = transformers.Llama4TextConfig
    return config(
        vocab_size=spec.vocab_size, max_position_embeddings=spec.context_length,
        hidden_size=spec.emb_dim, num_hidden_layers=spec.n_layers,
        num_attention_heads=spec.n_heads, num_key_value_heads=base.n_kv_heads or spec.n_heads,
        head_dim=head_dim, intermediate_size=hidden, intermediate_size_mlp=int(width or hidden),
        rms_norm_eps=spec.norm.eps, attention_bias=spec.qkv_bias or spec.attn_out_bias,
        attention_dropout=spec.drop("attn"), tie_word_embeddings=spec.tie_weights,
        hidden_act=hf_activation(spec, CLS),
        rope_parameters=parameters,
        num_local_experts=moe.n_experts if moe else 1,
        num_experts_per_tok=moe.top_k if moe else 1, moe_layers=sparse,
        output_router_logits=bool(moe and moe.aux_loss_coef > 0),
        router_aux_loss_coef=moe.aux_loss_coef if moe and moe.aux_loss_coef > 0 else 0.001,
        use_qk_norm=bool(qk_norm), no_rope_layers=[int(r) for r in rope],
        attention_chunk_size=chunk,
        attn_temperature_tuning=getattr(tuning, "kind", None) == "query_temperature",
        floor_scale=getattr(tuning, "floor_scale", 8192), attn_scale=getattr(tuning, "scale", 0.1),
        layer_types=["chunked_attention" if c else "full_attention" for c in chunks],
        **token_ids(spec, config))
