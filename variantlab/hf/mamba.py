"""State-space models: ``MambaForCausalLM``, ``Mamba2ForCausalLM`` and ``JambaForCausalLM``.

Mamba 1 (Gu & Dao 2023): every block is RMSNorm, the selective-scan mixer (``attention:
mamba``, Jamba's mixer without its inner norms) and the residual, no feed-forward, no
positional; the mixer's parameters keep HF's names, as Mamba-2's (:func:`mamba_table`, read
both ways: a spec of Mamba 1 mixers alone exports to ``MambaForCausalLM``).

Mamba-2 (Dao & Gu 2024): every block is RMSNorm, the SSD mixer (``attention: mamba2``) and
the residual, with no feed-forward (``feedforward: none``), no positional. Jamba (Lieber et
al. 2024): Mamba-1 mixers (``attention: mamba`` with Jamba's inner RMSNorms) and, every
``attn_layer_period`` layers, grouped-query attention without positional encoding, each
followed by a SwiGLU feed-forward or, every ``expert_layer_period`` layers from
``expert_layer_offset`` when ``num_experts`` > 1, a mixture of experts (``feedforward: moe``:
softmax then top-k, the chosen probabilities not renormalised); the attention layers, and
with both, the dense layers (``mamba_dense``, ``attention_dense``), are layer kinds of the
``layout``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .common import (
    Spec,
    activation,
    check_common,
    check_dropout,
    dropouts,
    head_dim_of,
    linear,
    need,
    reject,
    token_ids,
)
from .llama import ATTENTION, MLP
from .moe import experts_state, hybrid_layout, moe_feedforward
from .table import Pair, load_state, same

#: Mamba-2 has no maximum length; the spec needs one (edit it freely: nothing depends on it)
MAMBA_CONTEXT = 2048


def _plain(cfg: Any, context: int, eps: float) -> dict[str, Any]:
    return {
        "family": "gpt", "vocab_size": cfg.vocab_size, "context_length": context,
        "emb_dim": cfg.hidden_size, "n_layers": cfg.num_hidden_layers,
        **dropouts(0.0, 0.0, 0.0), "qkv_bias": False, "attn_out_bias": False,
        "ffn_bias": False, "norm_bias": False, "tie_weights": bool(cfg.tie_word_embeddings),
        "norm": {"kind": "rms", "eps": eps}, "positional": {"kind": "none"},
    }


def mamba2_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of a ``Mamba2Config``."""
    if cfg.hidden_act not in ("silu", "swish"):
        reject("hidden_act", cfg.hidden_act, "Mamba-2's convolution activation must be silu")
    if tuple(cfg.time_step_limit) != (0.0, float("inf")):
        reject("time_step_limit", cfg.time_step_limit, "clamping dt is not supported; only "
               "(0.0, inf)")
    if cfg.num_heads * cfg.head_dim != cfg.expand * cfg.hidden_size:
        reject("num_heads", cfg.num_heads, "num_heads * head_dim must equal expand * "
               "hidden_size")
    data = _plain(cfg, MAMBA_CONTEXT, cfg.layer_norm_epsilon)
    heads = cfg.num_heads if cfg.hidden_size % cfg.num_heads == 0 else 1
    data.update({
        "n_heads": heads, "feedforward": {"kind": "none"},
        "attention": {"kind": "mamba2", "d_state": cfg.state_size, "expand": cfg.expand,
                      "head_dim": cfg.head_dim, "n_groups": cfg.n_groups,
                      "conv_width": cfg.conv_kernel, "chunk_size": cfg.chunk_size,
                      "bias": bool(cfg.use_bias), "conv_bias": bool(cfg.use_conv_bias),
                      "norm_eps": cfg.layer_norm_epsilon,
                      "dt_min": cfg.time_step_min, "dt_max": cfg.time_step_max},
    })
    return data


def mamba_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of a ``MambaConfig`` (Mamba 1): Jamba's mixer without its inner norms."""
    if cfg.hidden_act not in ("silu", "swish"):
        reject("hidden_act", cfg.hidden_act, "Mamba's convolution activation must be silu")
    data = _plain(cfg, MAMBA_CONTEXT, cfg.layer_norm_epsilon)
    data.update({
        "n_heads": 1, "feedforward": {"kind": "none"},
        "attention": {"kind": "mamba", "d_state": cfg.state_size, "expand": cfg.expand,
                      "dt_rank": int(cfg.time_step_rank), "conv_width": cfg.conv_kernel,
                      "bias": bool(cfg.use_bias), "conv_bias": bool(cfg.use_conv_bias),
                      "dt_min": cfg.time_step_min, "dt_max": cfg.time_step_max},
    })
    return data


#: the parameters of Mamba 1's mixer and of Mamba-2's (the same names on both sides; the
#: biases are optional)
MAMBA_MIXER = ("in_proj.weight", "conv1d.weight", "x_proj.weight", "dt_proj.weight",
               "dt_proj.bias", "A_log", "D", "out_proj.weight")
MAMBA2_MIXER = ("in_proj.weight", "conv1d.weight", "dt_bias", "A_log", "D", "norm.weight",
                "out_proj.weight")


def mixer(ours: str, theirs: str, names: tuple[str, ...], bias: bool,
          conv_bias: bool) -> list[Pair]:
    """A Mamba mixer's parameters ``names`` at ``theirs`` and ``ours``, plus in_proj's and
    out_proj's biases with ``bias`` and the convolution's with ``conv_bias``."""
    extra = (("in_proj.bias", "out_proj.bias") if bias else ()) + (
        ("conv1d.bias",) if conv_bias else ())
    return [same(f"{ours}.{name}", f"{theirs}.{name}") for name in (*names, *extra)]


def _backbone(cfg: Any, names: tuple[str, ...]) -> list[Pair]:
    """Every weight of a Mamba or Mamba-2 causal LM of ``cfg`` whose mixers hold ``names``."""
    pairs = [same("embed.tok_emb.weight", "backbone.embeddings.weight"),
             same("final_norm.scale", "backbone.norm_f.weight"),
             same("out_head.weight", "lm_head.weight")]
    for i in range(cfg.num_hidden_layers):
        theirs = f"backbone.layers.{i}"
        pairs.append(same(f"trf_blocks.{i}.att.norm.scale", f"{theirs}.norm.weight"))
        pairs += mixer(f"trf_blocks.{i}.att.sublayer", f"{theirs}.mixer", names,
                       bool(cfg.use_bias), bool(cfg.use_conv_bias))
    return pairs


def mamba_table(cfg: Any) -> list[Pair]:
    """Every weight of a ``MambaForCausalLM`` of ``cfg`` and ours, both ways."""
    return _backbone(cfg, MAMBA_MIXER)


def mamba2_table(cfg: Any) -> list[Pair]:
    """Every weight of a ``Mamba2ForCausalLM`` of ``cfg`` and ours, both ways."""
    return _backbone(cfg, MAMBA2_MIXER)


def mamba_state(hf: Any) -> dict[str, torch.Tensor]:
    """Our state dict from a ``MambaForCausalLM``."""
    return load_state(mamba_table(hf.config), hf.state_dict())


def mamba_config(spec: Spec, cls: str = "MambaForCausalLM") -> Any:
    """The ``MambaConfig`` of a spec whose every layer is the selective-scan mixer alone."""
    import transformers

    att = spec.attention
    _check_ssm(spec, cls)
    need(spec, cls, "attention.inner_norms", not att.inner_norms,
         "Mamba's mixer has no inner norms (Jamba's)")
    config = transformers.MambaConfig
    return config(
        **token_ids(spec, config), vocab_size=spec.vocab_size, hidden_size=spec.emb_dim,
        num_hidden_layers=spec.n_layers, state_size=att.d_state, expand=att.expand,
        conv_kernel=att.conv_width, use_bias=att.bias, use_conv_bias=att.conv_bias,
        time_step_rank=att.dt_rank or math.ceil(spec.emb_dim / 16),
        time_step_min=att.dt_min, time_step_max=att.dt_max, hidden_act="silu",
        layer_norm_epsilon=spec.norm.eps, tie_word_embeddings=spec.tie_weights)


def mamba2_state(hf: Any) -> dict[str, torch.Tensor]:
    """Our state dict from a ``Mamba2ForCausalLM``."""
    return load_state(mamba2_table(hf.config), hf.state_dict())


def _check_ssm(spec: Spec, cls: str) -> None:
    """What Mamba and Mamba-2 share: norm, mixer and residual only (RMSNorm pre-norm, no
    feed-forward, no positions)."""
    check_common(spec, cls, norm="rms", rotary=False)
    check_dropout(spec, cls, ())
    need(spec, cls, "feedforward.kind", spec.feedforward.kind == "none",
         f"feedforward {spec.feedforward.kind!r}: a {cls} block is norm, mixer, residual")
    need(spec, cls, "residual.kind", spec.residual.kind == "pre_norm",
         f"residual {spec.residual.kind!r}: this class is pre_norm")
    need(spec, cls, "positional.kind", spec.positional.kind == "none",
         f"positional {spec.positional.kind!r}: this class has no positions")


def mamba2_heads(spec: Spec, cls: str, att: Spec, loc: str) -> tuple[int, int]:
    """The SSM heads and their width of the Mamba-2 mixer ``att`` (at spec path ``loc``),
    refusing what transformers' Mamba-2 mixers (Mamba-2's, Bamba's) lack: another inner width
    than expand x hidden_size, another gated norm than the norm after the gate, another norm
    eps than the model's."""
    inner = att.inner_dim or att.expand * spec.emb_dim
    need(spec, cls, f"{loc}.inner_dim", inner == att.expand * spec.emb_dim,
         "this class's mixer is expand x hidden_size wide")
    need(spec, cls, f"{loc}.gate_norm", att.gate_norm == "norm_after_gate",
         f"gate_norm {att.gate_norm!r}: this class gates, then normalises")
    need(spec, cls, f"{loc}.norm_eps", att.norm_eps == spec.norm.eps,
         "this class's mixer norm has the model's norm eps")
    head = att.head_dim or inner // spec.n_heads
    return inner // head, head


def mamba2_config(spec: Spec, cls: str = "Mamba2ForCausalLM") -> Any:
    """The ``Mamba2Config`` of a spec whose every layer is the Mamba-2 mixer alone."""
    import transformers

    att = spec.attention
    _check_ssm(spec, cls)
    heads, head = mamba2_heads(spec, cls, att, "attention")
    config = transformers.Mamba2Config
    return config(
        **token_ids(spec, config), vocab_size=spec.vocab_size, hidden_size=spec.emb_dim,
        num_hidden_layers=spec.n_layers, num_heads=heads, head_dim=head,
        state_size=att.d_state, expand=att.expand, n_groups=att.n_groups,
        conv_kernel=att.conv_width, chunk_size=att.chunk_size, use_bias=att.bias,
        use_conv_bias=att.conv_bias, time_step_min=att.dt_min, time_step_max=att.dt_max,
        hidden_act="silu", layer_norm_epsilon=spec.norm.eps,
        tie_word_embeddings=spec.tie_weights)


def jamba_spec(cfg: Any) -> dict[str, Any]:
    """Spec data of a ``JambaConfig``."""
    data = _plain(cfg, cfg.max_position_embeddings, cfg.rms_norm_eps)
    data.update({
        "n_heads": cfg.num_attention_heads,
        "activation": activation("hidden_act", cfg.hidden_act),
        "feedforward": {"kind": "glu", "hidden_dim": cfg.intermediate_size},
        "attention": {"kind": "mamba", "d_state": cfg.mamba_d_state, "expand": cfg.mamba_expand,
                      "dt_rank": cfg.mamba_dt_rank, "conv_width": cfg.mamba_d_conv,
                      "inner_norms": True, "norm_eps": cfg.rms_norm_eps,
                      "bias": bool(cfg.mamba_proj_bias), "conv_bias": bool(cfg.mamba_conv_bias)},
    })
    mha = {"kind": "mha", "n_kv_heads": cfg.num_key_value_heads}
    head_dim = head_dim_of(cfg)
    if head_dim * cfg.num_attention_heads != cfg.hidden_size:
        mha["head_dim"] = head_dim
    sparse = [n > 1 for n in cfg.layers_num_experts]
    dense = data["feedforward"]
    if any(sparse):
        data["feedforward"] = moe_feedforward(cfg, cfg.intermediate_size, renormalize=False)
    layout = hybrid_layout(list(cfg.layers_block_type), {"attention": {"attention": mha}},
                           sparse, dense)
    if layout is not None:
        data["layout"] = layout
    return data


def mixer_name(hf_name: str) -> str:
    """Our name of a ``JambaMambaMixer`` parameter: the same, but an inner norm's ``weight``
    (``dt_layernorm``, ``b_layernorm``, ``c_layernorm``) is our RMSNorm's ``scale``."""
    module, _, leaf = hf_name.rpartition(".")
    return f"{module}.scale" if module.endswith("_layernorm") and leaf == "weight" else hf_name


def jamba_state(hf: Any) -> dict[str, torch.Tensor]:
    """Our state dict from a ``JambaForCausalLM``."""
    sd, cfg = hf.state_dict(), hf.config
    out = {"embed.tok_emb.weight": sd["model.embed_tokens.weight"],
           "final_norm.scale": sd["model.final_layernorm.weight"],
           "out_head.weight": sd["lm_head.weight"]}
    for i, kind in enumerate(cfg.layers_block_type):
        ours, theirs = f"trf_blocks.{i}", f"model.layers.{i}"
        out[f"{ours}.att.norm.scale"] = sd[f"{theirs}.input_layernorm.weight"]
        out[f"{ours}.ff.norm.scale"] = sd[f"{theirs}.pre_ff_layernorm.weight"]
        if f"{theirs}.feed_forward.router.weight" in sd:  # a mixture-of-experts layer
            experts_state(out, f"{ours}.ff.sublayer", sd, f"{theirs}.feed_forward", "router")
        else:
            for mine, hf_name in MLP.items():
                linear(out, f"{ours}.ff.sublayer.{mine}", sd, f"{theirs}.feed_forward.{hf_name}",
                       False)
        if kind == "attention":
            for mine, hf_name in ATTENTION.items():
                linear(out, f"{ours}.att.sublayer.{mine}", sd, f"{theirs}.self_attn.{hf_name}", False)
        else:
            prefix = f"{theirs}.mamba."
            for key, value in sd.items():
                if key.startswith(prefix):
                    out[f"{ours}.att.sublayer.{mixer_name(key[len(prefix):])}"] = value
    return out
