"""Import a Hugging Face ``transformers`` causal LM into variantlab: ``(spec, model)``.

So far ``LlamaForCausalLM`` and ``Qwen3ForCausalLM`` (see docs/transformers.md); other classes and config options
that variantlab cannot express raise :class:`ConversionError` naming them."""

from __future__ import annotations

from typing import Any

import torch

from .build import build_model
from .errors import SpecError
from .specs import ModelSpec, parse_model_spec


class ConversionError(SpecError):
    """A transformers class or config option that variantlab cannot express exactly."""


def _reject(name: str, value: Any, why: str) -> None:
    raise ConversionError.at(["transformers", name], f"config option {name}={value!r}: {why}")


def _llama_spec(cfg: Any) -> dict[str, Any]:
    scaling = getattr(cfg, "rope_scaling", None) or {}
    if scaling.get("rope_type", scaling.get("type", "default")) != "default":
        _reject("rope_scaling", scaling, "only unscaled rotary (rope_type default) is supported")
    theta = scaling.get("rope_theta", getattr(cfg, "rope_theta", None))
    if cfg.hidden_act != "silu":
        _reject("hidden_act", cfg.hidden_act, "only silu (SwiGLU) is supported for Llama")
    if getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
        _reject("attention_bias/mlp_bias", True, "not supported by this importer yet")
    if getattr(cfg, "attention_dropout", 0.0):
        _reject("attention_dropout", cfg.attention_dropout, "dropout is not imported")
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return {
        "family": "gpt", "vocab_size": cfg.vocab_size,
        "context_length": cfg.max_position_embeddings, "emb_dim": cfg.hidden_size,
        "n_heads": cfg.num_attention_heads, "n_layers": cfg.num_hidden_layers,
        "drop_rate": 0.0, "qkv_bias": False, "attn_out_bias": False, "ffn_bias": False,
        "norm_bias": False, "tie_weights": bool(cfg.tie_word_embeddings),
        "norm": {"kind": "rms", "eps": cfg.rms_norm_eps}, "activation": "silu",
        "feedforward": {"kind": "glu", "hidden_dim": cfg.intermediate_size},
        "attention": {"kind": "mha", "n_kv_heads": cfg.num_key_value_heads,
                      "head_dim": head_dim if head_dim * cfg.num_attention_heads
                      != cfg.hidden_size else None},
        "positional": {"kind": "rotary", "theta": float(theta)},
    }


def _llama_state(hf: Any) -> dict[str, torch.Tensor]:
    sd = hf.state_dict()
    out = {"embed.tok_emb.weight": sd["model.embed_tokens.weight"],
           "final_norm.scale": sd["model.norm.weight"], "out_head.weight": sd["lm_head.weight"]}
    names = {"att.norm.scale": "input_layernorm.weight",
             "att.sublayer.W_query.weight": "self_attn.q_proj.weight",
             "att.sublayer.W_key.weight": "self_attn.k_proj.weight",
             "att.sublayer.W_value.weight": "self_attn.v_proj.weight",
             "att.sublayer.out_proj.weight": "self_attn.o_proj.weight",
             "ff.norm.scale": "post_attention_layernorm.weight",
             "ff.sublayer.W_gate.weight": "mlp.gate_proj.weight",
             "ff.sublayer.W_up.weight": "mlp.up_proj.weight",
             "ff.sublayer.W_down.weight": "mlp.down_proj.weight"}
    for i in range(hf.config.num_hidden_layers):
        for ours, theirs in names.items():
            out[f"trf_blocks.{i}.{ours}"] = sd[f"model.layers.{i}.{theirs}"]
    return out


def _qwen3_spec(cfg: Any) -> dict[str, Any]:
    if getattr(cfg, "use_sliding_window", False):
        _reject("use_sliding_window", True, "Qwen3's per-layer sliding windows are not imported")
    data = _llama_spec(cfg)
    data["attention"]["qk_norm"] = {"kind": "rms", "eps": cfg.rms_norm_eps}
    data["attention"]["qk_norm_scope"] = "head"
    return data


def _qwen3_state(hf: Any) -> dict[str, torch.Tensor]:
    out, sd = _llama_state(hf), hf.state_dict()
    for i in range(hf.config.num_hidden_layers):
        for ours, theirs in (("q_norm", "q_norm"), ("k_norm", "k_norm")):
            out[f"trf_blocks.{i}.att.sublayer.{ours}.scale"] = \
                sd[f"model.layers.{i}.self_attn.{theirs}.weight"]
    return out


CONVERTERS = {"LlamaForCausalLM": (_llama_spec, _llama_state),
              "Qwen3ForCausalLM": (_qwen3_spec, _qwen3_state)}


def from_transformers(hf_model: Any, impl: str = "naive") -> tuple[ModelSpec, torch.nn.Module]:
    """The variantlab spec equal to ``hf_model`` and a variantlab model holding copies of its
    weights (logits equal in float32). ``impl`` picks the attention implementation."""
    name = type(hf_model).__name__
    if name not in CONVERTERS:
        raise ConversionError.at(["transformers"], f"class {name} is not supported; "
                                 f"supported: {', '.join(sorted(CONVERTERS))}")
    make_spec, make_state = CONVERTERS[name]
    data = make_spec(hf_model.config)
    data["attention"]["impl"] = impl
    spec = parse_model_spec(data)
    model = build_model(spec)
    state = {k: v.detach().clone() for k, v in make_state(hf_model).items()}
    if spec.tie_weights:
        state.pop("out_head.weight")
    missing, unexpected = model.load_state_dict(state, strict=False)
    left = [k for k in missing if not (spec.tie_weights and k == "out_head.weight")]
    if left or unexpected:
        raise ConversionError.at(["transformers"], f"weight mapping for {name} incomplete: "
                                 f"missing {left}, unexpected {unexpected}")
    return spec, model


def spec_yaml(spec: ModelSpec, name: str = "imported") -> str:
    """``spec`` as the ``model:`` of a minimal experiment YAML file (edit a slot, add
    ``variants``/``measure``, run it); the ``model`` mapping loads back to an equal spec."""
    import yaml

    doc = {"name": name, "seeds": [0], "model": spec.to_data()}
    return yaml.safe_dump(doc, sort_keys=False)
