"""DeepSeek-V2 and DeepSeek-V3: ``DeepseekV2ForCausalLM``, ``DeepseekV3ForCausalLM``.

Llama-like pre-norm blocks whose attention is multi-head latent attention (``attention:
{kind: mla}``, variantlab_plugins/mla.py) and whose feed-forward is a mixture of experts
from layer ``first_k_dense_replace`` on (the first layers a dense SwiGLU: a layout with a
``dense`` layer kind on those layers), with ``n_shared_experts`` shared experts (one SwiGLU
of width ``moe_intermediate_size * n_shared_experts``, ungated).

Routing: V2 takes a softmax over the experts, the top-k as they are (``topk_method: greedy``)
or within the ``topk_group`` best of ``n_group`` groups scored by their best expert
(``group_limited_greedy``); V3 takes a sigmoid per expert, chooses with the
``e_score_correction_bias`` added among the ``topk_group`` best groups scored by the sum of
their two best experts, renormalises when ``norm_topk_prob``; both scale the weights by
``routed_scaling_factor``.

DeepSeek's rotary dims are interleaved pairs (V2 always, V3 with ``rope_interleave``): the
rows of the rotary parts of the query and key projections are reordered (even dims, then odd
ones) on import, after which the rotate-half rotary gives the same scores; on export they go
back through the inverse order (V3 is exported with ``rope_interleave``, its released form).
:func:`deepseek_table` names every weight on both sides.

Export (:func:`deepseek_config`): an ``mla`` spec goes to V3 when its experts are routed by
``sigmoid_topk``, else to V2 (softmax routing, never renormalised; a model without experts
too); the dense layers must be the first ``first_k_dense_replace``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .common import (
    Spec,
    check_common,
    check_dropout,
    check_moe,
    hf_activation,
    layers,
    need,
    one,
    reject,
    rms_decoder,
    rope,
    rope_params,
    rotary,
    token_ids,
)
from .gpt2 import hidden_of
from .table import (
    Pair,
    ends,
    fused_experts,
    glu,
    interleaved_rows,
    linear,
    load_state,
    norms,
    permuted,
    same,
)

CLASSES = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")
BIASES = "attention biases"


def deepseek_spec(cfg: Any, v3: bool) -> dict[str, Any]:
    """Spec data of a ``DeepseekV2Config`` (``v3`` false) or ``DeepseekV3Config``."""
    if cfg.num_key_value_heads != cfg.num_attention_heads:
        reject("num_key_value_heads", cfg.num_key_value_heads, "MLA expands the latent to "
               "every head; Hugging Face's eager attention needs it equal to "
               "num_attention_heads")
    if getattr(cfg, "mlp_bias", False):
        reject("mlp_bias", True, "the DeepSeek experts have no biases; biased dense and "
               "shared feed-forwards are not imported")
    bias = bool(cfg.attention_bias)
    dense = {"kind": "glu", "hidden_dim": cfg.intermediate_size}
    data: dict[str, Any] = {
        **rms_decoder(cfg, bias),
        "feedforward": dense,
        "attention": {"kind": "mla", "kv_lora_rank": cfg.kv_lora_rank,
                      "q_lora_rank": cfg.q_lora_rank, "qk_rope_head_dim": cfg.qk_rope_head_dim,
                      "qk_nope_head_dim": cfg.qk_nope_head_dim, "v_head_dim": cfg.v_head_dim},
        "positional": rotary(cfg, partial=False, head_dim=cfg.qk_rope_head_dim),
    }
    scale = mla_scale(cfg.qk_nope_head_dim + cfg.qk_rope_head_dim, rope_params(cfg))
    if scale is not None:
        data["attention"]["scale"] = scale
    first_dense = int(cfg.first_k_dense_replace or 0)
    if first_dense >= cfg.num_hidden_layers:
        return data
    data["feedforward"] = deepseek_moe(cfg, v3)
    if first_dense:
        data["layout"] = {"kinds": {"dense": {"feedforward": dense}},
                          "layers": dict.fromkeys(range(first_dense), "dense")}
    return data


def mla_scale(qk_dim: int, params: dict[str, Any]) -> float | None:
    """DeepSeek's score scale under YaRN with ``mscale_all_dim`` (transformers'
    ``yarn_apply_mscale``): 1/sqrt(qk_dim) times (0.1 mscale_all_dim ln factor + 1)^2; None
    (the plain 1/sqrt(qk_dim)) otherwise."""
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default" or not params.get("mscale_all_dim"):
        return None
    factor = float(params["factor"])
    mscale = 1.0 if factor <= 1 else 0.1 * params["mscale_all_dim"] * math.log(factor) + 1.0
    return qk_dim ** -0.5 * mscale * mscale


def deepseek_moe(cfg: Any, v3: bool) -> dict[str, Any]:
    """The ``moe`` feed-forward of a DeepSeek config (and GLM-4-MoE's, V3's router)."""
    moe: dict[str, Any] = {
        "kind": "moe", "n_experts": int(cfg.n_routed_experts), "top_k": int(cfg.num_experts_per_tok),
        "expert": {"kind": "glu", "hidden_dim": int(cfg.moe_intermediate_size)},
        "routed_scaling_factor": float(cfg.routed_scaling_factor)}
    if cfg.n_shared_experts:
        moe.update(n_shared_experts=int(cfg.n_shared_experts),
                   shared_hidden_dim=int(cfg.moe_intermediate_size * cfg.n_shared_experts))
    if v3:
        moe.update(router="sigmoid_topk", renormalize=bool(cfg.norm_topk_prob), choice_bias=True)
        if cfg.n_group and cfg.n_group > 1:
            moe.update(n_group=int(cfg.n_group), topk_group=int(cfg.topk_group),
                       group_score="top2_sum")
        return moe
    moe.update(router="softmax_topk", renormalize=False)  # V2's router never renormalises
    if cfg.topk_method == "group_limited_greedy":
        moe.update(n_group=int(cfg.n_group), topk_group=int(cfg.topk_group), group_score="max")
    elif cfg.topk_method != "greedy":
        reject("topk_method", cfg.topk_method, "supported: greedy, group_limited_greedy")
    return moe


def deepseek_v2_spec(cfg: Any) -> dict[str, Any]:
    return deepseek_spec(cfg, v3=False)


def deepseek_v3_spec(cfg: Any) -> dict[str, Any]:
    return deepseek_spec(cfg, v3=True)


def _rows(cfg: Any) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The row orders of the query projection and of kv_a_proj_with_mqa that de-interleave
    their rotary parts (None: plain rotary, V3 without ``rope_interleave``)."""
    if not getattr(cfg, "rope_interleave", True):  # V2 has no option: always interleaved
        return None, None
    nope, rope, rank = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.kv_lora_rank
    q = interleaved_rows(cfg.num_attention_heads * (nope + rope), nope, rope, nope + rope)
    return q, interleaved_rows(rank + rope, rank, rope, rank + rope)


def deepseek_table(cfg: Any) -> list[Pair]:
    """Every weight of a ``DeepseekV2ForCausalLM`` / ``DeepseekV3ForCausalLM`` of ``cfg``
    and ours, both ways."""
    bias = bool(cfg.attention_bias)
    q_rows, kv_rows = _rows(cfg)
    pairs = ends()
    for i in range(cfg.num_hidden_layers):
        ours, theirs = f"trf_blocks.{i}", f"model.layers.{i}"
        pairs += norms(i, "input_layernorm", "post_attention_layernorm")
        att, hf_att = f"{ours}.att.sublayer", f"{theirs}.self_attn"
        q_name = "q_proj" if cfg.q_lora_rank is None else "q_b_proj"
        if cfg.q_lora_rank is not None:
            pairs += linear(f"{att}.q_a_proj", f"{hf_att}.q_a_proj", bias, BIASES)
            pairs.append(same(f"{att}.q_a_norm.scale", f"{hf_att}.q_a_layernorm.weight"))
        pairs.append(permuted(f"{att}.{q_name}.weight", f"{hf_att}.{q_name}.weight", q_rows))
        kv_a = f"{hf_att}.kv_a_proj_with_mqa"
        pairs.append(permuted(f"{att}.kv_a_proj.weight", f"{kv_a}.weight", kv_rows))
        if bias:
            pairs.append(permuted(f"{att}.kv_a_proj.bias", f"{kv_a}.bias", kv_rows, BIASES))
        pairs += [same(f"{att}.kv_a_norm.scale", f"{hf_att}.kv_a_layernorm.weight"),
                  same(f"{att}.kv_b_proj.weight", f"{hf_att}.kv_b_proj.weight"),
                  *linear(f"{att}.out_proj", f"{hf_att}.o_proj", bias, BIASES)]
        ff, mlp = f"{ours}.ff.sublayer", f"{theirs}.mlp"
        if i < (cfg.first_k_dense_replace or 0):
            pairs += glu(ff, mlp)
            continue
        pairs.append(same(f"{ff}.gate.weight", f"{mlp}.gate.weight"))
        if cfg.model_type == "deepseek_v3":  # a buffer: zeros where the variant has none
            pairs.append(same(f"{ff}.expert_bias", f"{mlp}.gate.e_score_correction_bias",
                              zeros="expert choice bias", quiet=True))
        pairs += fused_experts(ff, f"{mlp}.experts")
        if cfg.n_shared_experts:
            pairs += glu(f"{ff}.shared_expert", f"{mlp}.shared_experts")
    return pairs


def deepseek_state(hf: Any) -> dict[str, torch.Tensor]:
    """Our state dict from a ``DeepseekV2ForCausalLM`` / ``DeepseekV3ForCausalLM``."""
    return load_state(deepseek_table(hf.config), hf.state_dict())


# --- export ---------------------------------------------------------------------------

def deepseek_class(spec: Spec) -> str:
    """V3 when any layer's experts are routed by sigmoid scores, else V2."""
    sigmoid = any(getattr(spec.layer_spec(i).feedforward, "router", None) == "sigmoid_topk"
                  for i in range(spec.n_layers))
    return CLASSES[1] if sigmoid else CLASSES[0]


def _feedforwards(spec: Spec, cls: str) -> tuple[int, int | None, Spec | None]:
    """The number of leading dense layers, their width, and the experts of the others
    (None where there are none)."""
    ffs = [layer.feedforward for layer in layers(spec, cls, ("feedforward",))]
    first = next((i for i, ff in enumerate(ffs) if ff.kind == "moe"), len(ffs))
    need(spec, cls, "layout.feedforward", all(ff.kind == "moe" for ff in ffs[first:]),
         "DeepSeek's dense layers are the first first_k_dense_replace ones; a dense layer "
         "after an expert layer is not in this class")
    for ff in ffs[:first]:
        need(spec, cls, "feedforward.kind", ff.kind == "glu",
             f"feedforward {ff.kind!r}: DeepSeek's dense layers are a SwiGLU (glu)")
        need(spec, cls, "feedforward.bias", not ff.bias, "DeepSeek's feed-forwards have no "
             "biases")
    width = one(spec, cls, "layout.feedforward.hidden_dim",
                [hidden_of(spec.model_copy(update={"feedforward": ff})) for ff in ffs[:first]],
                "dense widths")
    moe = one(spec, cls, "layout.feedforward", ffs[first:], "expert feed-forwards")
    return first, width, moe


def _moe_kwargs(spec: Spec, cls: str, moe: Spec) -> dict[str, Any]:
    """The config options of DeepSeek's experts, checked against ``cls``."""
    v3 = cls == CLASSES[1]
    loc = "feedforward"
    free = ("routed_scaling_factor", "n_group", "group_score", "n_shared_experts") + (
        ("renormalize", "choice_bias") if v3 else ())
    check_moe(spec, cls, moe, loc, free=free, router="sigmoid_topk" if v3 else "softmax_topk",
              renormalize=False)
    if moe.n_group is not None:
        score = "top2_sum" if v3 else "max"
        need(spec, cls, f"{loc}.group_score", moe.group_score == score,
             f"group_score {moe.group_score!r}: {cls[:-11]} scores a group by {score}")
    hidden = moe.expert.hidden(spec.emb_dim)
    need(spec, cls, f"{loc}.expert.bias", not moe.expert.bias, "DeepSeek's experts have no "
         "biases")
    need(spec, cls, f"{loc}.n_shared_experts", moe.n_shared_experts >= 1,
         "DeepSeek's mixture always has shared experts (n_shared_experts >= 1)")
    shared = moe.shared_hidden_dim or moe.n_shared_experts * hidden
    need(spec, cls, f"{loc}.shared_hidden_dim", shared == moe.n_shared_experts * hidden,
         f"shared width {shared}: DeepSeek's is n_shared_experts x the expert width "
         f"({moe.n_shared_experts * hidden})")
    need(spec, cls, f"{loc}.n_experts", not v3 or moe.n_group is not None or moe.n_experts >= 2,
         "DeepSeek-V3 scores groups by their two best experts: at least 2 experts")
    groups = {"n_group": moe.n_group or 1, "topk_group": moe.topk_group or 1} if v3 else {
        "n_group": moe.n_group, "topk_group": moe.topk_group,
        "topk_method": "greedy" if moe.n_group is None else "group_limited_greedy"}
    return dict(
        n_routed_experts=moe.n_experts, num_experts_per_tok=moe.top_k,
        moe_intermediate_size=hidden, n_shared_experts=moe.n_shared_experts,
        routed_scaling_factor=moe.routed_scaling_factor, norm_topk_prob=moe.renormalize,
        output_router_logits=moe.aux_loss_coef > 0, **groups,
        **({"router_aux_loss_coef": moe.aux_loss_coef} if moe.aux_loss_coef > 0 else {}))


def deepseek_config(spec: Spec, cls: str) -> Any:
    """The ``DeepseekV2Config`` / ``DeepseekV3Config`` of an ``mla`` spec."""
    import transformers

    first, width, moe = _feedforwards(spec, cls)  # refuses layers that differ otherwise
    need(spec, cls, "positional.kind", spec.positional.kind == "rotary",
         f"positional {spec.positional.kind!r}: DeepSeek rotates the qk_rope_head_dim part")
    check_common(spec.model_copy(update={"layout": None}), cls, norm="rms", rotary=True)
    need(spec, cls, "residual.kind", spec.residual.kind == "pre_norm",
         f"residual {spec.residual.kind!r}: DeepSeek is pre_norm")
    check_dropout(spec, cls, ("attn",))
    att = spec.attention
    need(spec, cls, "attention.latent_norm", att.latent_norm is None,
         "DeepSeek's latent norms are RMSNorms with eps 1e-6 (latent_norm unset)")
    need(spec, cls, "n_heads", spec.emb_dim % spec.n_heads == 0,
         f"emb_dim {spec.emb_dim} is not a multiple of n_heads {spec.n_heads}, which "
         "transformers' DeepSeek config requires")
    sizes = att.sizes(spec.emb_dim, spec.n_heads)
    parameters = rope(spec.positional, False, spec.context_length, cls=cls)
    qk_dim = sizes["qk_nope_head_dim"] + sizes["qk_rope_head_dim"]
    implied = mla_scale(qk_dim, parameters) or qk_dim ** -0.5
    need(spec, cls, "attention.scale", abs((att.scale or qk_dim ** -0.5) - implied) < 1e-12,
         f"scale={att.scale}: DeepSeek's score scale is {implied!r}, 1/sqrt(qk head dim) times "
         "the square of YaRN's mscale_all_dim factor when the rotary has one")
    config = getattr(transformers, cls.replace("ForCausalLM", "Config"))
    kwargs = dict(
        vocab_size=spec.vocab_size, max_position_embeddings=spec.context_length,
        hidden_size=spec.emb_dim, num_hidden_layers=spec.n_layers,
        num_attention_heads=spec.n_heads, num_key_value_heads=spec.n_heads,
        intermediate_size=width or (moe.expert.hidden(spec.emb_dim) if moe else 1),
        rms_norm_eps=spec.norm.eps, q_lora_rank=att.q_lora_rank,
        attention_bias=spec.qkv_bias or spec.attn_out_bias,
        attention_dropout=spec.drop("attn"), tie_word_embeddings=spec.tie_weights,
        first_k_dense_replace=first, hidden_act=hf_activation(spec, cls),
        rope_parameters=parameters, **sizes,
        **(_moe_kwargs(spec, cls, moe) if moe is not None else {}))
    if cls == CLASSES[1]:
        kwargs["rope_interleave"] = True
    return config(**kwargs, **token_ids(spec, config))
