"""Gated DeltaNet (Yang, Kautz & Hatamizadeh 2025, "Gated Delta Networks: Improving Mamba2
with Delta Rule") for the attention slot, laid out as HF Qwen3-Next's Qwen3NextGatedDeltaNet
(docs/mixers.md, "State-space and delta-rule mixers").

Per value head, the state S (d_k, d_v) is decayed by alpha_t = exp(g_t) and then corrected
toward v_t along k_t with strength beta_t (the delta rule, Widrow & Hoff 1960; Schlag et al.
2021; Yang et al. 2024): S_t = alpha_t S_{t-1} + beta_t k_t (v_t - alpha_t S_{t-1}^T k_t)^T,
o_t = S_t^T q_t / sqrt(d_k), with q and k L2-normalised. The chunked form turns a chunk's
delta-rule updates into one triangular solve (the WY / UT representation, Yang et al. 2024,
"Parallelizing Linear Transformers with the Delta Rule over Sequence Length").
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, PositiveFloat, PositiveInt
from torch import Tensor, nn

from variantlab import hookimpl
from variantlab.model.roles import declare_role
from variantlab_plugins.mixers import no_memory, refuse_bidirectional
from variantlab_plugins.ssm import ConvSpecMixin, GatedRMSNorm, causal_conv, inverse_softplus_dt, masked


class GatedDeltaNetSpec(ConvSpecMixin):
    """Gated DeltaNet (Yang et al. 2025) as in Qwen3-Next: q, k, v through a short causal
    convolution (silu), q and k L2-normalised, beta = sigmoid(W_b x), g = -exp(A_log)
    softplus(W_a x + dt_bias), the gated delta rule, a per-head RMSNorm gated by silu(W_z x)
    (norm first), and the output projection."""

    kind: Literal["gated_deltanet"] = "gated_deltanet"
    walk_examples: ClassVar[tuple[dict, ...]] = (  # tests/test_registry_walk.py tries these
        {"kind": "gated_deltanet", "n_k_heads": 2, "n_v_heads": 4, "head_k_dim": 4,
         "head_v_dim": 6, "chunk_size": 3, "conv_width": 2},
        {"kind": "gated_deltanet", "impl": "recurrent"},
    )
    n_k_heads: PositiveInt | None = Field(None, description="query/key heads; unset = the "
                                          "model's n_heads")
    n_v_heads: PositiveInt | None = Field(None, description="value heads (state heads), a "
                                          "multiple of n_k_heads; unset = n_k_heads")
    head_k_dim: PositiveInt | None = Field(None, description="query/key head width; unset = "
                                           "emb_dim / n_heads")
    head_v_dim: PositiveInt | None = Field(None, description="value head width; unset = "
                                           "head_k_dim")
    norm_eps: PositiveFloat = Field(1e-6, description="epsilon of the gated output RMSNorm")

    def errors(self, model) -> list[tuple[str, str]]:
        found = super().errors(model)
        hk, hv = self.n_k_heads or model.n_heads, self.n_v_heads or self.n_k_heads or model.n_heads
        if hv % hk:
            found.append(("n_v_heads", f"n_v_heads={hv} is not a multiple of n_k_heads={hk}"))
        if self.head_k_dim is None and model.emb_dim % model.n_heads:
            found.append(("head_k_dim", f"emb_dim={model.emb_dim} is not a multiple of "
                          f"n_heads={model.n_heads}; set head_k_dim"))
        return found


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum x^2 + eps) over the last dimension (FLA's and HF's form)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def delta_recurrent(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor) -> Tensor:
    """The reference, one token at a time. q, k (B, H, T, dk) (normalised, q scaled);
    v (B, H, T, dv); g (B, H, T) log decay; beta (B, H, T). Out (B, H, T, dv)."""
    b, h, t, dk = k.shape
    state = v.new_zeros(b, h, dk, v.shape[-1])  # (B, H, dk, dv)
    outs = []
    for i in range(t):
        state = state * g[:, :, i].exp()[..., None, None]
        recalled = torch.einsum("bhkv,bhk->bhv", state, k[:, :, i])  # (B, H, dv)
        delta = (v[:, :, i] - recalled) * beta[:, :, i, None]  # (B, H, dv)
        state = state + k[:, :, i, :, None] * delta[:, :, None, :]
        outs.append(torch.einsum("bhkv,bhk->bhv", state, q[:, :, i]))  # (B, H, dv)
    return torch.stack(outs, dim=2)  # (B, H, T, dv)


def delta_chunked(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, chunk: int) -> Tensor:
    """The same as :func:`delta_recurrent`, a chunk of L positions at a time. Inside a chunk
    with cumulative log decay c_i and the chunk's start state S, the new values
    u_i = beta_i (v_i - sum_{j<i} exp(c_i - c_j) (k_i . k_j) u_j - exp(c_i) S^T k_i) solve a
    unit lower-triangular system (I + A) u = beta (v - exp(c) K S), A_ij = beta_i exp(c_i - c_j)
    k_i . k_j (j < i); then o_i = exp(c_i) S^T q_i + sum_{j<=i} exp(c_i - c_j) (q_i . k_j) u_j
    and S' = exp(c_L) S + sum_j exp(c_L - c_j) k_j u_j^T. Memory O(T L)."""
    b, h, t, dk = k.shape
    state = v.new_zeros(b, h, dk, v.shape[-1])  # (B, H, dk, dv)
    eye = torch.eye(chunk, dtype=torch.bool, device=k.device)
    lower = torch.ones(chunk, chunk, dtype=torch.bool, device=k.device).tril()
    outs = []
    for s in range(0, t, chunk):
        e = min(s + chunk, t)
        n = e - s
        qc, kc, vc, bc = q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], beta[:, :, s:e, None]
        cum = torch.cumsum(g[:, :, s:e], dim=-1)  # (B, H, L)
        seg = cum[..., :, None] - cum[..., None, :]  # (B, H, L, L): i, j
        decay = torch.where(lower[:n, :n], seg, torch.full_like(seg, -torch.inf)).exp()
        strict = decay.masked_fill(eye[:n, :n], 0.0)  # j < i only
        system = torch.eye(n, dtype=k.dtype, device=k.device) + bc * (kc @ kc.transpose(-1, -2)) * strict
        rhs = bc * (vc - cum.exp()[..., None] * (kc @ state))  # (B, H, L, dv)
        u = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
        o = cum.exp()[..., None] * (qc @ state) + ((qc @ kc.transpose(-1, -2)) * decay) @ u
        to_end = (cum[..., -1:] - cum).exp()[..., None]  # (B, H, L, 1)
        state = cum[..., -1].exp()[..., None, None] * state + (kc * to_end).transpose(-1, -2) @ u
        outs.append(o)  # (B, H, L, dv)
    return torch.cat(outs, dim=2)  # (B, H, T, dv)


class GatedDeltaNet(nn.Module):
    """in_proj_qkvz and in_proj_ba (HF Qwen3-Next's grouped layout: per key head, its q, k,
    then the v and z of its value heads), causal conv + silu on q, k, v, the gated delta rule,
    gated RMSNorm per value head, out_proj. Padded positions write nothing and do not decay."""

    causal = True

    def __init__(self, emb_dim: int, n_heads: int, spec: GatedDeltaNetSpec):
        super().__init__()
        self.kind, self.impl, self.chunk = spec.kind, spec.impl, spec.chunk_size
        self.hk = spec.n_k_heads or n_heads
        self.hv = spec.n_v_heads or self.hk
        self.dk = spec.head_k_dim or emb_dim // n_heads
        self.dv = spec.head_v_dim or self.dk
        key_dim, value_dim = self.hk * self.dk, self.hv * self.dv
        self.conv_dim = 2 * key_dim + value_dim
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, spec.conv_width,
                                groups=self.conv_dim, bias=False)
        self.in_proj_qkvz = declare_role(nn.Linear(emb_dim, 2 * key_dim + 2 * value_dim,
                                                   bias=False), "value")
        self.in_proj_ba = nn.Linear(emb_dim, 2 * self.hv, bias=False)
        # the authors' training init (fla-org/flash-linear-attention, layers/gated_deltanet.py),
        # not transformers' loading placeholders (dt_bias = 1, A in [1, 16]): A ~ U(0, 16) and
        # softplus(dt_bias) log-uniform in [0.001, 0.1] (floored at 1e-4), as in Mamba-2
        self.dt_bias = nn.Parameter(inverse_softplus_dt(self.hv, 0.001, 0.1))
        self.A_log = nn.Parameter(torch.log(torch.empty(self.hv).uniform_(0.0, 16.0)))
        self.norm = GatedRMSNorm(self.dv, 1, spec.norm_eps, norm_before_gate=True)
        self.out_proj = declare_role(nn.Linear(value_dim, emb_dim, bias=False), "attn_out")

    def forward(self, x, memory=None, key_padding_mask=None, position_ids=None):
        no_memory(self.kind, memory)
        b, t, _ = x.shape
        r = self.hv // self.hk  # value heads per key head
        qkvz = self.in_proj_qkvz(x).view(b, t, self.hk, 2 * self.dk + 2 * r * self.dv)
        q, k, v, z = qkvz.split([self.dk, self.dk, r * self.dv, r * self.dv], dim=-1)
        ba = self.in_proj_ba(x).view(b, t, self.hk, 2 * r)
        beta_in, a = ba[..., :r].reshape(b, t, self.hv), ba[..., r:].reshape(b, t, self.hv)
        mixed = torch.cat([q.reshape(b, t, -1), k.reshape(b, t, -1), v.reshape(b, t, -1)], -1)
        mixed = causal_conv(masked(mixed, key_padding_mask), self.conv1d)  # (B, T, conv_dim)
        q, k, v = mixed.split([self.hk * self.dk, self.hk * self.dk, self.hv * self.dv], -1)
        work = torch.promote_types(x.dtype, torch.float32)
        q = l2norm(q.reshape(b, t, self.hk, self.dk).to(work)).repeat_interleave(r, 2)
        k = l2norm(k.reshape(b, t, self.hk, self.dk).to(work)).repeat_interleave(r, 2)
        v = v.reshape(b, t, self.hv, self.dv).to(work)  # (B, T, Hv, dv)
        beta = masked(torch.sigmoid(beta_in.to(work)), key_padding_mask)  # (B, T, Hv)
        g = -self.A_log.to(work).exp() * F.softplus(a.to(work) + self.dt_bias.to(work))
        g = masked(g, key_padding_mask)  # (B, T, Hv): padded positions do not decay
        q, k, v = (y.transpose(1, 2) for y in (q * self.dk ** -0.5, k, v))  # (B, Hv, T, d)
        beta, g = beta.transpose(1, 2), g.transpose(1, 2)  # (B, Hv, T)
        if self.impl == "recurrent":
            o = delta_recurrent(q, k, v, g, beta)
        else:
            o = delta_chunked(q, k, v, g, beta, self.chunk)  # (B, Hv, T, dv)
        o = self.norm(o.transpose(1, 2).to(x.dtype), z.reshape(b, t, self.hv, self.dv))
        return self.out_proj(o.reshape(b, t, self.hv * self.dv))  # (B, T, D)

    def state_size(self, t: int) -> int:
        """Numbers kept per sequence: S (Hv, dk, dv) and the conv window."""
        return self.hv * self.dk * self.dv + (self.conv1d.kernel_size[0] - 1) * self.conv_dim


@hookimpl
def register_attentions(register):
    def build(spec, emb_dim, n_heads, context_length, drop_rate, qkv_bias, causal):
        refuse_bidirectional(spec.kind, causal)
        return GatedDeltaNet(emb_dim, n_heads, spec)

    register("gated_deltanet", GatedDeltaNetSpec, build)
