"""Multi-head latent attention (MLA; DeepSeek-AI 2024, "DeepSeek-V2", sec. 2.1; DeepSeek-V3
technical report, sec. 2.1.1) for the attention slot: ``attention: {kind: mla, ...}``.

Keys and values come from one low-rank latent per token, c = norm(W_DKV x) (``kv_lora_rank``
numbers), expanded per head by W_UK (keys' content part, ``qk_nope_head_dim``) and W_UV (values,
``v_head_dim``); a decoupled rotary key k_R = RoPE(W_KR x) (``qk_rope_head_dim``) is shared by
the heads. Queries are W_Q x, or, with ``q_lora_rank``, W_UQ norm(W_DQ x), split per head into a
content part and a rotary part. A decoder caches c and k_R only:
(kv_lora_rank + qk_rope_head_dim) numbers per token and layer, whatever the number of heads.

The parameters follow Hugging Face's DeepseekV3Attention: ``q_proj`` (or ``q_a_proj``,
``q_a_norm``, ``q_b_proj``), ``kv_a_proj`` (W_DKV and W_KR stacked: latent rows, then rotary
rows), ``kv_a_norm``, ``kv_b_proj`` (per head: W_UK rows, then W_UV rows), ``out_proj``.

Three implementations on the same parameters: ``naive`` (keys and values expanded per head,
explicit softmax), ``sdpa`` (the same through torch's fused kernel), ``absorbed`` (W_UK folded
into the query and W_UV applied after the weighted sum, so attention runs over the latent
itself: how DeepSeek serves MLA, paper sec. 2.1.2 and its inference code).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, PositiveFloat, PositiveInt, SerializeAsAny, ValidationInfo, field_validator
from torch import nn

from variantlab import ComponentSpec, hookimpl
from variantlab.model.positions import Positions
from variantlab.model.roles import declare_role
from variantlab.model.specs import context_registry, resolve_component
from variantlab_plugins.masks import mask_and_dead, masked_scores


class MLASpec(ComponentSpec):
    """Multi-head latent attention (DeepSeek-V2, DeepSeek-AI 2024; DeepSeek-V3, Kimi K2):
    keys and values from a cached low-rank latent, a decoupled shared rotary key."""

    kind: Literal["mla"] = "mla"
    walk_examples: ClassVar[tuple[dict, ...]] = (  # tests/test_registry_walk.py tries these
        {"kind": "mla", "impl": "absorbed", "kv_lora_rank": 12, "q_lora_rank": 10,
         "qk_rope_head_dim": 4, "qk_nope_head_dim": 6, "v_head_dim": 5},
        {"kind": "mla", "impl": "sdpa", "q_lora_rank": 6, "latent_norm": {"kind": "layer"}},
        {"kind": "mla", "scale": 0.3},
    )
    added_options: ClassVar[tuple[str, ...]] = ("scale",)
    fast_impl: ClassVar[str | None] = "sdpa"  # kernels: fast, impl unset
    impl: Literal["naive", "sdpa", "absorbed"] = Field(
        "naive", description="naive: keys and values expanded per head, explicit softmax; "
        "sdpa: the same through torch's fused kernel; absorbed: W_UK folded into the queries "
        "and W_UV after the weighted sum, attention over the latent (DeepSeek's serving form)")
    kv_lora_rank: PositiveInt | None = Field(
        None, description="width of the cached key/value latent; unset = 4 * emb_dim / n_heads "
        "(DeepSeek-V3: 512 with 128 heads of 56)")
    q_lora_rank: PositiveInt | None = Field(
        None, description="width of the low-rank query (W_UQ norm(W_DQ x)); unset = a full "
        "query projection (DeepSeek-V2-Lite)")
    qk_rope_head_dim: PositiveInt | None = Field(
        None, description="rotary part of each query head and of the shared key (even); "
        "unset = half of emb_dim / n_heads, rounded down to even")
    qk_nope_head_dim: PositiveInt | None = Field(
        None, description="content (unrotated) part of each query / key head; unset = "
        "emb_dim / n_heads")
    v_head_dim: PositiveInt | None = Field(
        None, description="width of each value head; unset = emb_dim / n_heads")
    scale: PositiveFloat | None = Field(
        None, description="the score scale; unset = 1/sqrt(qk_nope_head_dim + "
        "qk_rope_head_dim) (DeepSeek with YaRN: that times (0.1 mscale_all_dim ln factor + "
        "1)^2)")
    latent_norm: SerializeAsAny[ComponentSpec] | None = Field(
        None, description="the norm on the key/value latent and on the query latent; unset = "
        "RMSNorm with eps 1e-6 (DeepSeek's)", json_schema_extra={"variantlab_slot": "norm"})

    @field_validator("latent_norm", mode="before")
    @classmethod
    def _resolve_norm(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None or isinstance(value, ComponentSpec):
            return value
        return resolve_component("norm", value, context_registry(info, "attention.latent_norm"))

    def sizes(self, emb_dim: int, n_heads: int) -> dict[str, int]:
        """kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim with defaults filled."""
        head = max(1, emb_dim // n_heads)
        rope = self.qk_rope_head_dim or max(2, head // 2 - (head // 2) % 2)
        return {"kv_lora_rank": self.kv_lora_rank or 4 * head, "qk_rope_head_dim": rope,
                "qk_nope_head_dim": self.qk_nope_head_dim or head,
                "v_head_dim": self.v_head_dim or head}

    def errors(self, model) -> list[tuple[str, str]]:
        rope = self.sizes(model.emb_dim, model.n_heads)["qk_rope_head_dim"]
        if rope % 2:
            return [("qk_rope_head_dim", f"qk_rope_head_dim={rope} is odd; rotary turns pairs "
                     "of dims, choose an even width")]
        return []


def latent_rms(dim: int) -> nn.Module:
    """DeepSeek's latent RMSNorm (eps 1e-6), built without a registry."""
    from variantlab_plugins.norms import RMSNorm, RMSNormSpec

    return RMSNorm(dim, RMSNormSpec(eps=1e-6))


class MultiHeadLatentAttention(nn.Module):
    """MLA with the attention contract of ``mha``: self-attention (causal or not, rotary or
    ALiBi from the model's ``positions`` on the rotary part only), cross-attention to a memory
    (no positions), key padding masks, dropout on the attention weights. A query that may see
    no key gives a zero output."""

    def __init__(self, emb_dim: int, n_heads: int, drop_rate: float, qkv_bias: bool,
                 causal: bool, spec: MLASpec, positions: Positions | None = None,
                 make_norm: Callable[..., nn.Module] | None = None, out_bias: bool = True):
        super().__init__()
        sizes = spec.sizes(emb_dim, n_heads)
        self.n_heads, self.causal, self.impl, self.drop_rate = n_heads, causal, spec.impl, drop_rate
        self.rank, self.rope = sizes["kv_lora_rank"], sizes["qk_rope_head_dim"]
        self.nope, self.dv = sizes["qk_nope_head_dim"], sizes["v_head_dim"]
        self.qk_dim = self.nope + self.rope
        self.scale = spec.scale or self.qk_dim ** -0.5

        def norm(dim: int) -> nn.Module:
            if spec.latent_norm is None or make_norm is None:
                return latent_rms(dim)
            return make_norm(dim, spec.latent_norm)

        q_out = n_heads * self.qk_dim
        self.q_proj: nn.Linear | None = None
        self.q_a_proj: nn.Linear | None = None
        self.q_a_norm: nn.Module | None = None
        self.q_b_proj: nn.Linear | None = None
        if spec.q_lora_rank is None:  # DeepSeek has no bias on the full query projection
            self.q_proj = declare_role(nn.Linear(emb_dim, q_out, bias=False), "query")
        else:
            self.q_a_proj = declare_role(nn.Linear(emb_dim, spec.q_lora_rank, bias=qkv_bias),
                                         "query")
            self.q_a_norm = norm(spec.q_lora_rank)
            self.q_b_proj = declare_role(nn.Linear(spec.q_lora_rank, q_out, bias=False), "query")
        self.kv_a_proj = declare_role(nn.Linear(emb_dim, self.rank + self.rope, bias=qkv_bias),
                                      "key")
        self.kv_a_norm = norm(self.rank)
        self.kv_b_proj = declare_role(
            nn.Linear(self.rank, n_heads * (self.nope + self.dv), bias=False), "value")
        self.out_proj = declare_role(nn.Linear(n_heads * self.dv, emb_dim, bias=out_bias),
                                     "attn_out")
        self.dropout = nn.Dropout(drop_rate)
        # a reference, not a submodule: the positions live (once) in the token embedding
        self.__dict__["positions"] = positions if positions is not None else Positions()

    def queries(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(content, rotary) query parts (B, H, T, nope), (B, H, T, rope) of x (B, T, D)."""
        b, t, _ = x.shape
        if self.q_proj is not None:
            q = self.q_proj(x)
        else:
            assert self.q_a_proj is not None and self.q_a_norm is not None and self.q_b_proj is not None
            q = self.q_b_proj(self.q_a_norm(self.q_a_proj(x)))  # (B, T, H * qk_dim)
        q = q.view(b, t, self.n_heads, self.qk_dim).transpose(1, 2)  # (B, H, T, qk_dim)
        q_nope, q_rope = q.split([self.nope, self.rope], dim=-1)
        return q_nope, q_rope

    def latent(self, kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The cached part: normalised latent (B, S, rank) and rotary key (B, 1, S, rope),
        before rotation, of kv (B, S, D)."""
        c, k_rope = self.kv_a_proj(kv).split([self.rank, self.rope], dim=-1)
        return self.kv_a_norm(c), k_rope[:, None]

    def forward(self, x, memory=None, key_padding_mask=None, position_ids=None):
        b, t, _ = x.shape
        self_attention = memory is None
        kv_in = x if self_attention else memory  # (B, S, D)
        s = kv_in.shape[1]
        q_nope, q_rope = self.queries(x)  # (B, H, T, nope), (B, H, T, rope)
        c, k_rope = self.latent(kv_in)  # (B, S, rank), (B, 1, S, rope)
        bias = None
        if self_attention:
            q_rope, k_rope = self.positions.rotate(q_rope, k_rope, position_ids)
            bias = self.positions.score_bias(self.n_heads, t, s, x.device, x.dtype)  # (H, T, S)
        allowed, dead = mask_and_dead(t, s, self.causal, None, key_padding_mask,
                                      x.device)  # dead: None or (.., T, 1), seeing no key
        if dead is not None:
            allowed = allowed | dead  # let them attend uniformly; their output is zeroed
        if self.impl == "absorbed":
            context = self.absorbed(q_nope, q_rope, c, k_rope, allowed, bias)
        else:
            kv = self.kv_b_proj(c).view(b, s, self.n_heads, self.nope + self.dv).transpose(1, 2)
            k_nope, values = kv.split([self.nope, self.dv], dim=-1)  # (B, H, S, nope | dv)
            keys = torch.cat([k_nope, k_rope.expand(-1, self.n_heads, -1, -1)], dim=-1)
            queries = torch.cat([q_nope, q_rope], dim=-1)  # (B, H, T, qk_dim)
            attend = self.sdpa if self.impl == "sdpa" else self.naive
            context = attend(queries, keys, values, allowed, bias)  # (B, H, T, dv)
        if dead is not None:
            context = context.masked_fill(dead, 0.0)
        context = context.transpose(1, 2).reshape(b, t, self.n_heads * self.dv)
        return self.out_proj(context)  # (B, T, D)

    def weights(self, scores: torch.Tensor, allowed, bias) -> torch.Tensor:
        """Softmax attention weights (B, H, T, S) from unscaled scores."""
        scores = scores * self.scale
        if bias is not None:
            scores = scores + bias
        if allowed is not None:
            scores = masked_scores(scores, allowed)
        return self.dropout(torch.softmax(scores, dim=-1))

    def naive(self, queries, keys, values, allowed, bias):
        """Explicit softmax(Q K^T * scale + bias) V: (B, H, T, qk), (B, H, S, qk), (B, H, S, dv)
        -> (B, H, T, dv)."""
        return self.weights(queries @ keys.transpose(-1, -2), allowed, bias) @ values

    def sdpa(self, queries, keys, values, allowed, bias):
        drop = self.drop_rate if self.training else 0.0
        t, s = queries.shape[2], keys.shape[2]
        if bias is None and self.causal and t == s and allowed is not None and allowed.dim() == 2:
            # plain causal: torch's flash kernel, no (T, S) matrix kept; it needs one head
            # width, so the narrower of (queries, keys) and values is padded with zeros (as
            # DeepSeek's flash-attention path pads the values), which changes no score
            width = max(self.qk_dim, self.dv)
            q, k, v = (F.pad(a, (0, width - a.shape[-1])) for a in (queries, keys, values))
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=drop, is_causal=True,
                                                 scale=self.scale)
            return out[..., :self.dv]  # (B, H, T, dv)
        mask = allowed
        if bias is not None:
            mask = bias if allowed is None else bias.masked_fill(~allowed, -torch.inf)
        return F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask,
                                              dropout_p=drop, scale=self.scale)

    def absorbed(self, q_nope, q_rope, c, k_rope, allowed, bias):
        """Attention over the latent: q_nope W_UK^T per head (B, H, T, rank) scores against
        c (B, S, rank), plus the rotary scores; the weighted sum of c is mapped to each head's
        values by W_UV after the sum. Out (B, H, T, dv)."""
        w = self.kv_b_proj.weight.view(self.n_heads, self.nope + self.dv, self.rank)
        w_uk, w_uv = w[:, :self.nope], w[:, self.nope:]  # (H, nope, rank), (H, dv, rank)
        q_latent = torch.einsum("bhtn,hnr->bhtr", q_nope, w_uk)  # (B, H, T, rank)
        c = c[:, None]  # (B, 1, S, rank): one latent for every head
        scores = q_latent @ c.transpose(-1, -2) + q_rope @ k_rope.transpose(-1, -2)
        summed = self.weights(scores, allowed, bias) @ c  # (B, H, T, rank)
        return torch.einsum("bhtr,hvr->bhtv", summed, w_uv)  # (B, H, T, dv)

    def state_size(self, t: int) -> int:
        """Numbers a causal decoder keeps per sequence after ``t`` tokens: the latent and the
        rotary key, kv_lora_rank + qk_rope_head_dim per position (shared by the heads)."""
        return (self.rank + self.rope) * t


@hookimpl
def register_attentions(register):
    def build(spec, emb_dim, n_heads, context_length, drop_rate, qkv_bias, causal,
              positions=None, make_norm=None, out_bias=True):
        return MultiHeadLatentAttention(emb_dim, n_heads, drop_rate, qkv_bias, causal, spec,
                                        positions=positions, make_norm=make_norm,
                                        out_bias=out_bias)

    register("mla", MLASpec, build)


__all__ = ["MLASpec", "MultiHeadLatentAttention"]
