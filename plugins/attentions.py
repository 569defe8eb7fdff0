"""Multi-head attention (Vaswani et al. 2017): one parameter layout, two implementations."""

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from variantlab import ComponentSpec, hookimpl


class MHASpec(ComponentSpec):
    """Multi-head scaled dot-product attention (Vaswani et al. 2017)."""

    kind: Literal["mha"] = "mha"
    impl: Literal["naive", "sdpa"] = Field(
        "naive", description="naive: explicit softmax(QK^T/sqrt(d))V; sdpa: torch's fused kernel"
    )


class MultiHeadAttention(nn.Module):
    """softmax(Q K^T / sqrt(head_dim)) V per head, dropout on the attention weights.

    ``naive`` is the seeds' explicit form; ``sdpa`` calls F.scaled_dot_product_attention
    (FlashAttention / memory-efficient kernels where available). Same parameters either way.
    """

    def __init__(self, emb_dim, n_heads, context_length, drop_rate, qkv_bias, causal, impl,
                 out_bias=True):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, emb_dim // n_heads
        self.causal, self.impl, self.drop_rate = causal, impl, drop_rate
        self.W_query = nn.Linear(emb_dim, emb_dim, bias=qkv_bias)
        self.W_key = nn.Linear(emb_dim, emb_dim, bias=qkv_bias)
        self.W_value = nn.Linear(emb_dim, emb_dim, bias=qkv_bias)
        self.out_proj = nn.Linear(emb_dim, emb_dim, bias=out_bias)
        for role, linear in (("query", self.W_query), ("key", self.W_key),
                             ("value", self.W_value), ("attn_out", self.out_proj)):
            linear.variantlab_role = role  # read by role-aware inits (deepnorm)
        self.dropout = nn.Dropout(drop_rate)

    def split_heads(self, x):  # (B, T, D) -> (B, n_heads, T, head_dim)
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)

    def forward(self, x, memory=None, key_padding_mask=None):
        b, t, d = x.shape
        kv = x if memory is None else memory  # (B, S, D)
        queries = self.split_heads(self.W_query(x))  # (B, n_heads, T, head_dim)
        keys = self.split_heads(self.W_key(kv))  # (B, n_heads, S, head_dim)
        values = self.split_heads(self.W_value(kv))  # (B, n_heads, S, head_dim)
        if self.impl == "sdpa":
            context = self.sdpa(queries, keys, values, key_padding_mask)
        else:
            context = self.naive(queries, keys, values, key_padding_mask)
        context = context.transpose(1, 2).contiguous().view(b, t, d)  # (B, T, D)
        return self.out_proj(context)

    def blocked(self, t, s, key_padding_mask, device):
        """Bool mask, True where attention is not allowed: (T, S) or (B, 1, T, S)."""
        mask = None
        if self.causal:
            mask = torch.ones(t, s, dtype=torch.bool, device=device).triu(1)  # (T, S)
        if key_padding_mask is not None:
            pad = key_padding_mask[:, None, None, :].bool()  # (B, 1, 1, S)
            mask = pad if mask is None else mask | pad  # (B, 1, T, S)
        return mask

    def naive(self, queries, keys, values, key_padding_mask):
        attn_scores = queries @ keys.transpose(2, 3)  # (B, n_heads, T, S)
        mask = self.blocked(queries.shape[2], keys.shape[2], key_padding_mask, queries.device)
        if mask is not None:
            attn_scores = attn_scores.masked_fill(mask, -torch.inf)
        attn_weights = torch.softmax(attn_scores / math.sqrt(self.head_dim), dim=-1)
        attn_weights = self.dropout(attn_weights)
        return attn_weights @ values  # (B, n_heads, T, head_dim)

    def sdpa(self, queries, keys, values, key_padding_mask):
        t, s = queries.shape[2], keys.shape[2]
        drop = self.drop_rate if self.training else 0.0
        if key_padding_mask is None and (not self.causal or t == s):
            return F.scaled_dot_product_attention(
                queries, keys, values, dropout_p=drop, is_causal=self.causal
            )
        allowed = ~self.blocked(t, s, key_padding_mask, queries.device)  # True = attend
        return F.scaled_dot_product_attention(queries, keys, values, allowed, dropout_p=drop)


@hookimpl
def register_attentions(register):
    def build(spec, emb_dim, n_heads, context_length, drop_rate, qkv_bias, causal, out_bias=True):
        return MultiHeadAttention(
            emb_dim, n_heads, context_length, drop_rate, qkv_bias, causal, spec.impl, out_bias
        )

    register("mha", MHASpec, build)
