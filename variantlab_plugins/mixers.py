"""Causal sequence mixers for the attention slot (docs/mixers.md): linear attention
(Katharopoulos et al. 2020), retention (RetNet, Sun et al. 2023), a short causal
convolution (H3, Fu et al. 2023; Based, Arora et al. 2024) and LFM2's gated one.

Each keeps the attention contract (``forward(x, memory=None, key_padding_mask=None,
position_ids=None)``, (B, T, emb_dim) in and out, padded positions never influence another
position) and declares it is causal only (``causal_only``: no encoder, no cross-attention,
no positional that acts inside attention). Each has a token-by-token recurrent reference
(``impl: recurrent``) and a parallel form (``chunked``) tested equal to it in float64, and a
``state_size(t)``: the numbers a recurrent decoder keeps per sequence after ``t`` tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, PositiveInt
from torch import nn

from variantlab import ComponentSpec, hookimpl
from variantlab.model.roles import declare_role


class MixerSpec(ComponentSpec):
    """Base of the causal mixers here: causal-only, a recurrent and a chunked form."""

    kind: str
    causal_only: ClassVar[bool] = True  # read by ModelSpec and the conformance kit
    impl: Literal["chunked", "recurrent"] = Field(
        "chunked", description="chunked: the parallel form, chunk by chunk; recurrent: the "
        "token-by-token reference (slow; the two are equal up to rounding)")


class DecayedSpec(MixerSpec):
    """Options shared by linear attention and retention."""

    chunk_size: PositiveInt = Field(
        64, description="positions per chunk of the chunked form (memory grows as T * "
        "chunk_size, compute as T * chunk_size * head_dim)")
    output_gate: Literal["none", "swish", "sigmoid"] = Field(
        "none", description="multiply the heads' output by act(W_g x) before the output "
        "projection (RetNet: swish)")


class LinearAttentionSpec(DecayedSpec):
    """Linear attention (Katharopoulos et al. 2020, "Transformers are RNNs"): softmax(q k^T)
    replaced by phi(q) phi(k)^T, so that the state S_t = S_{t-1} + phi(k_t) v_t^T is fixed
    in size and o_t = phi(q_t) S_t / (phi(q_t) . z_t), z_t = z_{t-1} + phi(k_t)."""

    kind: Literal["linear_attention"] = "linear_attention"
    walk_examples: ClassVar[tuple[dict, ...]] = (  # tests/test_registry_walk.py tries these
        {"kind": "linear_attention", "feature_map": "relu", "normalization": "head_norm",
         "output_gate": "swish", "chunk_size": 3},
        {"kind": "linear_attention", "feature_map": "identity", "normalization": "none",
         "impl": "recurrent"},
    )
    feature_map: Literal["elu1", "relu", "identity"] = Field(
        "elu1", description="phi on queries and keys: elu1 = elu(x) + 1 (the paper's, "
        "positive), relu, identity (plain linear attention)")
    normalization: Literal["sum", "head_norm", "none"] = Field(
        "sum", description="sum: divide by phi(q) . sum of phi(k) (the paper's; needs a "
        "positive feature map); head_norm: the model's norm over each head's output "
        "(Qin et al. 2022, TransNormer); none")

    def errors(self, model) -> list[tuple[str, str]]:
        if self.normalization == "sum" and self.feature_map == "identity":
            return [("normalization", "the sum normalisation divides by phi(q) . sum phi(k), "
                     "which an identity feature map can make zero or negative; use "
                     "feature_map elu1 or relu, or normalization head_norm or none")]
        return []


class RetentionSpec(DecayedSpec):
    """Retention (RetNet, Sun et al. 2023): S_t = gamma_h S_{t-1} + k_t v_t^T, o_t = q_t S_t,
    with a fixed decay per head, gamma_h = 1 - 2^(-5 - h) (multi-scale), keys scaled by
    head_dim^-0.5, a norm per head (the paper's GroupNorm) and a swish output gate."""

    kind: Literal["retention"] = "retention"
    walk_examples: ClassVar[tuple[dict, ...]] = (
        {"kind": "retention", "normalization": "none", "output_gate": "sigmoid",
         "chunk_size": 5},
    )
    normalization: Literal["head_norm", "none"] = Field(
        "head_norm", description="head_norm: the model's norm over each head's output "
        "(the paper's GroupNorm); none")
    output_gate: Literal["none", "swish", "sigmoid"] = Field(
        "swish", description="multiply the heads' output by act(W_g x) before the output "
        "projection (RetNet: swish)")


def retention_decays(n_heads: int) -> torch.Tensor:
    """RetNet's per-head decays gamma_h = 1 - 2^(-5 - h), h = 0..n_heads-1 (Sun et al. 2023,
    sec. 2.2): (H,) float64."""
    return 1 - 2.0 ** (-5 - torch.arange(n_heads, dtype=torch.float64))


def recurrent_scan(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   log_decay: torch.Tensor | None = None) -> torch.Tensor:
    """The reference: S_t = gamma S_{t-1} + k_t v_t^T, o_t = q_t S_t, one token at a time.
    q, k: (B, H, T, dk); v: (B, H, T, dv); log_decay: (H,) log gamma, None = 1. Out (B, H, T, dv)."""
    b, h, t, dk = q.shape
    state = q.new_zeros(b, h, dk, v.shape[-1])  # (B, H, dk, dv)
    decay = 1.0 if log_decay is None else log_decay.exp().to(q.dtype)[None, :, None, None]
    outs = []
    for i in range(t):
        state = decay * state + k[:, :, i, :, None] * v[:, :, i, None, :]  # (B, H, dk, dv)
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, i], state))  # (B, H, dv)
    return torch.stack(outs, dim=2)  # (B, H, T, dv)


def chunked_scan(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 log_decay: torch.Tensor | None = None, chunk: int = 64) -> torch.Tensor:
    """The same outputs as :func:`recurrent_scan`, a chunk of C positions at a time: within a
    chunk the masked, decayed quadratic form ((q k^T) * D) v with D_ij = gamma^(i-j) (j <= i),
    across chunks the state carried from the previous one (Sun et al. 2023, sec. 2.3;
    Yang et al. 2024, GLA). Memory O(T C), compute O(T C d)."""
    b, h, t, dk = q.shape
    c = min(chunk, t)
    pad = (-t) % c  # zeros at the end touch no earlier output
    if pad:
        q, k, v = (F.pad(a, (0, 0, 0, pad)) for a in (q, k, v))
    n = (t + pad) // c
    q, k, v = (a.reshape(b, h, n, c, a.shape[-1]) for a in (q, k, v))  # (B, H, N, C, d)
    ld = q.new_zeros(h) if log_decay is None else log_decay.to(q.dtype)  # (H,)
    pos = torch.arange(c, device=q.device, dtype=q.dtype)  # (C,)
    diff = pos[:, None] - pos[None, :]  # (C, C)
    mask = torch.exp(ld[:, None, None] * diff.clamp_min(0)) * (diff >= 0)  # (H, C, C)
    q_decay = torch.exp(ld[:, None] * (pos + 1))[..., None]  # (H, C, 1): state -> position i
    k_decay = torch.exp(ld[:, None] * (c - 1 - pos))[..., None]  # (H, C, 1): key j -> end
    chunk_decay = torch.exp(ld * c)[:, None, None]  # (H, 1, 1)
    state = q.new_zeros(b, h, dk, v.shape[-1])  # (B, H, dk, dv)
    outs = []
    for i in range(n):
        qi, ki, vi = q[:, :, i], k[:, :, i], v[:, :, i]  # (B, H, C, d)
        intra = ((qi @ ki.transpose(-1, -2)) * mask) @ vi  # (B, H, C, dv)
        outs.append(intra + (qi * q_decay) @ state)  # (B, H, C, dv)
        state = chunk_decay * state + (ki * k_decay).transpose(-1, -2) @ vi  # (B, H, dk, dv)
    return torch.cat(outs, dim=2)[:, :, :t]  # (B, H, T, dv)


_GATES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "swish": F.silu, "sigmoid": torch.sigmoid}
_FEATURES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "elu1": lambda x: F.elu(x) + 1, "relu": F.relu, "identity": lambda x: x}


def refuse_bidirectional(kind: str, causal: bool) -> None:
    """Raise ``ValueError`` when a causal-only mixer ``kind`` is built with ``causal=False``."""
    if not causal:
        raise ValueError(f"attention {kind!r} is a causal sequence mixer; it cannot be built "
                         "bidirectional (causal=False): use it in a causal stack (gpt)")


def no_memory(kind: str, memory: torch.Tensor | None) -> None:
    """Raise ``ValueError`` when a causal-only mixer ``kind`` is given a memory to attend to."""
    if memory is not None:
        raise ValueError(f"attention {kind!r} mixes one sequence causally; it cannot "
                         "cross-attend to a memory: use mha for cross-attention")


class DecayedLinearAttention(nn.Module):
    """Multi-head (decayed) linear attention: q, k, v projections, a feature map on q and k,
    the scan (recurrent or chunked), a normalisation, an optional output gate, the output
    projection. Padded positions (key_padding_mask True) write nothing into the state."""

    causal = True

    def __init__(self, emb_dim: int, n_heads: int, qkv_bias: bool, spec: DecayedSpec,
                 make_norm: Callable[..., nn.Module] | None, out_bias: bool) -> None:
        super().__init__()
        self.kind, self.impl, self.chunk = spec.kind, spec.impl, spec.chunk_size
        self.n_heads, self.head_dim = n_heads, emb_dim // n_heads
        retention = isinstance(spec, RetentionSpec)
        self.feature = _FEATURES[getattr(spec, "feature_map", "identity")]
        self.normalization: str = getattr(spec, "normalization", "none")
        self.key_scale = self.head_dim ** -0.5 if retention else 1.0
        self.W_query = declare_role(nn.Linear(emb_dim, emb_dim, bias=qkv_bias), "query")
        self.W_key = declare_role(nn.Linear(emb_dim, emb_dim, bias=qkv_bias), "key")
        self.W_value = declare_role(nn.Linear(emb_dim, emb_dim, bias=qkv_bias), "value")
        self.out_proj = declare_role(nn.Linear(emb_dim, emb_dim, bias=out_bias), "attn_out")
        self.gate_act = _GATES.get(spec.output_gate)
        self.W_gate = nn.Linear(emb_dim, emb_dim, bias=qkv_bias) if self.gate_act else None
        self.head_norm: nn.Module | None = None
        if self.normalization == "head_norm":
            if make_norm is None:
                raise TypeError("normalization head_norm needs make_norm (build_model passes "
                                "the model's)")
            self.head_norm = make_norm(self.head_dim)
        decays = retention_decays(n_heads).log() if retention else None  # (H,) log gamma
        self.register_buffer("log_decay", decays, persistent=False)

    def split(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, H*hd) -> (B, H, T, hd)
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)

    def forward(self, x, memory=None, key_padding_mask=None, position_ids=None):
        no_memory(self.kind, memory)
        b, t, d = x.shape
        q = self.feature(self.split(self.W_query(x)))  # (B, H, T, hd)
        k = self.feature(self.split(self.W_key(x))) * self.key_scale  # (B, H, T, hd)
        v = self.split(self.W_value(x))  # (B, H, T, hd)
        if key_padding_mask is not None:  # padded keys write nothing into the state
            k = k.masked_fill(key_padding_mask.bool()[:, None, :, None], 0.0)
        if self.normalization == "sum":
            v = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)  # (B, H, T, hd + 1)
        ld = None if self.log_decay is None else self.log_decay.to(x.dtype)
        if self.impl == "recurrent":
            out = recurrent_scan(q, k, v, ld)  # (B, H, T, dv)
        else:
            out = chunked_scan(q, k, v, ld, self.chunk)  # (B, H, T, dv)
        if self.normalization == "sum":
            out = out[..., :-1] / (out[..., -1:] + 1e-6)  # (B, H, T, hd)
        elif self.head_norm is not None:
            out = self.head_norm(out)
        out = out.transpose(1, 2).reshape(b, t, d)  # (B, T, D)
        if self.W_gate is not None and self.gate_act is not None:
            out = out * self.gate_act(self.W_gate(x))  # (B, T, D)
        return self.out_proj(out)  # (B, T, D)

    def state_size(self, t: int) -> int:
        """Numbers kept per sequence: S (H, hd, hd), plus z (H, hd) with the sum norm."""
        extra = 1 if self.normalization == "sum" else 0
        return self.n_heads * self.head_dim * (self.head_dim + extra)


class ShortConvSpec(MixerSpec):
    """A short causal depthwise convolution as the whole mixer (H3's shift SSM, Fu et al.
    2023; Based, Arora et al. 2024): y_t = sum_{i<w} w_i * u_{t-i} per channel, u = W_in x,
    then an optional activation and output gate, and the output projection."""

    kind: Literal["short_conv"] = "short_conv"
    walk_examples: ClassVar[tuple[dict, ...]] = (
        {"kind": "short_conv", "width": 3, "activation": "silu", "output_gate": "sigmoid"},
        {"kind": "short_conv", "width": 2, "impl": "recurrent"},
    )
    width: PositiveInt = Field(4, description="kernel width w: each position sees itself and "
                               "the w - 1 before it (Mamba and Based use 4)")
    activation: Literal["identity", "silu"] = Field(
        "identity", description="after the convolution (Mamba: silu)")
    output_gate: Literal["none", "swish", "sigmoid"] = Field(
        "none", description="multiply by act(W_g x) before the output projection (H3-style "
        "multiplicative gate)")

    def errors(self, model) -> list[tuple[str, str]]:
        if self.width > model.context_length:
            return [("width", f"width={self.width} exceeds context_length="
                     f"{model.context_length}; choose a width of at most the context")]
        return []


class ShortConv(nn.Module):
    """Input projection, depthwise causal Conv1d (left zero padding of w - 1), activation,
    gate, output projection. Padded positions are zeroed before the convolution."""

    causal = True

    def __init__(self, emb_dim: int, qkv_bias: bool, spec: ShortConvSpec, out_bias: bool):
        super().__init__()
        self.kind: str = spec.kind
        self.impl, self.width = spec.impl, spec.width
        self.W_in = declare_role(nn.Linear(emb_dim, emb_dim, bias=qkv_bias), "value")
        self.conv = nn.Conv1d(emb_dim, emb_dim, spec.width, groups=emb_dim)
        self.act = F.silu if spec.activation == "silu" else (lambda u: u)
        self.gate_act = _GATES.get(spec.output_gate)
        self.W_gate = nn.Linear(emb_dim, emb_dim, bias=qkv_bias) if self.gate_act else None
        self.out_proj = declare_role(nn.Linear(emb_dim, emb_dim, bias=out_bias), "attn_out")

    def forward(self, x, memory=None, key_padding_mask=None, position_ids=None):
        no_memory(self.kind, memory)
        u = self.W_in(x)  # (B, T, D)
        if key_padding_mask is not None:
            u = u.masked_fill(key_padding_mask.bool()[..., None], 0.0)
        y = self.recurrent(u) if self.impl == "recurrent" else self.parallel(u)  # (B, T, D)
        y = self.act(y)
        if self.W_gate is not None and self.gate_act is not None:
            y = y * self.gate_act(self.W_gate(x))  # (B, T, D)
        return self.out_proj(y)  # (B, T, D)

    def parallel(self, u: torch.Tensor) -> torch.Tensor:  # (B, T, D) -> (B, T, D)
        padded = F.pad(u.transpose(1, 2), (self.width - 1, 0))  # (B, D, T + w - 1)
        return self.conv(padded).transpose(1, 2)

    def recurrent(self, u: torch.Tensor) -> torch.Tensor:  # (B, T, D) -> (B, T, D)
        """The reference: a window of the last w inputs, shifted one token at a time."""
        b, t, d = u.shape
        window = u.new_zeros(b, d, self.width)  # (B, D, w): oldest first
        weight, bias = self.conv.weight[:, 0], self.conv.bias  # (D, w), (D,) or None
        outs = []
        for i in range(t):
            window = torch.cat([window[..., 1:], u[:, i, :, None]], dim=-1)  # (B, D, w)
            out = (window * weight).sum(-1)  # (B, D)
            outs.append(out if bias is None else out + bias)
        return torch.stack(outs, dim=1)  # (B, T, D)

    def state_size(self, t: int) -> int:
        """Numbers kept per sequence: the last w - 1 inputs of every channel."""
        return (self.width - 1) * self.conv.in_channels


class GatedShortConvSpec(MixerSpec):
    """LFM2's gated short convolution (Liquid AI 2025, LFM2 technical report; after Hyena's
    gating, Poli et al. 2023): B, C, x = in_proj(x); y = C * conv(B * x) with a causal
    depthwise convolution of width w, then out_proj."""

    kind: Literal["gated_short_conv"] = "gated_short_conv"
    walk_examples: ClassVar[tuple[dict, ...]] = (
        {"kind": "gated_short_conv", "width": 2, "bias": True, "impl": "recurrent"},)
    width: PositiveInt = Field(3, description="kernel width w (LFM2's conv_L_cache: 3)")
    bias: bool = Field(False, description="biases in in_proj, the convolution and out_proj "
                       "(LFM2's conv_bias)")

    def errors(self, model) -> list[tuple[str, str]]:
        if self.width > model.context_length:
            return [("width", f"width={self.width} exceeds context_length="
                     f"{model.context_length}; choose a width of at most the context")]
        return []


class GatedShortConv(ShortConv):
    """in_proj -> (B, C, x) (three blocks of emb_dim channels); B * x through the causal
    depthwise convolution (the parallel form or the token-by-token reference of
    :class:`ShortConv`), times C, out_proj. Padded positions' B * x is zeroed before the
    convolution (HF zeroes their inputs before in_proj: the same without biases)."""

    def __init__(self, emb_dim: int, spec: GatedShortConvSpec):  # not ShortConv's parameters
        nn.Module.__init__(self)
        self.kind, self.impl, self.width = spec.kind, spec.impl, spec.width
        self.in_proj = declare_role(nn.Linear(emb_dim, 3 * emb_dim, bias=spec.bias), "value")
        self.conv = nn.Conv1d(emb_dim, emb_dim, spec.width, groups=emb_dim, bias=spec.bias)
        self.out_proj = declare_role(nn.Linear(emb_dim, emb_dim, bias=spec.bias), "attn_out")

    def forward(self, x, memory=None, key_padding_mask=None, position_ids=None):
        no_memory(self.kind, memory)
        b_in, c_out, u = self.in_proj(x).chunk(3, dim=-1)  # (B, T, D) each
        u = b_in * u
        if key_padding_mask is not None:
            u = u.masked_fill(key_padding_mask.bool()[..., None], 0.0)
        y = self.recurrent(u) if self.impl == "recurrent" else self.parallel(u)  # (B, T, D)
        return self.out_proj(c_out * y)  # (B, T, D)


@hookimpl
def register_attentions(register):
    def decayed(spec, emb_dim, n_heads, context_length, drop_rate, qkv_bias, causal,
                make_norm=None, out_bias=True):
        refuse_bidirectional(spec.kind, causal)
        return DecayedLinearAttention(emb_dim, n_heads, qkv_bias, spec, make_norm, out_bias)

    def short_conv(spec, emb_dim, n_heads, context_length, drop_rate, qkv_bias, causal,
                   out_bias=True):
        refuse_bidirectional(spec.kind, causal)
        return ShortConv(emb_dim, qkv_bias, spec, out_bias)

    register("linear_attention", LinearAttentionSpec, decayed)
    register("retention", RetentionSpec, decayed)
    register("short_conv", ShortConvSpec, short_conv)

    def gated_short_conv(spec, emb_dim, n_heads, context_length, drop_rate, qkv_bias, causal):
        refuse_bidirectional(spec.kind, causal)
        return GatedShortConv(emb_dim, spec)

    register("gated_short_conv", GatedShortConvSpec, gated_short_conv)


__all__ = ["chunked_scan", "recurrent_scan", "retention_decays"]
