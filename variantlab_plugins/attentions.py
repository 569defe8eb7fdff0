"""Multi-head attention (Vaswani et al. 2017) with grouped-query heads, QK-norm and a sliding
window: one parameter layout, two implementations (``naive``, ``sdpa``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import (
    Field,
    PositiveFloat,
    PositiveInt,
    SerializeAsAny,
    ValidationInfo,
    field_validator,
)
from torch import nn

from variantlab import ComponentSpec, hookimpl
from variantlab.model.positions import Positions, position_ids_from_mask
from variantlab.model.roles import declare_role
from variantlab.model.specs import context_registry, resolve_component
from variantlab_plugins.masks import attend_mask, dead_rows, mask_and_dead, masked_scores


class MHASpec(ComponentSpec):
    """Multi-head scaled dot-product attention (Vaswani et al. 2017), optionally with
    grouped-query heads (Ainslie et al. 2023), QK-norm (Dehghani et al. 2023; Wortsman et al.
    2023) and a sliding window (Beltagy et al. 2020; Mistral, Jiang et al. 2023)."""

    kind: Literal["mha"] = "mha"
    added_options: ClassVar[tuple[str, ...]] = ("scale", "softcap", "output_gate", "sinks",
                                                "chunk", "clip_qkv")
    walk_examples: ClassVar[tuple[dict, ...]] = (  # tests/test_registry_walk.py tries these
        {"kind": "mha", "n_kv_heads": 2, "qk_norm": {"kind": "rms"}, "window": 4},
        {"kind": "mha", "scale": 0.125, "softcap": 5.0, "window": 3},
        {"kind": "mha", "impl": "sdpa", "n_kv_heads": 1, "head_dim": 12,
         "qk_norm": {"kind": "layer"}, "qk_norm_scope": "projection"},
        {"kind": "mha", "output_gate": "elementwise", "n_kv_heads": 2},
        {"kind": "mha", "impl": "sdpa", "output_gate": "headwise", "sinks": True, "window": 3},
        {"kind": "mha", "sinks": True, "n_kv_heads": 2, "chunk": 3,
         "qk_norm": {"kind": "l2"}},
        {"kind": "mha", "n_kv_heads": 2, "clip_qkv": 2.0, "qk_norm": {"kind": "layer"},
         "qk_norm_scope": "each_head"},
    )
    fast_impl: ClassVar[str | None] = "sdpa"  # kernels: fast, impl unset
    impl: Literal["naive", "sdpa"] = Field(
        "naive", description="naive: explicit softmax(QK^T/sqrt(d))V; sdpa: torch's fused kernel"
    )
    n_kv_heads: PositiveInt | None = Field(
        None, description="key/value heads, dividing n_heads (grouped-query attention, Ainslie "
        "et al. 2023); 1 = multi-query; unset = n_heads")
    head_dim: PositiveInt | None = Field(
        None, description="width of each head; unset = emb_dim // n_heads (Qwen3 sets its own)")
    qk_norm: SerializeAsAny[ComponentSpec] | None = Field(
        None, description="a norm {kind: rms|layer|...} on queries and keys before the scores "
        "(and before rotary); unset or none = no QK-norm",
        json_schema_extra={"variantlab_slot": "norm"})
    qk_norm_scope: Literal["head", "projection", "each_head"] = Field(
        "head", description="head: one norm over each head's head_dim, shared by the heads "
        "(Qwen3); projection: over the whole query / key projection (OLMo2); each_head: a "
        "norm over head_dim per head, each with its own weights (Cohere, StableLM)")
    window: PositiveInt | None = Field(
        None, description="sliding window: each query sees at most this many most recent keys "
        "(Mistral); in bidirectional attention, keys closer than this; unset = all")

    scale: PositiveFloat | None = Field(
        None, description="the scores' multiplier; unset = 1/sqrt(head_dim) (Gemma: "
        "query_pre_attn_scalar^-0.5)")
    softcap: PositiveFloat | None = Field(
        None, description="soft-cap the scaled scores to (-softcap, softcap) with "
        "softcap * tanh(score / softcap) before the mask (Gemma 2); needs impl naive")

    output_gate: Literal["none", "elementwise", "headwise"] = Field(
        "none", description="gated attention (Qiu et al. 2025; Qwen3-Next): the heads' "
        "output times sigmoid(W_gate x) before the output projection; elementwise: one gate "
        "per channel (n_heads * head_dim, Qwen3-Next), headwise: one per head; none")

    sinks: bool = Field(
        False, description="attention sinks (gpt-oss, OpenAI 2025; Xiao et al. 2023): a "
        "learned logit per head that takes part in the softmax with no value, so a head can "
        "attend to nothing; starts at 0 (softmax + 1 in the denominator, Miller 2023)")

    chunk: PositiveInt | None = Field(
        None, description="chunked local attention (Llama 4's attention_chunk_size): "
        "positions in chunks of this many, counted from the first real token, and a query "
        "sees only the keys of its own chunk; unset = none")
    clip_qkv: PositiveFloat | None = Field(
        None, description="clamp the query, key and value projections to [-c, c] before "
        "anything else reads them (OLMo 1's clip_qkv, Groeneveld et al. 2024); unset = none")

    @field_validator("qk_norm", mode="before")
    @classmethod
    def _resolve_norm(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None or value == "none" or isinstance(value, ComponentSpec):
            return None if value == "none" else value
        return resolve_component("norm", value, context_registry(info, "attention.qk_norm"))

    def errors(self, model) -> list[tuple[str, str]]:
        if self.softcap is not None and self.impl == "sdpa":
            return [("softcap", "torch's fused attention cannot soft-cap the scores; use "
                     "impl: naive with softcap")]
        kv, heads = self.n_kv_heads, model.n_heads
        if kv is not None and heads % kv:
            choices = ", ".join(str(h) for h in range(1, heads + 1) if heads % h == 0)
            return [("n_kv_heads", f"n_kv_heads={kv} does not divide n_heads={heads}; choose "
                     f"one of {choices}")]
        return []


class EachHead(nn.ModuleList):
    """A norm per head, each applied to its own head: (B, H, T, head_dim) in and out (the
    QK-norms of Cohere and StableLM, ``qk_norm_scope: each_head``)."""

    def forward(self, x):  # (B, H, T, hd)
        return torch.stack([norm(x[:, h]) for h, norm in enumerate(self)], dim=1)


class MultiHeadAttention(nn.Module):
    """softmax(Q K^T / sqrt(head_dim) + bias) V per head, dropout on the attention weights.

    ``naive`` is the seeds' explicit form; ``sdpa`` calls F.scaled_dot_product_attention
    (FlashAttention / memory-efficient kernels where available). Same parameters either way.
    Keys and values have ``n_kv_heads`` heads, each shared by n_heads / n_kv_heads query
    heads. With ``output_gate`` the heads' output is multiplied by sigmoid(W_gate x) (Qwen3-Next
    gated attention). Self-attention applies the model's ``positions`` (rotary, ALiBi bias);
    cross-attention does not. A query that may see no key gives a zero output.
    """

    def __init__(self, emb_dim: int, n_heads: int, drop_rate: float, qkv_bias: bool,
                 causal: bool, spec: MHASpec, positions: Positions | None = None,
                 make_norm: Callable[..., nn.Module] | None = None, out_bias: bool = True):
        super().__init__()
        self.n_heads, self.n_kv_heads = n_heads, spec.n_kv_heads or n_heads
        self.head_dim = spec.head_dim or emb_dim // n_heads
        self.causal, self.impl, self.drop_rate = causal, spec.impl, drop_rate
        self.window, self.scope, self.chunk = spec.window, spec.qk_norm_scope, spec.chunk
        self.scale, self.softcap, self.clip = spec.scale, spec.softcap, spec.clip_qkv
        q_dim, kv_dim = n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        self.W_query = nn.Linear(emb_dim, q_dim, bias=qkv_bias)
        self.W_key = nn.Linear(emb_dim, kv_dim, bias=qkv_bias)
        self.W_value = nn.Linear(emb_dim, kv_dim, bias=qkv_bias)
        self.out_proj = nn.Linear(q_dim, emb_dim, bias=out_bias)
        gates = {"elementwise": q_dim, "headwise": n_heads}.get(spec.output_gate)
        # Qwen3-Next computes the gate in q_proj (per head [query, gate]); here its own Linear
        self.W_gate = nn.Linear(emb_dim, gates, bias=qkv_bias) if gates else None
        # one learned logit per head beside the scores (gpt-oss); zeros: softmax off by one
        self.sinks = nn.Parameter(torch.zeros(n_heads)) if spec.sinks else None
        for role, linear in (("query", self.W_query), ("key", self.W_key),
                             ("value", self.W_value), ("attn_out", self.out_proj)):
            declare_role(linear, role)  # read by the inits (normal, deepnorm)
        self.dropout = nn.Dropout(drop_rate)
        self.q_norm: nn.Module | None = None
        self.k_norm: nn.Module | None = None
        if spec.qk_norm is not None:
            if make_norm is None:
                raise TypeError("qk_norm needs make_norm (build_model passes the model's; "
                                "pass one when building the attention by hand)")
            make = make_norm
            if self.scope == "each_head":  # one norm per head, its weights its own
                self.q_norm = EachHead([make(self.head_dim, spec.qk_norm)
                                        for _ in range(n_heads)])
                self.k_norm = EachHead([make(self.head_dim, spec.qk_norm)
                                        for _ in range(self.n_kv_heads)])
            else:
                per_head = self.scope == "head"
                self.q_norm = make(self.head_dim if per_head else q_dim, spec.qk_norm)
                self.k_norm = make(self.head_dim if per_head else kv_dim, spec.qk_norm)
        # a reference, not a submodule: the positions live (once) in the token embedding
        self.__dict__["positions"] = positions if positions is not None else Positions()
        # the dynamics probe's hook point: while ``record_stats`` is true, each forward
        # leaves ``last_stats`` = {"max_logit", "entropy", "first_token_mass"} and, with
        # sinks, "sink_mass" (both impls alike: computed from q and k, :func:`attention_stats`)
        self.record_stats, self.last_stats = False, None

    def split_heads(self, x, n):  # (B, T, n * head_dim) -> (B, n, T, head_dim)
        b, t, _ = x.shape
        return x.view(b, t, n, self.head_dim).transpose(1, 2)

    def forward(self, x, memory=None, key_padding_mask=None, position_ids=None):
        b, t, _ = x.shape
        self_attention = memory is None
        kv = x if self_attention else memory  # (B, S, D)
        queries, keys = self.W_query(x), self.W_key(kv)  # (B, T, H*hd), (B, S, H_kv*hd)
        values = self.W_value(kv)  # (B, S, H_kv*hd)
        if self.clip is not None:  # OLMo 1: every projection clamped to [-clip, clip]
            queries, keys, values = (p.clamp(-self.clip, self.clip)
                                     for p in (queries, keys, values))
        if self.q_norm is not None and self.scope == "projection":
            queries, keys = self.q_norm(queries), self.k_norm(keys)
        queries = self.split_heads(queries, self.n_heads)  # (B, H, T, hd)
        keys = self.split_heads(keys, self.n_kv_heads)  # (B, H_kv, S, hd)
        values = self.split_heads(values, self.n_kv_heads)  # (B, H_kv, S, hd)
        if self.q_norm is not None and self.scope != "projection":
            queries, keys = self.q_norm(queries), self.k_norm(keys)
        bias = None
        if self_attention:
            queries, keys = self.positions.rotate(queries, keys, position_ids)
            bias = self.positions.score_bias(  # (H, T, S) or None
                self.n_heads, t, t, queries.device, queries.dtype)
        if self.n_kv_heads != self.n_heads:
            group = self.n_heads // self.n_kv_heads  # query heads per key/value head
            keys = keys.repeat_interleave(group, dim=1)  # (B, H, S, hd)
            values = values.repeat_interleave(group, dim=1)  # (B, H, S, hd)
        window = self.window if self_attention else None
        if self.chunk is not None and self_attention:
            allowed = same_chunk(attend_mask(t, keys.shape[2], self.causal, window,
                                             key_padding_mask, x.device),
                                 self.chunk, t, position_ids, key_padding_mask, x.device)
            dead = dead_rows(allowed)
        else:  # allowed: None or (.., T, S); dead: None or (.., T, 1), queries that see no key
            allowed, dead = mask_and_dead(t, keys.shape[2], self.causal, window,
                                          key_padding_mask, x.device)
        if dead is not None:
            allowed = allowed | dead  # let them attend uniformly; their output is zeroed
        if self.record_stats:
            self.last_stats = attention_stats(queries, keys, allowed, bias, self.head_dim,
                                              self.scale, self.softcap, self.sinks)
        attend = self.sdpa if self.impl == "sdpa" else self.naive
        context = attend(queries, keys, values, allowed, bias)  # (B, H, T, hd)
        if dead is not None:
            context = context.masked_fill(dead, 0.0)
        context = context.transpose(1, 2)  # (B, T, H, hd)
        if self.W_gate is not None:
            gate = torch.sigmoid(self.W_gate(x)).view(b, t, self.n_heads, -1)  # (B, T, H, hd|1)
            context = context * gate
        context = context.reshape(b, t, self.n_heads * self.head_dim)
        return self.out_proj(context)  # (B, T, D)

    def state_size(self, t: int) -> int:
        """Numbers a causal decoder keeps per sequence after ``t`` tokens: the key and value
        cache, n_kv_heads * head_dim each per position (the last ``window`` positions)."""
        kept = t if self.window is None else min(t, self.window)
        kept = kept if self.chunk is None else min(kept, self.chunk)
        return 2 * self.n_kv_heads * self.head_dim * kept

    def naive(self, queries, keys, values, allowed, bias):
        attn_scores = queries @ keys.transpose(2, 3)  # (B, H, T, S)
        if self.scale is not None or self.softcap is not None:
            attn_scores = self.capped(attn_scores)
        if allowed is not None:
            attn_scores = masked_scores(attn_scores, allowed)
        if self.scale is None and self.softcap is None:
            attn_scores = attn_scores / math.sqrt(self.head_dim)
        if bias is not None:
            attn_scores = attn_scores + bias  # (B, H, T, S)
        if self.sinks is None:
            attn_weights = torch.softmax(attn_scores, dim=-1)
        else:  # the sink's column takes part in the softmax, then is dropped (no value)
            b, h, t, _ = attn_scores.shape
            sink = self.sinks.to(attn_scores.dtype).view(1, h, 1, 1).expand(b, h, t, 1)
            attn_weights = torch.softmax(torch.cat([attn_scores, sink], -1), dim=-1)[..., :-1]
        attn_weights = self.dropout(attn_weights)
        return attn_weights @ values  # (B, H, T, hd)

    def capped(self, attn_scores):  # (B, H, T, S), unmasked
        """Scores times ``scale`` (default 1/sqrt(head_dim)), then soft-capped (Gemma 2:
        softcap * tanh(score / softcap)); the mask comes after, so masked keys stay -inf."""
        attn_scores = attn_scores * (self.scale or self.head_dim ** -0.5)
        if self.softcap is not None:
            attn_scores = torch.tanh(attn_scores / self.softcap) * self.softcap
        return attn_scores

    def sdpa(self, queries, keys, values, allowed, bias):
        drop = self.drop_rate if self.training else 0.0
        t, s = queries.shape[2], keys.shape[2]
        kw = {"dropout_p": drop} if self.scale is None else {"dropout_p": drop, "scale": self.scale}
        if self.sinks is not None:
            return F.scaled_dot_product_attention(
                *with_sink_key(queries, keys, values, allowed, bias, self.sinks), **kw)
        if bias is None and allowed is None:
            return F.scaled_dot_product_attention(queries, keys, values, **kw)
        if bias is None:
            plain_causal = self.causal and t == s and allowed.dim() == 2 and self.window is None
            if plain_causal:
                return F.scaled_dot_product_attention(queries, keys, values, is_causal=True, **kw)
            return F.scaled_dot_product_attention(queries, keys, values, allowed, **kw)
        if allowed is not None:
            bias = bias.masked_fill(~allowed, -torch.inf)  # (.., H, T, S)
        return F.scaled_dot_product_attention(queries, keys, values, bias, **kw)


def same_chunk(allowed, chunk: int, t: int, position_ids, key_padding_mask, device):
    """``allowed`` (None, (T, T) or (B, 1, T, T)) and-ed with "key j in query i's chunk":
    positions // chunk equal, positions from ``position_ids`` (B, T), else counted from the
    first unpadded token (as Hugging Face's chunked mask counts from the left padding)."""
    if position_ids is None and key_padding_mask is not None:
        position_ids = position_ids_from_mask(~key_padding_mask.bool())
    if position_ids is None:
        position_ids = torch.arange(t, device=device)[None]  # (1, T)
    ids = position_ids // chunk  # (B or 1, T)
    same = (ids[:, :, None] == ids[:, None, :])[:, None]  # (B or 1, 1, T, T)
    return same if allowed is None else allowed & same


def with_sink_key(queries, keys, values, allowed, bias, sinks):
    """Queries, keys and values and a float mask for torch's fused attention that give the
    softmax a sink: one more key and value of zeros, whose score is the mask's last column,
    the head's sink logit (q . 0 = 0). Keys and values (B, H, S, hd) -> (B, H, S + 1, hd);
    mask (B or 1, H, T, S + 1)."""
    h, t, s = queries.shape[1], queries.shape[2], keys.shape[2]
    keys, values = F.pad(keys, (0, 0, 0, 1)), F.pad(values, (0, 0, 0, 1))
    mask = queries.new_zeros(1, h, t, s) if bias is None else bias.expand(1, h, t, s)
    if allowed is not None:  # (B or 1, H, T, S)
        mask = torch.where(allowed, mask, torch.full_like(mask, -torch.inf))
    sink = sinks.to(queries.dtype).view(1, h, 1, 1).expand(mask.shape[0], h, t, 1)
    return queries, keys, values, torch.cat([mask, sink], dim=-1)


@torch.no_grad()
def attention_stats(queries, keys, allowed, bias, head_dim: int, scale: float | None = None,
                    softcap: float | None = None, sinks=None) -> dict[str, float]:
    """The dynamics probe's attention numbers of one forward, from queries (B, H, T, hd),
    keys (B, H, S, hd), the mask ``allowed`` (None or broadcastable to (B, H, T, S)), the
    score ``bias`` and the heads' ``sinks`` logits (None or (H,)):

    - ``max_logit``: the largest q·k/sqrt(head_dim) (q·k times ``scale`` when given) over
      batch, heads and visible positions (before soft-cap, bias and softmax);
    - ``entropy``: the entropy (nats) of the softmax over the keys, mean over batch, heads
      and queries that see a key (the sink's weight left out);
    - ``first_token_mass``: the softmax weight on key 0 (the sink included in the softmax,
      as the attention uses it), mean over batch, heads and the queries after position 0
      that may see key 0 (a query whose window or chunk has left it behind is not counted;
      nan when no query sees it); the attention sink of Xiao et al. 2023, "Efficient
      streaming language models with attention sinks";
    - ``sink_mass`` (with ``sinks``): the weight the learned sink takes, mean over batch,
      heads and every query that sees a key.
    """
    logits = (queries @ keys.transpose(2, 3)).float()  # (B, H, T, S)
    logits = logits / math.sqrt(head_dim) if scale is None else logits * scale
    scores = logits if softcap is None else torch.tanh(logits / softcap) * softcap
    scores = scores if bias is None else scores + bias.float()
    if allowed is not None:
        logits = logits.masked_fill(~allowed, -torch.inf)
        scores = scores.masked_fill(~allowed, -torch.inf)
    p = torch.softmax(scores, dim=-1)
    plogp = torch.where(p > 0, p * torch.log(p.clamp_min(1e-30)), torch.zeros_like(p))
    entropy = -plogp.sum(-1)  # (B, H, T)
    seen = torch.isfinite(scores).any(-1)  # (B, H, T)
    out = {"max_logit": float(logits.max()),
           "entropy": float(entropy[seen].mean()) if bool(seen.any()) else math.nan}
    if sinks is not None:  # the sink's column in the softmax, as the attention has it
        b, h, t, _ = scores.shape
        sink = sinks.detach().float().view(1, h, 1, 1).expand(b, h, t, 1)
        p = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)  # (B, H, T, S + 1)
        out["sink_mass"] = float(p[..., -1][seen].mean()) if bool(seen.any()) else math.nan
    sees_first = torch.isfinite(scores[..., 0])  # (B, H, T): key 0 visible to the query
    sees_first[..., 0] = False  # query 0 sees key 0 alone (causal): left out
    out["first_token_mass"] = (float(p[..., 0][sees_first].mean()) if bool(sees_first.any())
                               else math.nan)
    return out


@hookimpl
def register_attentions(register):
    def build(spec, emb_dim, n_heads, context_length, drop_rate, qkv_bias, causal,
              positions=None, make_norm=None, out_bias=True):
        return MultiHeadAttention(emb_dim, n_heads, drop_rate, qkv_bias, causal, spec,
                                  positions=positions, make_norm=make_norm, out_bias=out_bias)

    register("mha", MHASpec, build)
