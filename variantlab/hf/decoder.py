"""The shared Llama-like decoder, both ways: one family is a :class:`Family` (the class, its
config class, config -> spec data, config -> :class:`Layer`, and, for export, spec ->
config options), and everything else is read from those by name.

:class:`Layer` says how one decoder layer names its weights (the two norms, the attention
and its projections, the feed-forward and its projections, the QK-norms) and which of them
carry a bias or a ``(1 + weight)`` scale; :func:`decoder_table` turns it into the family's
weight table (:mod:`variantlab.hf.table`), read on import and written on export. Our side's
names follow the spec's residual: ``pre_norm`` / ``post_sublayer`` (``att.norm``,
``att.sublayer``, ``ff.norm``, ``ff.sublayer``), ``sandwich`` (``norm_in`` / ``norm_out``)
or a parallel block (``res.norm1``, ``res.attention``, ``res.feedforward``).

Export builds the class's config from the spec (:meth:`Family.config`) and then reads it
back through the import (:func:`variantlab.hf.readback.expressed`): the class holds the spec
exactly when the two agree, and the first spec path where they differ is refused by name, so
no family needs its own list of checks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

from .common import (
    Spec,
    activation,
    activation_name,
    check_dropout,
    dropouts,
    head_dim_of,
    period,
    refuse,
    reject,
    rope,
    rotary,
    token_ids,
)
from .readback import expressed
from .table import (
    ATTENTION,
    GLU,
    Pair,
    fused_experts,
    fused_qkv,
    glu,
    interleaved_rows,
    layer_norm,
    load_state,
    permuted,
    qkv_rows,
    same,
)

#: a feed-forward without a gate: our Sequential's two Linears -> HF's names
MLP = {"layers.0": "up_proj", "layers.2": "down_proj"}


@dataclass(frozen=True)
class Layer:
    """How a Llama-like decoder layer of one config names its weights. ``norms``: the HF
    norms before the attention and before the feed-forward (a shared parallel norm: one
    name); ``out_norms``: after each (``sandwich``); ``projections`` / ``ffn``: ours -> HF's
    under ``attention`` / ``mlp`` (``gate_up``: one fused Linear, gate rows first, instead of
    separate gate and up projections)."""

    residual: str = "pre_norm"
    norms: tuple[str, ...] = ("input_layernorm", "post_attention_layernorm")
    out_norms: tuple[str, str] | None = None
    attention: str = "self_attn"
    projections: Mapping[str, str] = field(default_factory=lambda: dict(ATTENTION))
    #: one fused q/k/v Linear whose output rows are laid out per head as (q_h, k_h, v_h)
    #: (Persimmon, as GPT-NeoX); ``projections`` then names the output projection only
    fused_qkv: str | None = None
    qkv_bias: bool = False
    out_bias: bool = False
    qk_norms: tuple[str, str] | None = None
    #: the QK-norms have a weight per head, stored stacked (heads, head_dim) (Cohere; ours:
    #: ``qk_norm_scope: each_head``, a norm per head)
    qk_norm_stacked: bool = False
    mlp: str = "mlp"
    ffn: Mapping[str, str] = field(default_factory=lambda: dict(GLU))
    gate_up: str | None = None
    ffn_bias: bool = False
    #: the activation's parameters (xIELU's alpha_p, alpha_n) under ``mlp.act_fn``, and its
    #: buffers, written on export as these constants (Apertus)
    act_params: tuple[str, ...] = ()
    act_buffers: Mapping[str, float] = field(default_factory=dict)
    #: the norms have a shift (LayerNorm's bias); the QK-norms too
    norm_shift: bool = False
    #: HF's norms scale by (1 + weight) (Gemma, Nemotron's LayerNorm1P): imported as 1 + weight
    plus_one: bool = False
    #: the norms have no weights at all (OLMo 1)
    affine: bool = True
    #: HF rotates interleaved pairs over the first ``rotary_dims`` dims of each head of
    #: ``head_dim``: q/k rows reordered to rotate-half pairs
    rotary_dims: int | None = None
    head_dim: int = 0
    lm_head_bias: bool = False
    #: the layers whose feed-forward is transformers' sparse MoE block (router ``gate``, fused
    #: ``experts``; with ``shared_expert`` a SwiGLU ``shared_expert`` and its sigmoid gate)
    sparse: tuple[bool, ...] = ()
    shared_expert: bool = False
    router: str = "gate"
    #: the router's choice bias under ``mlp`` (DeepSeek-V3's ``gate.e_score_correction_bias``,
    #: GLM-4-MoE; ERNIE 4.5's ``gate.moe_statics.e_score_correction_bias``, stored (1, E)
    #: with ``choice_bias_row``), and with ``shared_experts`` ungated shared experts
    choice_bias: str | None = None
    choice_bias_row: bool = False
    shared_experts: bool = False
    #: without shared experts, transformers still builds them empty (width 0): their hidden
    #: size, to write the empty tensors on export
    empty_shared: int = 0
    prefix: str = "model"
    final_norm: str = "norm"


def _norm(ours: str, theirs: str, layer: Layer, shift: bool) -> list[Pair]:
    if not layer.affine:
        return []
    pairs = layer_norm(ours, theirs, shift)
    if layer.plus_one:  # HF's (1 + weight): ours is the whole scale
        pairs[0] = Pair((f"{ours}.scale",), f"{theirs}.weight", load=lambda t: (t + 1.0,),
                        save=lambda ts: ts[0] - 1.0)
    return pairs


def _linear(ours: str, theirs: str, bias: bool, what: str,
            order: torch.Tensor | None = None) -> Iterator[Pair]:
    yield permuted(f"{ours}.weight", f"{theirs}.weight", order)
    if bias:
        yield permuted(f"{ours}.bias", f"{theirs}.bias", order, what)


def _ours(i: int, residual: str) -> tuple[tuple[str, str], tuple[str, str] | None, str, str]:
    """Layer ``i``'s norms (before attention, before the feed-forward), the norms after each
    (sandwich), the attention and the feed-forward, on our side."""
    block = f"trf_blocks.{i}"
    if residual == "parallel":
        return ((f"{block}.res.norm1", f"{block}.res.norm2"), None, f"{block}.res.attention",
                f"{block}.res.feedforward")
    if residual == "sandwich":
        return ((f"{block}.att.norm_in", f"{block}.ff.norm_in"),
                (f"{block}.att.norm_out", f"{block}.ff.norm_out"),
                f"{block}.att.sublayer", f"{block}.ff.sublayer")
    return ((f"{block}.att.norm", f"{block}.ff.norm"), None, f"{block}.att.sublayer",
            f"{block}.ff.sublayer")


def _constant(theirs: str, value: float | torch.Tensor) -> Pair:
    """A tensor of theirs that no weight of ours holds (a fixed buffer, an empty weight):
    read by nothing, written as ``value``."""
    return Pair((), theirs, load=lambda t: (), save=lambda ts: torch.as_tensor(value))


def _stacked_norm(ours: tuple[str, ...], theirs: str, order: torch.Tensor | None) -> Pair:
    """A QK-norm weight per head stored stacked (heads, head_dim) <-> our norm per head, its
    dims in ``order`` (the q/k rows' reorder within a head; None: as they are)."""
    back = None if order is None else torch.argsort(order)
    return Pair(ours, theirs,
                load=lambda t: tuple((t if order is None else t[:, order]).unbind(0)),
                save=lambda ts: torch.stack(ts) if back is None else torch.stack(ts)[:, back])


def _sparse(ff: str, mlp: str, layer: Layer) -> list[Pair]:
    """Transformers' sparse MoE block at ``mlp`` (as ``layer`` names it) <-> our ``moe``
    feed-forward at ``ff``."""
    pairs = [same(f"{ff}.gate.weight", f"{mlp}.{layer.router}.weight"),
             *fused_experts(ff, f"{mlp}.experts")]
    if layer.choice_bias is not None:  # a buffer (frozen in ERNIE): no optimizer moves it
        row = layer.choice_bias_row
        pairs.append(Pair((f"{ff}.expert_bias",), f"{mlp}.{layer.choice_bias}",
                          load=lambda t: (t.reshape(-1),),
                          save=lambda ts: ts[0][None] if row else ts[0],
                          zeros="expert choice bias", quiet=True))
    if layer.shared_experts:
        pairs += glu(f"{ff}.shared_expert", f"{mlp}.shared_experts")
    elif layer.empty_shared:
        width = layer.empty_shared
        pairs += [_constant(f"{mlp}.shared_experts.{name}.weight", torch.zeros(shape))
                  for name, shape in (("gate_proj", (0, width)), ("up_proj", (0, width)),
                                      ("down_proj", (width, 0)))]
    if layer.shared_expert:
        pairs += glu(f"{ff}.shared_expert", f"{mlp}.shared_expert")
        pairs.append(same(f"{ff}.shared_expert_gate.weight", f"{mlp}.shared_expert_gate.weight"))
    return pairs


def decoder_table(n_layers: int, layer: Layer, n_heads: int, n_kv_heads: int) -> list[Pair]:
    """Every weight of a Llama-like decoder of ``n_layers`` layers named by ``layer``, and
    ours, both ways."""
    top = layer.prefix
    pairs = [same("embed.tok_emb.weight", f"{top}.embed_tokens.weight"),
             *_norm("final_norm", f"{top}.{layer.final_norm}", layer, layer.norm_shift),
             same("out_head.weight", "lm_head.weight")]
    if layer.lm_head_bias:
        pairs.append(same("out_head.bias", "lm_head.bias", "output head bias"))
    orders: dict[str, torch.Tensor | None] = {"W_query": None, "W_key": None}
    in_head = None  # the order of one head's dims (a per-head QK-norm's weight follows it)
    if layer.rotary_dims is not None:
        in_head = interleaved_rows(layer.head_dim, 0, layer.rotary_dims, layer.head_dim)
        for name, heads in (("W_query", n_heads), ("W_key", n_kv_heads)):
            orders[name] = interleaved_rows(heads * layer.head_dim, 0, layer.rotary_dims,
                                            layer.head_dim)
    for i in range(n_layers):
        theirs = f"{top}.layers.{i}"
        norms, out_norms, att, ff = _ours(i, layer.residual)
        for mine, name in zip(norms, layer.norms):
            pairs += _norm(mine, f"{theirs}.{name}", layer, layer.norm_shift)
        for mine, name in zip(out_norms or (), layer.out_norms or ()):
            pairs += _norm(mine, f"{theirs}.{name}", layer, layer.norm_shift)
        if layer.fused_qkv is not None:
            fused = f"{theirs}.{layer.attention}.{layer.fused_qkv}"
            pairs += fused_qkv(att, fused, qkv_rows(n_heads, n_heads, layer.head_dim, "per_head"),
                               layer.qkv_bias, "attention biases")
        for mine, name in layer.projections.items():
            bias = layer.out_bias if mine == "out_proj" else layer.qkv_bias
            pairs += _linear(f"{att}.{mine}", f"{theirs}.{layer.attention}.{name}", bias,
                             "attention biases", orders.get(mine))
        for mine, name, heads in zip(("q_norm", "k_norm"), layer.qk_norms or (),
                                     (n_heads, n_kv_heads)):
            if layer.qk_norm_stacked:
                pairs.append(_stacked_norm(tuple(f"{att}.{mine}.{h}.scale" for h in range(heads)),
                                           f"{theirs}.{layer.attention}.{name}.weight", in_head))
                continue
            if in_head is not None:
                raise ValueError("a QK-norm shared by the heads beside interleaved rotary pairs "
                                 "is not in the Llama-like families")
            pairs += _norm(f"{att}.{mine}", f"{theirs}.{layer.attention}.{name}", layer,
                           layer.norm_shift)
        mlp = f"{theirs}.{layer.mlp}"
        if i < len(layer.sparse) and layer.sparse[i]:
            pairs += _sparse(ff, mlp, layer)
            continue
        if layer.gate_up is not None:
            pairs.append(Pair((f"{ff}.W_gate.weight", f"{ff}.W_up.weight"),
                              f"{mlp}.{layer.gate_up}.weight",
                              load=lambda t: tuple(t.chunk(2, dim=0)),
                              save=lambda ts: torch.cat(ts, dim=0)))
        for mine, name in layer.ffn.items():
            pairs += _linear(f"{ff}.{mine}", f"{mlp}.{name}", layer.ffn_bias,
                             "feed-forward biases")
        pairs += [same(f"{ff}.layers.1.{name}", f"{mlp}.act_fn.{name}")
                  for name in layer.act_params]
        pairs += [_constant(f"{mlp}.act_fn.{name}", value)
                  for name, value in layer.act_buffers.items()]
    return pairs


@dataclass(frozen=True)
class Family:
    """One Llama-like transformers class: ``spec`` (its config -> spec data), ``layer`` (its
    config -> :class:`Layer`), ``options`` (a spec -> its config's options, for export; None:
    import only)."""

    cls: str
    config_cls: str
    spec: Callable[[Any], dict[str, Any]]
    layer: Callable[[Any], Layer]
    options: Callable[[Spec], dict[str, Any]] | None = None
    #: the dropouts the class keeps (others are warned of on export)
    dropouts: tuple[str, ...] = ("attn",)

    def table(self, cfg: Any) -> list[Pair]:
        """The family's weight table for ``cfg``."""
        heads = cfg.num_attention_heads
        kv = getattr(cfg, "num_key_value_heads", None) or heads
        return decoder_table(cfg.num_hidden_layers, self.layer(cfg), heads, kv)

    def state(self, hf: Any) -> dict[str, torch.Tensor]:
        """Our state dict from the family's HF model."""
        return load_state(self.table(hf.config), hf.state_dict())

    def config(self, spec: Spec, cls: str) -> Any:
        """The class's config of ``spec``, refusing what it cannot hold."""
        import transformers

        if self.options is None:
            refuse("model", cls, f"{cls} is import-only")
        check_dropout(spec, cls, self.dropouts)
        config_cls = getattr(transformers, self.config_cls)
        config = config_cls(**self.options(spec), **token_ids(spec, config_cls))
        expressed(spec, cls, config, self.spec)
        return config


def llama_options(spec: Spec, **extra: Any) -> dict[str, Any]:
    """The config options every Llama-like class names alike, read from ``spec`` (the family
    adds and overrides ``extra``; :func:`expressed` then checks the result)."""
    att, pos = spec.attention, spec.positional
    hidden = getattr(spec.feedforward, "hidden_dim", None) or 4 * spec.emb_dim
    options = dict(
        vocab_size=spec.vocab_size, max_position_embeddings=spec.context_length,
        hidden_size=spec.emb_dim, num_hidden_layers=spec.n_layers,
        num_attention_heads=spec.n_heads,
        num_key_value_heads=getattr(att, "n_kv_heads", None) or spec.n_heads,
        head_dim=getattr(att, "head_dim", None) or spec.emb_dim // spec.n_heads,
        intermediate_size=hidden, rms_norm_eps=spec.norm.eps,
        attention_dropout=spec.drop("attn"), tie_word_embeddings=spec.tie_weights,
        hidden_act=activation_name(spec) or spec.activation.kind)
    if pos.kind == "rotary":  # its scaling included
        options["rope_parameters"] = rope(pos, pos.fraction != 1.0, spec.context_length)
    options.update(extra)
    return options



def decoder_spec(cfg: Any, *, eps: float, norm: str = "rms", norm_bias: bool = False,
                 qkv_bias: bool = False, out_bias: bool = False, ffn: str = "glu",
                 ffn_bias: bool = False, act: str = "hidden_act", partial: bool = False,
                 drops: tuple[float, float, float] | None = None,
                 positional: dict[str, Any] | None = None) -> dict[str, Any]:
    """Spec data of a Llama-like config: ``norm`` (rms or layer, with a shift when
    ``norm_bias``) of ``eps``, the biases (a glu's are its own ``bias``), the feed-forward
    kind ``ffn`` (glu or mlp) of width ``intermediate_size``, the activation from the option
    ``act``, rotary (over part of each head when ``partial``), and the (embedding,
    attention, residual) dropouts (default: ``attention_dropout`` only); ``positional``:
    one read by the caller."""
    head_dim = head_dim_of(cfg)
    kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    if drops is None:
        drops = (0.0, getattr(cfg, "attention_dropout", 0.0) or 0.0, 0.0)
    return {
        "family": "gpt", "vocab_size": cfg.vocab_size,
        "context_length": cfg.max_position_embeddings, "emb_dim": cfg.hidden_size,
        "n_heads": cfg.num_attention_heads, "n_layers": cfg.num_hidden_layers,
        **dropouts(*drops),
        "qkv_bias": bool(qkv_bias), "attn_out_bias": bool(out_bias),
        "ffn_bias": bool(ffn_bias) and ffn != "glu", "norm_bias": bool(norm_bias),
        "tie_weights": bool(cfg.tie_word_embeddings),
        # a LayerNorm as transformers computes it (F.layer_norm: same parameters)
        "norm": {"kind": norm, "eps": float(eps), **({"impl": "fused"} if norm == "layer" else {})},
        "activation": activation(act, getattr(cfg, act)),
        "feedforward": {"kind": ffn, "hidden_dim": cfg.intermediate_size,
                        **({"bias": bool(ffn_bias)} if ffn == "glu" else {})},
        "attention": {"kind": "mha", "n_kv_heads": kv,
                      "head_dim": head_dim if head_dim * cfg.num_attention_heads
                      != cfg.hidden_size else None},
        "positional": positional or rotary(cfg, partial=partial, head_dim=head_dim),
    }


#: transformers' layer types and the names of our layer kinds
LAYER_TYPES = {"sliding_attention": "sliding", "full_attention": "full"}


def typed_rotary(cfg: Any, layer_type: str) -> dict[str, Any] | None:
    """The rotary of the layers of ``layer_type`` when ``rope_parameters`` has one per layer
    type (OLMo 3), else None."""
    params = getattr(cfg, "rope_parameters", None) or {}
    if not isinstance(params.get(layer_type), dict):
        return None
    typed = SimpleNamespace(**{**cfg.to_dict(), "rope_parameters": params[layer_type]})
    return rotary(typed, partial=False, head_dim=head_dim_of(cfg))


def typed_layers(cfg: Any, data: dict[str, Any], *, nope_full: bool = False) -> None:
    """Add to ``data`` the layers ``layer_types`` names: ``sliding`` layers attend within
    ``sliding_window``, each type rotates with its own ``rope_parameters`` when the config
    has them per type (else the model's), and with ``nope_full`` full layers do not rotate
    (``positional: none``); one kind for every layer goes on the model itself, more become a
    ``layout`` with the shortest repeating ``pattern``."""
    types = list(cfg.layer_types)
    unknown = sorted(set(types) - set(LAYER_TYPES))
    if unknown:
        reject("layer_types", unknown, f"supported layer types: {', '.join(LAYER_TYPES)}")
    if cfg.sliding_window is None:
        types = ["full_attention"] * len(types)
    per_type = typed_rotary(cfg, "full_attention") is not None
    kinds: dict[str, dict[str, Any]] = {}
    for kind in dict.fromkeys(types):
        slots: dict[str, Any] = {}
        if kind == "sliding_attention":
            slots["attention"] = {**data["attention"], "window": int(cfg.sliding_window)}
        if kind == "full_attention" and nope_full and "sliding_attention" in types:
            slots["positional"] = {"kind": "none"}
        elif per_type:
            slots["positional"] = typed_rotary(cfg, kind)
        kinds[LAYER_TYPES[kind]] = slots
    if per_type:  # the model's own: the full layers' (the embeddings add no position)
        data["positional"] = typed_rotary(cfg, "full_attention")
    if len(kinds) == 1:
        data.update(next(iter(kinds.values())))
    else:
        data["layout"] = {"kinds": kinds, "pattern": [LAYER_TYPES[t] for t in period(types)]}


def layer_types(spec: Spec) -> tuple[list[str], int | None, dict[str, Any]]:
    """Each layer's transformers type (``sliding_attention`` where a window is set), the
    one window (None without), and the rotary positional of each type."""
    types: list[str] = []
    windows: set[int] = set()
    positionals: dict[str, Any] = {}
    for i in range(spec.n_layers):
        layer = spec.layer_spec(i)
        window = getattr(layer.attention, "window", None)
        kind = "sliding_attention" if window else "full_attention"
        if window:
            windows.add(window)
        types.append(kind)
        if layer.positional.kind == "rotary":
            positionals.setdefault(kind, layer.positional)
    window = windows.pop() if len(windows) == 1 else None
    return types, window, positionals
