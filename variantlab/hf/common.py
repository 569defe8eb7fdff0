"""What every family module shares. Import: the error, config reading (rotary, activation,
dropout) and weight copying. Export: the refusal, the warning, and checks of the spec's
components against what a transformers class can hold."""

from __future__ import annotations

import warnings
from typing import Any, NoReturn

import torch

from ..errors import SpecError


class ConversionError(SpecError):
    """A transformers class or config option that variantlab cannot express exactly."""


class ExportWarning(UserWarning):
    """The exported model computes the same logits, but trains differently from the variant
    (a bias the variant lacks exported as zeros, a dropout the class has no place for)."""


#: the oldest transformers the conversions are checked against (tests/test_hf_*.py compare
#: logits on it): older releases name some weights and options differently, and for some
#: classes (Mamba-2, Bamba on 5.17) the logits then differ without any error
TESTED_TRANSFORMERS = "5.24.0"


def check_transformers() -> None:
    """Raise a :class:`ConversionError` when the installed transformers is older than
    :data:`TESTED_TRANSFORMERS`, before anything converts."""
    import transformers
    from packaging.version import InvalidVersion, Version

    installed = str(getattr(transformers, "__version__", "unknown"))
    try:
        old = Version(installed) < Version(TESTED_TRANSFORMERS)
    except InvalidVersion:
        old = True
    if old:
        raise ConversionError.at(["transformers"], (
            f"transformers {installed} is installed; variantlab's conversions are checked "
            f"against transformers >= {TESTED_TRANSFORMERS} only (older releases can give "
            f"other logits without an error): pip install 'transformers>={TESTED_TRANSFORMERS}'"))


def reject(name: str, value: Any, why: str) -> NoReturn:
    """Raise a :class:`ConversionError` naming the config option ``name`` and its value."""
    raise ConversionError.at(["transformers", name], f"config option {name}={value!r}: {why}")


#: Hugging Face ``hidden_act`` / ``activation_function`` names (transformers.activations.ACT2FN)
#: and the registered activation that computes the same function
ACTIVATIONS: dict[str, dict[str, Any]] = {
    "gelu": {"kind": "gelu", "approximate": "none"},
    "gelu_new": {"kind": "gelu", "approximate": "tanh"},
    "gelu_pytorch_tanh": {"kind": "gelu", "approximate": "tanh"},
    "relu": {"kind": "relu"},
    "relu2": {"kind": "relu2"},
    "silu": {"kind": "silu"},
    "swish": {"kind": "silu"},
    "xielu": {"kind": "xielu"},
}


def activation(name: str, value: Any) -> dict[str, Any]:
    """The activation spec for the config option ``name`` (e.g. ``hidden_act``) = ``value``."""
    if not isinstance(value, str) or value not in ACTIVATIONS:
        reject(name, value, f"supported: {', '.join(sorted(ACTIVATIONS))}")
    return dict(ACTIVATIONS[value])


def rope_params(cfg: Any) -> dict[str, Any]:
    """The rotary settings: ``rope_parameters`` (transformers 5), or ``rope_scaling`` plus
    the separate attributes of older versions (``rope_theta`` / GPT-NeoX's
    ``rotary_emb_base``, ``partial_rotary_factor`` / GPT-NeoX's ``rotary_pct``), as one dict."""
    params = getattr(cfg, "rope_parameters", None)
    if params is None:
        params = dict(getattr(cfg, "rope_scaling", None) or {})
        theta = getattr(cfg, "rope_theta", None) or getattr(cfg, "rotary_emb_base", None)
        fraction = getattr(cfg, "partial_rotary_factor", None) or getattr(cfg, "rotary_pct", 1.0)
        params.setdefault("rope_theta", theta)
        params.setdefault("partial_rotary_factor", fraction)
    return dict(params)


#: Hugging Face rope_type -> (its keys in rope_parameters, past rope_theta and
#: partial_rotary_factor) and our rotary ``scaling``
ROPE_KEYS: dict[str, tuple[str, ...]] = {
    "default": (), "linear": ("factor",), "dynamic": ("factor",),
    "yarn": ("factor", "original_max_position_embeddings", "attention_factor", "beta_fast",
             "beta_slow", "mscale", "mscale_all_dim", "truncate"),
    "llama3": ("factor", "original_max_position_embeddings", "low_freq_factor",
               "high_freq_factor"),
    "longrope": ("factor", "original_max_position_embeddings", "attention_factor",
                 "short_factor", "long_factor"),
}
_PLAIN_KEYS = ("rope_type", "type", "rope_theta", "partial_rotary_factor")
#: the keys a kind cannot do without (besides a factor, which yarn and longrope may infer)
_NEEDED = {"llama3": ("low_freq_factor", "high_freq_factor"),
           "longrope": ("short_factor", "long_factor")}


def rope_scaling(cfg: Any, params: dict[str, Any], name: str = "rope_parameters",
                 ) -> dict[str, Any]:
    """The rotary ``scaling`` options of Hugging Face rope parameters ``params`` (a config's
    ``rope_parameters``, ``name`` in messages): {} for the default kind; refuses a kind or a
    key variantlab does not compute. A missing ``factor`` of yarn or longrope is
    max_position_embeddings / original_max_position_embeddings, as Hugging Face reads it;
    dynamic grows its base past max_position_embeddings."""
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_KEYS:
        reject(name, params, f"rope_type {kind!r} is not supported; supported: "
               f"{', '.join(ROPE_KEYS)}")
    extra = sorted(k for k, v in params.items() if v is not None
                   and k not in _PLAIN_KEYS + ROPE_KEYS[kind])
    if extra:
        reject(name, params, f"rope_type {kind!r} with {', '.join(extra)}: variantlab reads "
               f"only {', '.join(ROPE_KEYS[kind]) or 'rope_theta'} for this kind")
    if kind == "default":
        return {}
    missing = [k for k in _NEEDED.get(kind, ()) if params.get(k) is None]
    if missing:
        reject(name, params, f"rope_type {kind!r} needs {', '.join(missing)}")
    out: dict[str, Any] = {"scaling": kind}
    max_len = getattr(cfg, "max_position_embeddings", None)
    original = (params.get("original_max_position_embeddings")
                or getattr(cfg, "original_max_position_embeddings", None) or max_len)
    factor = params.get("factor")
    if factor is None:
        if kind not in ("yarn", "longrope") or max_len is None:
            reject(name, params, f"rope_type {kind!r} needs a factor")
        factor = max_len / original
    out["factor"] = float(factor)
    if kind != "linear":
        context = max_len if kind == "dynamic" else original
        if context is None:
            reject("max_position_embeddings", None, f"rope_type {kind!r} needs the "
                   "context it extends")
        out["original_context"] = int(context)
    if kind == "llama3":
        out["low_freq_factor"] = float(params["low_freq_factor"])
        out["high_freq_factor"] = float(params["high_freq_factor"])
    if kind == "yarn":
        out["beta_fast"] = float(params.get("beta_fast") or 32)
        out["beta_slow"] = float(params.get("beta_slow") or 1)
        out["truncate"] = bool(params.get("truncate", True))
        for key in ("mscale", "mscale_all_dim"):
            if params.get(key) is not None:
                out[key] = float(params[key])
    if kind == "longrope":
        out["short_factor"] = [float(f) for f in params["short_factor"]]
        out["long_factor"] = [float(f) for f in params["long_factor"]]
    if kind in ("yarn", "longrope") and params.get("attention_factor") is not None:
        out["attention_factor"] = float(params["attention_factor"])
    return out


def rotary(cfg: Any, partial: bool, head_dim: int) -> dict[str, Any]:
    """The ``rotary`` positional spec of ``cfg``, its scaling (:func:`rope_scaling`)
    included; refuses partial rotary where the model has none (``partial`` false). An odd
    ``r = int(head_dim * fraction)`` gets ``odd_rounding: up``: Hugging Face's ``inv_freq``
    has ceil(r/2) frequencies theta^(-2i/r), each turning a pair, so r + 1 dims rotate."""
    params = rope_params(cfg)
    scaling = rope_scaling(cfg, params, "rope_scaling")
    theta = params.get("rope_theta")
    if theta is None:
        reject("rope_theta", theta, "a rotary base is needed")
    fraction = float(params.get("partial_rotary_factor", 1.0) or 1.0)
    if fraction != 1.0 and not partial:
        reject("partial_rotary_factor", fraction, "this class rotates every head dim")
    out = {"kind": "rotary", "theta": float(theta), "fraction": fraction, **scaling}
    if int(head_dim * fraction) % 2:
        if int(head_dim * fraction) + 1 > head_dim:
            reject("partial_rotary_factor", fraction, f"rotates int({head_dim} * {fraction}) "
                   "dims, an odd count that rounded up to a pair exceeds the head")
        if scaling:
            reject("partial_rotary_factor", fraction, f"rotates int({head_dim} * {fraction}) "
                   "dims, an odd count, with scaled rotary; variantlab scales an even count")
        out["odd_rounding"] = "up"
    return out


def period(items: list[str]) -> list[str]:
    """The shortest prefix that repeated gives ``items``."""
    for p in range(1, len(items) + 1):
        if all(items[i] == items[i % p] for i in range(len(items))):
            return items[:p]
    return items  # pragma: no cover (p = len(items) always matches)


def dropouts(emb: float, attn: float, resid: float) -> dict[str, float]:
    """The model's three dropout rates (``drop_rate`` itself 0)."""
    return {"drop_rate": 0.0, "emb_drop_rate": float(emb), "attn_drop_rate": float(attn),
            "resid_drop_rate": float(resid)}


def head_dim_of(cfg: Any) -> int:
    """The width of each attention head (``head_dim``, or hidden_size // num_attention_heads)."""
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def linear(out: dict[str, torch.Tensor], ours: str, sd: dict[str, torch.Tensor], theirs: str,
           bias: bool) -> None:
    """Copy a Linear's weight (and bias when it has one) from ``theirs`` to ``ours``."""
    out[f"{ours}.weight"] = sd[f"{theirs}.weight"]
    if bias:
        out[f"{ours}.bias"] = sd[f"{theirs}.bias"]


def norm(out: dict[str, torch.Tensor], ours: str, sd: dict[str, torch.Tensor], theirs: str,
         shift: bool) -> None:
    """Copy a norm's scale (``weight``) and, for LayerNorm, its shift (``bias``)."""
    out[f"{ours}.scale"] = sd[f"{theirs}.weight"]
    if shift:
        out[f"{ours}.shift"] = sd[f"{theirs}.bias"]


#: a ``gpt`` spec with built-in components: read by attribute (``spec.attention.n_kv_heads``),
#: each attribute's presence checked before use, so typed loosely
Spec = Any


def refuse(loc: str, cls: str, why: str) -> NoReturn:
    """Raise a :class:`ConversionError` at the spec path ``loc`` (e.g. ``residual.kind``)
    saying why transformers class ``cls`` (or none) cannot hold it."""
    raise ConversionError.at(loc.split("."), f"{why} (exporting to {cls})")


def warn(message: str) -> None:
    warnings.warn(message, ExportWarning, stacklevel=4)


#: our activation spec (kind, approximate) -> the Hugging Face ACT2FN name
_ACT_NAMES = {("gelu", "none"): "gelu", ("gelu", "tanh"): "gelu_pytorch_tanh",
              ("relu", None): "relu", ("relu2", None): "relu2", ("silu", None): "silu",
              ("xielu", None): "xielu"}


def activation_name(spec: Spec) -> str | None:
    """The ``hidden_act`` name of the model's activation, None when transformers has none."""
    act = spec.activation
    return _ACT_NAMES.get((act.kind, getattr(act, "approximate", None)))


def hf_activation(spec: Spec, cls: str) -> str:
    """The ``hidden_act`` name of the model's activation (the inverse of :data:`ACTIVATIONS`)."""
    act = spec.activation
    name = activation_name(spec)
    if name is None:
        refuse("activation.kind", cls, f"activation {act.kind!r} has no transformers "
               f"equivalent; supported: {', '.join(sorted(ACTIVATIONS))} "
               "(gelu exact or tanh, relu, relu2, silu)")
    return name


def need(spec: Spec, cls: str, loc: str, ok: bool, why: str) -> None:
    """Refuse at ``loc`` unless ``ok``."""
    if not ok:
        refuse(loc, cls, why)


def head_dim(spec: Spec) -> int:
    return getattr(spec.attention, "head_dim", None) or spec.emb_dim // spec.n_heads


def check_attention(spec: Spec, cls: str, *, gqa: bool, head_dim_free: bool,
                    qk_norm: str | None = None, gemma: bool = False,
                    window: bool = False, sinks: bool = False, chunk: bool = False,
                    qk_kind: str = "rms") -> None:
    """The attention is ``mha`` and uses only what ``cls`` has: grouped-query heads
    (``gqa``), its own head width (``head_dim_free``), QK-norm of ``qk_norm`` scope,
    (``gemma``) a score scale, soft-cap and sliding window, (``window``) a sliding window,
    (``sinks``, gpt-oss) attention sinks, (``chunk``, Llama 4) chunked attention, and a
    QK-norm of kind ``qk_kind``."""
    att = spec.attention
    need(spec, cls, "attention.kind", att.kind == "mha",
         f"attention {att.kind!r} has no transformers equivalent; use mha")
    need(spec, cls, "attention.output_gate", getattr(att, "output_gate", "none") == "none",
         "a gated attention output is in Qwen3-Next only (not exported)")
    need(spec, cls, "attention.sinks", sinks or not getattr(att, "sinks", False),
         "attention sinks are in gpt-oss only")
    need(spec, cls, "attention.chunk", chunk or getattr(att, "chunk", None) is None,
         "chunked attention is in Llama 4 only")
    need(spec, cls, "attention.clip_qkv", getattr(att, "clip_qkv", None) is None,
         "clamped q/k/v projections are in OLMo 1 only")
    kv = att.n_kv_heads or spec.n_heads
    need(spec, cls, "attention.n_kv_heads", gqa or kv == spec.n_heads,
         f"n_kv_heads={kv}: grouped-query heads are not in this class")
    need(spec, cls, "attention.head_dim", head_dim_free or head_dim(spec) *
         spec.n_heads == spec.emb_dim, "a head width other than emb_dim / n_heads is not "
         "in this class")
    if att.qk_norm is None:
        need(spec, cls, "attention.qk_norm", qk_norm is None or gemma,
             f"this class always has QK-norm ({qk_norm} scope)")
    else:
        need(spec, cls, "attention.qk_norm", qk_norm is not None,
             "QK-norm is not in this class (Qwen3: per head, OLMo 2: per projection, "
             "Gemma 3: per head; each with RMSNorm)")
        need(spec, cls, "attention.qk_norm_scope", att.qk_norm_scope == qk_norm,
             f"qk_norm_scope {att.qk_norm_scope!r}: this class normalises per {qk_norm}")
        need(spec, cls, "attention.qk_norm.kind", att.qk_norm.kind == qk_kind,
             f"QK-norm {att.qk_norm.kind!r}: this class uses {qk_kind}")
        need(spec, cls, "attention.qk_norm.eps", att.qk_norm.eps == spec.norm.eps,
             f"QK-norm eps {att.qk_norm.eps} differs from the norm's {spec.norm.eps}; the "
             "class uses one rms_norm_eps for both")
    if not gemma:
        need(spec, cls, "attention.window", window or att.window is None,
             "a sliding window is in Mistral (every layer, RMSNorm, glu, no biases), Gemma "
             "2/3, gpt-oss and SmolLM3 only")
        need(spec, cls, "attention.softcap", att.softcap is None,
             "score soft-capping is in Gemma 2 only")
        need(spec, cls, "attention.scale", att.scale is None or
             abs(att.scale - head_dim(spec) ** -0.5) < 1e-12,
             "a score scale other than 1/sqrt(head_dim) is in Gemma 2/3 only")


def check_common(spec: Spec, cls: str, *, norm: str, rotary: bool, final_norm: bool = True,
                 embedding_norm: bool = False, head_bias: bool = False,
                 token_dim: bool = False) -> None:
    """What every class shares: family gpt, a final norm (unless ``final_norm`` is false: the
    class may lack it), shortcuts, no per-layer layout, no Gemma-only option, an embedding
    norm, an output head bias and projected token embeddings only where the class has them
    (``embedding_norm``, ``head_bias``, ``token_dim``), the norm kind ``norm`` and, with
    ``rotary``, a full rotation."""
    need(spec, cls, "final_norm", spec.final_norm or not final_norm,
         "this transformers class has a final norm")
    need(spec, cls, "residual.shortcut", getattr(spec.residual, "shortcut", True),
         "residuals without the shortcut are not in transformers")
    need(spec, cls, "norm.kind", spec.norm.kind == norm,
         f"norm {spec.norm.kind!r}: this class uses {'LayerNorm' if norm == 'layer' else 'RMSNorm'}")
    need(spec, cls, "scale_embeddings", not getattr(spec, "scale_embeddings", False),
         "scaled embeddings are in Gemma only")
    need(spec, cls, "logit_softcap", getattr(spec, "logit_softcap", None) is None,
         "logit soft-capping is in Gemma only")
    need(spec, cls, "embedding_norm", embedding_norm or not getattr(spec, "embedding_norm", False),
         "a norm on the embeddings is in BLOOM only")
    need(spec, cls, "head_bias", head_bias or not getattr(spec, "head_bias", False),
         "an output head bias is in GPT-J and Phi only")
    need(spec, cls, "token_dim", token_dim or getattr(spec, "token_dim", None) in
         (None, spec.emb_dim), "token embeddings of their own width are in OPT only")
    need(spec, cls, "emb_multiplier", getattr(spec, "emb_multiplier", None) is None,
         "an embedding multiplier is in Granite only")
    need(spec, cls, "logit_scale", getattr(spec, "logit_scale", None) is None,
         "a logit scale is in Cohere and Granite only")
    need(spec, cls, "residual.branch_scale", getattr(spec.residual, "branch_scale", 1.0) == 1.0,
         "a residual branch multiplier is in Granite only")
    need(spec, cls, "norm.affine", getattr(spec.norm, "affine", True),
         "a LayerNorm without parameters is in OLMo 1 only")
    if spec.layout is not None:
        same = all(spec.layer_spec(i).components() == spec.components()
                   for i in range(spec.n_layers))
        need(spec, cls, "layout", same, "per-layer components are in Gemma (sliding/full "
             "attention) only")
    if rotary:
        fraction = spec.positional.fraction
        need(spec, cls, "positional.fraction", fraction == 1.0,
             f"fraction={fraction}: this class rotates every head dim")


def check_dropout(spec: Spec, cls: str, places: tuple[str, ...]) -> None:
    """Warn of dropout the class has no place for (only ``places`` are kept)."""
    lost = [p for p in ("emb", "attn", "resid") if p not in places and spec.drop(p) > 0]
    if lost:
        warn(f"{cls} has no {', '.join(p + ' dropout' for p in lost)}: the exported model "
             "trains without it (its logits in eval mode are the same)")


def zero_bias(state: dict[str, torch.Tensor], key: str, size: int, what: str,
              warned: list[str]) -> None:
    """A bias the variant lacks, exported as zeros (same logits; HF then trains it)."""
    if key not in state:
        state[key] = torch.zeros(size)
        if what not in warned:
            warned.append(what)


def warn_zero_biases(cls: str, warned: list[str]) -> None:
    if warned:
        warn(f"{cls} has biases the variant lacks ({', '.join(warned)}): exported as zeros, "
             "so the logits are the same, but training the exported model trains them")


def rope(spec: Any, fraction: bool = False, context: int | None = None,
         cls: str = "transformers") -> dict[str, Any]:
    """``rope_parameters`` of a rotary positional (the inverse of :func:`rotary`, scaling
    included); ``context``: the exported max_position_embeddings, which must be the
    original context of a dynamic scaling (Hugging Face grows its base past it)."""
    out: dict[str, Any] = {"rope_type": "default", "rope_theta": float(spec.theta)}
    if fraction:
        out["partial_rotary_factor"] = float(spec.fraction)
    kind = getattr(spec, "scaling", "none")
    if kind == "none":
        return out
    out["rope_type"] = kind
    out["factor"] = float(spec.factor)
    if kind == "dynamic":
        if context is not None and spec.original_context != context:
            raise ConversionError.at(["positional", "original_context"], (
                f"dynamic scaling from original_context={spec.original_context} differs from "
                f"context_length={context}; Hugging Face grows the base past "
                f"max_position_embeddings, so set them equal (exporting to {cls})"))
        return out
    if kind != "linear":
        out["original_max_position_embeddings"] = int(spec.original_context)
    if kind == "llama3":
        out["low_freq_factor"] = float(spec.low_freq_factor)
        out["high_freq_factor"] = float(spec.high_freq_factor)
    if kind == "yarn":
        out.update(beta_fast=float(spec.beta_fast), beta_slow=float(spec.beta_slow),
                   truncate=bool(spec.truncate))
        out.update({k: float(getattr(spec, k)) for k in ("mscale", "mscale_all_dim")
                    if getattr(spec, k) is not None})
    if kind == "longrope":
        out.update(short_factor=list(spec.short_factor), long_factor=list(spec.long_factor))
    if kind in ("yarn", "longrope") and spec.attention_factor is not None:
        out["attention_factor"] = float(spec.attention_factor)
    return out


def token_ids(spec: Spec, config_cls: Any) -> dict[str, Any]:
    """The class's default special token ids that lie outside the spec's vocabulary, set to
    None (they are the tokenizer's to set)."""
    names = ("bos_token_id", "eos_token_id", "pad_token_id")
    return {n: None for n in names if isinstance(getattr(config_cls, n, None), int)
            and getattr(config_cls, n) >= spec.vocab_size}


def rms_decoder(cfg: Any, bias: bool, eps: float | None = None) -> dict[str, Any]:
    """The model keys every Llama-like config shares (pre-norm RMSNorm decoder, no feed-
    forward or norm biases; ``bias`` on the attention projections; the norms' ``eps``, by
    default ``rms_norm_eps``; the activation ``hidden_act``, by default silu); the caller
    adds the feed-forward, attention and positional."""
    return {
        "family": "gpt", "vocab_size": cfg.vocab_size,
        "context_length": cfg.max_position_embeddings, "emb_dim": cfg.hidden_size,
        "n_heads": cfg.num_attention_heads, "n_layers": cfg.num_hidden_layers,
        **dropouts(0.0, getattr(cfg, "attention_dropout", 0.0) or 0.0, 0.0),
        "qkv_bias": bias, "attn_out_bias": bias, "ffn_bias": False, "norm_bias": False,
        "tie_weights": bool(cfg.tie_word_embeddings),
        "norm": {"kind": "rms", "eps": cfg.rms_norm_eps if eps is None else eps},
        "activation": activation("hidden_act", getattr(cfg, "hidden_act", "silu")),
    }


def ends_state(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Token embedding, final norm and output head of a ``model.*`` / ``lm_head`` model."""
    return {"embed.tok_emb.weight": sd["model.embed_tokens.weight"],
            "final_norm.scale": sd["model.norm.weight"], "out_head.weight": sd["lm_head.weight"]}


def layers(spec: Spec, cls: str, slots: tuple[str, ...]) -> list[Spec]:
    """Each layer's spec, refusing a layer whose components differ from the model's in a
    slot outside ``slots`` (the ones ``cls`` lets vary by layer)."""
    out = []
    for i in range(spec.n_layers):
        layer = spec.layer_spec(i)
        for slot, comp in layer.components().items():
            if slot not in slots and comp != getattr(spec, slot):
                alike = (f"differ only in {', '.join(slots)}" if slots else "are all alike")
                refuse(f"layout.{slot}", cls, f"layer {i}'s {slot} differs from the model's; "
                       f"the layers of this class {alike}")
        out.append(layer)
    return out


def one(spec: Spec, cls: str, loc: str, values: list[Any], what: str) -> Any:
    """The single value ``values`` hold (None when empty); refuses two or more at ``loc``."""
    distinct: list[Any] = []
    for value in values:
        if value not in distinct:
            distinct.append(value)
    need(spec, cls, loc, len(distinct) <= 1,
         f"{what} {distinct}: this class has one for every layer")
    return distinct[0] if distinct else None


#: the ``moe`` options and their plain values: an option a class lacks must keep it
MOE_PLAIN: dict[str, Any] = {
    "router": "softmax_topk", "renormalize": True, "n_shared_experts": 0, "shared_gate": False,
    "z_loss_coef": 0.0, "bias_update_rate": 0.0, "capacity_factor": None, "n_group": None,
    "group_score": "max", "routed_scaling_factor": 1.0, "scale_input": False,
    "router_bias": False, "choice_bias": False}


def check_moe(spec: Spec, cls: str, ff: Spec, loc: str, *, free: tuple[str, ...] = (),
              **want: Any) -> None:
    """A ``moe`` feed-forward ``ff`` (at spec path ``loc``) whose options are ``want`` or, for
    those not named, plain (:data:`MOE_PLAIN`); options in ``free`` may take any value."""
    need(spec, cls, f"{loc}.kind", ff.kind == "moe",
         f"feedforward {ff.kind!r}: this class's sparse layers are a mixture of experts (moe)")
    expert = want.pop("expert", "glu")
    need(spec, cls, f"{loc}.expert.kind", ff.expert.kind == expert,
         f"expert {ff.expert.kind!r}: this class's experts are {expert}")
    for name, plain in {**MOE_PLAIN, **want}.items():
        value = getattr(ff, name)
        if name in free or name == "group_score" and ff.n_group is None:
            continue
        need(spec, cls, f"{loc}.{name}", value == plain,
             f"{name}={value!r}: this class has {plain!r} only")


def rotary_parameters(spec: Spec, cls: str, specs: list[Spec]) -> dict[str, Any]:
    """The ``rope_parameters`` of the one rotary positional of the rotary layers among
    ``specs`` (each rotary over every head dim, or NoPE: ``positional: none``), scaling
    included; the model's base, unscaled, when none rotates."""
    for layer in specs:
        pos = layer.positional
        need(spec, cls, "layout.positional", pos.kind in ("rotary", "none") or (
            pos.kind == "query_temperature" and cls == "Llama4ForCausalLM"),
             f"positional {pos.kind!r}: this class's layers are rotary or NoPE (none; Llama 4 "
             "also query_temperature)")
        need(spec, cls, "layout.positional.fraction", pos.kind != "rotary" or pos.fraction == 1.0,
             f"fraction={getattr(pos, 'fraction', None)}: this class rotates every head dim")
    rotaries = [layer.positional for layer in specs if layer.positional.kind == "rotary"]
    pos = one(spec, cls, "layout.positional", rotaries, "rotary positionals")
    if pos is None:
        return {"rope_type": "default",
                "rope_theta": float(getattr(spec.positional, "theta", 10_000.0))}
    return rope(pos, False, spec.context_length, cls)


def sliding_windows(spec: Spec, cls: str, specs: list[Spec]) -> tuple[list[int | None], int | None]:
    """Each layer's window among ``specs`` and the one window of the windowed layers (None
    when none has one); refuses layers whose attentions differ apart from the window (each
    an ``mha`` of ``cls``: grouped-query heads of width emb_dim / n_heads), or two windows."""
    for layer in specs:
        check_attention(layer, cls, gqa=True, head_dim_free=False, window=True)
    one(spec, cls, "layout.attention", [layer.attention.model_copy(update={"window": None})
                                        for layer in specs], "attentions (apart from the window)")
    windows = [layer.attention.window for layer in specs]
    return windows, one(spec, cls, "layout.attention.window", [w for w in windows if w],
                        "windows")


def check_classic(spec: Spec, cls: str, *, residuals: tuple[str, ...], gqa: bool,
                  rotary: bool = False, final_norm: bool = True, embedding_norm: bool = False,
                  head_bias: bool = False, token_dim: bool = False,
                  norm_shift: bool = True) -> None:
    """A GPT-2-era class (Falcon, GPT-J, OPT, BLOOM, MPT, GPTBigCode): what
    :func:`check_common` checks with LayerNorm, an ``mha`` of emb_dim / n_heads wide heads
    (grouped-query with ``gqa``), a residual among ``residuals``, a plain MLP and, without
    ``norm_shift``, LayerNorms without a shift."""
    check_common(spec, cls, norm="layer", rotary=rotary, final_norm=final_norm,
                 embedding_norm=embedding_norm, head_bias=head_bias, token_dim=token_dim)
    check_attention(spec, cls, gqa=gqa, head_dim_free=False)
    need(spec, cls, "residual.kind", spec.residual.kind in residuals,
         f"residual {spec.residual.kind!r}: this class is {' or '.join(residuals)}")
    need(spec, cls, "feedforward.kind", spec.feedforward.kind == "mlp",
         f"feedforward {spec.feedforward.kind!r}: this class has a plain MLP")
    need(spec, cls, "norm_bias", norm_shift or not spec.norm_bias,
         "this class's LayerNorms have no shift; set norm_bias: false")
