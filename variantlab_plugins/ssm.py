"""Selective state-space mixers for the attention slot (docs/mixers.md, "State-space and
delta-rule mixers"): Mamba-2's SSD (Dao & Gu 2024) and Mamba-1's selective scan (Gu & Dao
2023, as Jamba uses it, Lieber et al. 2024).

Both keep the attention contract of ``mha`` (``forward(x, memory=None,
key_padding_mask=None, position_ids=None)``, (B, T, emb_dim) in and out) and are causal only
(``causal_only``): a bidirectional build or a memory is refused. Padded positions
(key_padding_mask True) are zeroed before and after the short convolution and get a zero
step (dt = 0), so they neither write into the state nor decay it. Each has a token-by-token
recurrent reference (``impl: recurrent``) and a chunked form (``chunked``) tested equal in
float64 (tests/test_ssm.py), and a ``state_size(t)``. Parameter names follow HF transformers'
Mamba2Mixer and JambaMambaMixer, so that their weights load one to one (but for Jamba's inner
norms, :class:`~variantlab_plugins.norms.RMSNorm`: their ``weight`` is our ``scale``).
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, PositiveFloat, PositiveInt
from torch import Tensor, nn

from variantlab import hookimpl
from variantlab.model.roles import declare_role
from variantlab_plugins.mixers import MixerSpec, no_memory, refuse_bidirectional
from variantlab_plugins.norms import RMSNorm, RMSNormSpec


class ConvSpecMixin(MixerSpec):
    """Options shared by the mixers with a short causal convolution."""

    kind: str
    conv_width: PositiveInt = Field(4, description="width of the causal depthwise convolution "
                                    "before the scan (Mamba: 4)")
    chunk_size: PositiveInt = Field(64, description="positions per chunk of the chunked form")

    def errors(self, model) -> list[tuple[str, str]]:
        found = []
        if self.conv_width > model.context_length:
            found.append(("conv_width", f"conv_width={self.conv_width} exceeds context_length="
                          f"{model.context_length}; choose at most the context"))
        low, high = getattr(self, "dt_min", None), getattr(self, "dt_max", None)
        if low is not None and high is not None and low > high:
            found.append(("dt_max", f"dt_max={high} is below dt_min={low}: the step's init "
                          "range [dt_min, dt_max] is empty; swap them or raise dt_max"))
        return found


def causal_conv(u: torch.Tensor, conv: nn.Conv1d) -> torch.Tensor:
    """Depthwise causal convolution then silu: (B, T, C) -> (B, T, C); position t sees
    u_{t-w+1..t} (zeros before the start)."""
    w = conv.kernel_size[0]
    y = F.conv1d(F.pad(u.transpose(1, 2), (w - 1, 0)), conv.weight, conv.bias,
                 groups=conv.groups)  # (B, C, T)
    return F.silu(y.transpose(1, 2))


def masked(x: torch.Tensor, pad: torch.Tensor | None) -> torch.Tensor:
    """x (B, T, ...) with the padded positions (pad (B, T) True) set to zero."""
    if pad is None:
        return x
    return x.masked_fill(pad.bool().view(*pad.shape, *([1] * (x.dim() - 2))), 0.0)


class GatedRMSNorm(nn.Module):
    """RMSNorm with a silu gate, over groups of the last dimension: Mamba-2 gates first
    (norm(y * silu(z)), ``norm_before_gate`` False); Qwen3-Next's Gated DeltaNet norms first
    (norm(y) * silu(z)). Computed in float32 at least, as HF does."""

    def __init__(self, dim: int, groups: int = 1, eps: float = 1e-6,
                 norm_before_gate: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.groups, self.eps, self.norm_first = groups, eps, norm_before_gate

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:  # (.., dim) each
        dtype = y.dtype
        work = torch.promote_types(dtype, torch.float32)
        y, gate = y.to(work), F.silu(z.to(work))
        if not self.norm_first:
            y = y * gate
        shape = y.shape
        g = y.view(*shape[:-1], self.groups, shape[-1] // self.groups)  # (.., G, dim/G)
        g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + self.eps)
        y = self.weight * g.view(shape).to(dtype)
        return (y * gate).to(dtype) if self.norm_first else y


def inverse_softplus_dt(n: int, dt_min: float, dt_max: float) -> torch.Tensor:
    """dt_bias such that softplus(dt_bias) is log-uniform in [dt_min, dt_max] (Mamba's init)."""
    dt = torch.exp(torch.rand(n) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
    dt = dt.clamp_min(1e-4)
    return dt + torch.log(-torch.expm1(-dt))  # (n,)


# --- Mamba-2 (SSD) -------------------------------------------------------------------------


class Mamba2Spec(ConvSpecMixin):
    """Mamba-2's state-space duality layer (Dao & Gu 2024, "Transformers are SSMs"): per head
    a scalar decay a_t = exp(dt_t A), h_t = a_t h_{t-1} + dt_t x_t B_t^T, y_t = h_t C_t + D x_t,
    with dt = softplus(W_dt u + dt_bias), A = -exp(A_log) per head, B and C shared by the heads
    of a group, a causal depthwise convolution (silu) over x, B and C, and the gated RMSNorm
    norm(y * silu(z)) before the output projection (HF Mamba2Mixer)."""

    kind: Literal["mamba2"] = "mamba2"
    added_options: ClassVar[tuple[str, ...]] = ("inner_dim", "gate_norm")
    walk_examples: ClassVar[tuple[dict, ...]] = (  # tests/test_registry_walk.py tries these
        {"kind": "mamba2", "d_state": 4, "n_groups": 2, "head_dim": 8, "chunk_size": 3,
         "conv_width": 2, "bias": True, "gate_norm": "norm_before_gate"},
        {"kind": "mamba2", "d_state": 4, "impl": "recurrent", "inner_dim": 24, "head_dim": 6,
         "gate_norm": "gate_only"},
    )
    d_state: PositiveInt = Field(16, description="state size N per head (HF state_size)")
    expand: PositiveInt = Field(2, description="inner width = expand * emb_dim")
    head_dim: PositiveInt | None = Field(
        None, description="width of each SSM head; unset = inner width / the model's n_heads")
    n_groups: PositiveInt = Field(1, description="groups of heads sharing B and C (and a "
                                  "group of the gated norm); divides the SSM heads")
    bias: bool = Field(False, description="biases in in_proj and out_proj (HF use_bias)")
    conv_bias: bool = Field(True, description="bias in the convolution (HF use_conv_bias)")
    norm_eps: PositiveFloat = Field(1e-5, description="epsilon of the gated RMSNorm")
    dt_min: PositiveFloat = Field(0.001, description="dt_bias init: softplus(dt_bias) "
                                  "log-uniform in [dt_min, dt_max]")
    dt_max: PositiveFloat = Field(0.1, description="see dt_min")
    inner_dim: PositiveInt | None = Field(
        None, description="the inner width, overriding expand * emb_dim (Falcon-H1's "
        "mamba_d_ssm); unset = expand * emb_dim")
    gate_norm: Literal["norm_after_gate", "norm_before_gate", "gate_only"] = Field(
        "norm_after_gate", description="norm_after_gate: RMSNorm(y * silu(z)) (Mamba-2); "
        "norm_before_gate: RMSNorm(y) * silu(z); gate_only: y * silu(z), no norm (Falcon-H1 "
        "without mamba_rms_norm)")

    def errors(self, model) -> list[tuple[str, str]]:
        found = super().errors(model)
        inner = self.inner_dim or self.expand * model.emb_dim
        hd = self.head_dim or inner // model.n_heads
        if inner % model.n_heads and self.head_dim is None or inner % hd:
            found.append(("head_dim", f"the inner width {inner} is not a "
                          f"multiple of head_dim={hd}; set head_dim to a divisor of {inner}"))
        elif (inner // hd) % self.n_groups:
            found.append(("n_groups", f"n_groups={self.n_groups} does not divide the "
                          f"{inner // hd} SSM heads"))
        return found


def ssd_recurrent(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor) -> Tensor:
    """The reference, one token at a time. x (B, T, H, P); dt (B, T, H) after softplus;
    A (H,) negative; B, C (B, T, H, N). Returns y (B, T, H, P) without the D skip."""
    b, t, h, p = x.shape
    state = x.new_zeros(b, h, p, B.shape[-1])  # (B, H, P, N)
    ys = []
    for i in range(t):
        decay = torch.exp(dt[:, i] * A)[..., None, None]  # (B, H, 1, 1)
        write = (dt[:, i, :, None] * x[:, i])[..., None] * B[:, i, :, None, :]  # (B, H, P, N)
        state = decay * state + write
        ys.append(torch.einsum("bhpn,bhn->bhp", state, C[:, i]))  # (B, H, P)
    return torch.stack(ys, dim=1)  # (B, T, H, P)


def ssd_chunked(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, chunk: int) -> Tensor:
    """The same as :func:`ssd_recurrent`, a chunk of L positions at a time (Dao & Gu 2024,
    sec. 6): inside a chunk the masked quadratic (attention-like) form with the decays
    exp(cum_t - cum_s), across chunks the state at the chunk boundary. Memory O(T L)."""
    b, t, h, p = x.shape
    da = dt * A  # (B, T, H): log decay per step
    u = x * dt[..., None]  # (B, T, H, P)
    state = x.new_zeros(b, h, p, B.shape[-1])  # (B, H, P, N)
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=x.device).tril()
    ys = []
    for s in range(0, t, chunk):
        e = min(s + chunk, t)
        cum = torch.cumsum(da[:, s:e], dim=1)  # (B, L, H)
        seg = cum[:, :, None, :] - cum[:, None, :, :]  # (B, L, L, H): t, s
        keep = causal[: e - s, : e - s, None]
        decay = torch.where(keep, seg, torch.full_like(seg, -torch.inf)).exp()  # (B, L, L, H)
        scores = torch.einsum("bthn,bshn->btsh", C[:, s:e], B[:, s:e]) * decay  # (B, L, L, H)
        y = torch.einsum("btsh,bshp->bthp", scores, u[:, s:e])  # (B, L, H, P)
        y = y + torch.einsum("bthn,bhpn->bthp", C[:, s:e], state) * cum.exp()[..., None]
        to_end = (cum[:, -1:] - cum).exp()  # (B, L, H)
        state = state * cum[:, -1].exp()[..., None, None] + torch.einsum(
            "bsh,bshp,bshn->bhpn", to_end, u[:, s:e], B[:, s:e])  # (B, H, P, N)
        ys.append(y)
    return torch.cat(ys, dim=1)  # (B, T, H, P)


class Mamba2Mixer(nn.Module):
    """in_proj -> (z, xBC, dt); causal conv + silu on xBC; SSD scan per head with the D skip;
    gated RMSNorm with z; out_proj (HF Mamba2Mixer's torch path)."""

    causal = True

    def __init__(self, emb_dim: int, n_heads: int, spec: Mamba2Spec):
        super().__init__()
        self.kind, self.impl, self.chunk = spec.kind, spec.impl, spec.chunk_size
        self.inner = spec.inner_dim or spec.expand * emb_dim
        self.head_dim = spec.head_dim or self.inner // n_heads
        self.n_heads, self.n_groups, self.d_state = self.inner // self.head_dim, spec.n_groups, spec.d_state
        self.conv_dim = self.inner + 2 * self.n_groups * self.d_state
        self.in_proj = declare_role(nn.Linear(emb_dim, self.inner + self.conv_dim + self.n_heads,
                                              bias=spec.bias), "value")
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, spec.conv_width,
                                groups=self.conv_dim, bias=spec.conv_bias)
        self.dt_bias = nn.Parameter(inverse_softplus_dt(self.n_heads, spec.dt_min, spec.dt_max))
        # the authors' init (state-spaces/mamba Mamba2, fla's Mamba2: A_init_range (1, 16)),
        # not transformers' placeholder A = 1..n_heads
        self.A_log = nn.Parameter(torch.log(torch.empty(self.n_heads).uniform_(1.0, 16.0)))
        self.D = nn.Parameter(torch.ones(self.n_heads))
        self.norm = None if spec.gate_norm == "gate_only" else GatedRMSNorm(
            self.inner, self.n_groups, spec.norm_eps,
            norm_before_gate=spec.gate_norm == "norm_before_gate")
        self.out_proj = declare_role(nn.Linear(self.inner, emb_dim, bias=spec.bias), "attn_out")

    def forward(self, x, memory=None, key_padding_mask=None, position_ids=None):
        no_memory(self.kind, memory)
        b, t, _ = x.shape
        z, xbc, dt = self.in_proj(x).split([self.inner, self.conv_dim, self.n_heads], dim=-1)
        xbc = masked(causal_conv(masked(xbc, key_padding_mask), self.conv1d), key_padding_mask)
        xs, B, C = xbc.split([self.inner, self.n_groups * self.d_state,
                              self.n_groups * self.d_state], dim=-1)
        xs = xs.reshape(b, t, self.n_heads, self.head_dim)  # (B, T, H, P)
        rep = self.n_heads // self.n_groups
        B = B.reshape(b, t, self.n_groups, self.d_state).repeat_interleave(rep, 2)  # (B, T, H, N)
        C = C.reshape(b, t, self.n_groups, self.d_state).repeat_interleave(rep, 2)  # (B, T, H, N)
        work = torch.promote_types(x.dtype, torch.float32)
        dt = masked(F.softplus(dt.to(work) + self.dt_bias.to(work)), key_padding_mask)  # (B, T, H)
        A = -torch.exp(self.A_log.to(work))  # (H,)
        xs, B, C = xs.to(work), B.to(work), C.to(work)
        if self.impl == "recurrent":
            y = ssd_recurrent(xs, dt, A, B, C)
        else:
            y = ssd_chunked(xs, dt, A, B, C, self.chunk)  # (B, T, H, P)
        y = y + xs * self.D.to(work)[:, None]
        y = y.reshape(b, t, self.inner)  # (B, T, inner)
        y = y * F.silu(z.to(work)) if self.norm is None else self.norm(y, z)
        return self.out_proj(y.to(x.dtype))  # (B, T, D)

    def state_size(self, t: int) -> int:
        """Numbers kept per sequence: the SSM state (H, P, N) and the conv window."""
        return self.n_heads * self.head_dim * self.d_state + (self.conv1d.kernel_size[0] - 1) * self.conv_dim


# --- Mamba-1 (selective scan) --------------------------------------------------------------


class MambaSpec(ConvSpecMixin):
    """Mamba's selective scan (Gu & Dao 2023, "Mamba: Linear-Time Sequence Modeling with
    Selective State Spaces"), as in Jamba (Lieber et al. 2024; HF JambaMambaMixer): per inner
    channel d and state n, h_t = exp(dt_{t,d} A_{d,n}) h_{t-1} + dt_{t,d} B_{t,n} x_{t,d},
    y_t = h_t C_t + D x_t, times silu(z_t); dt = softplus(W_dt r_t + b_dt) from a rank-R
    projection r_t, B_t and C_t from x_proj; optional RMSNorms on r, B and C (Jamba)."""

    kind: Literal["mamba"] = "mamba"
    walk_examples: ClassVar[tuple[dict, ...]] = (
        {"kind": "mamba", "d_state": 4, "dt_rank": 3, "inner_norms": True, "chunk_size": 3,
         "bias": True},
        {"kind": "mamba", "d_state": 4, "impl": "recurrent", "conv_width": 2},
    )
    chunk_size: PositiveInt = Field(16, description="positions per chunk of the chunked form "
                                    "(memory grows as T * chunk_size * inner * d_state)")
    d_state: PositiveInt = Field(16, description="state size N per inner channel")
    expand: PositiveInt = Field(2, description="inner width = expand * emb_dim")
    dt_rank: PositiveInt | None = Field(None, description="rank of the dt projection; unset = "
                                        "ceil(emb_dim / 16)")
    inner_norms: bool = Field(False, description="RMSNorm (no gate) on the dt rank, B and C "
                              "(Jamba's dt_layernorm, b_layernorm, c_layernorm)")
    norm_eps: PositiveFloat = Field(1e-6, description="epsilon of the inner norms")
    bias: bool = Field(False, description="biases in in_proj and out_proj")
    conv_bias: bool = Field(True, description="bias in the convolution")
    dt_min: PositiveFloat = Field(0.001, description="dt init: softplus(dt bias) log-uniform "
                                  "in [dt_min, dt_max]")
    dt_max: PositiveFloat = Field(0.1, description="see dt_min")


def selective_recurrent(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor) -> Tensor:
    """The reference. x, dt (B, T, E); A (E, N); B, C (B, T, N). y (B, T, E), no D skip."""
    b, t, e = x.shape
    state = x.new_zeros(b, e, A.shape[-1])  # (B, E, N)
    ys = []
    for i in range(t):
        state = torch.exp(dt[:, i, :, None] * A) * state + \
            (dt[:, i] * x[:, i])[..., None] * B[:, i, None, :]  # (B, E, N)
        ys.append(torch.einsum("ben,bn->be", state, C[:, i]))  # (B, E)
    return torch.stack(ys, dim=1)  # (B, T, E)


def selective_chunked(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, chunk: int) -> Tensor:
    """The same as :func:`selective_recurrent`, L positions at a time: inside a chunk every
    h_t = sum_{s<=t} exp(cum_t - cum_s) dt_s B_s x_s at once (cum the running sum of dt A,
    (B, L, L, E, N) in memory), across chunks the boundary state."""
    b, t, e = x.shape
    state = x.new_zeros(b, e, A.shape[-1])  # (B, E, N)
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=x.device).tril()
    ys = []
    for s in range(0, t, chunk):
        f = min(s + chunk, t)
        cum = torch.cumsum(dt[:, s:f, :, None] * A, dim=1)  # (B, L, E, N)
        seg = cum[:, :, None] - cum[:, None]  # (B, L, L, E, N)
        keep = causal[: f - s, : f - s, None, None]
        decay = torch.where(keep, seg, torch.full_like(seg, -torch.inf)).exp()
        u = (dt[:, s:f] * x[:, s:f])[..., None] * B[:, s:f, None, :]  # (B, L, E, N)
        h = torch.einsum("btsen,bsen->bten", decay, u) + cum.exp() * state[:, None]  # (B, L, E, N)
        ys.append(torch.einsum("bten,btn->bte", h, C[:, s:f]))  # (B, L, E)
        state = h[:, -1]
    return torch.cat(ys, dim=1)  # (B, T, E)


class MambaMixer(nn.Module):
    """in_proj -> (x, z); causal conv + silu on x; x_proj -> (r, B, C); dt = softplus(W_dt r
    + b); selective scan with the D skip; times silu(z); out_proj (HF JambaMambaMixer)."""

    causal = True

    def __init__(self, emb_dim: int, spec: MambaSpec):
        super().__init__()
        self.kind, self.impl, self.chunk = spec.kind, spec.impl, spec.chunk_size
        self.inner, self.d_state = spec.expand * emb_dim, spec.d_state
        self.rank = spec.dt_rank or math.ceil(emb_dim / 16)
        e, n = self.inner, self.d_state
        self.in_proj = declare_role(nn.Linear(emb_dim, 2 * e, bias=spec.bias), "value")
        self.conv1d = nn.Conv1d(e, e, spec.conv_width, groups=e, bias=spec.conv_bias)
        self.x_proj = nn.Linear(e, self.rank + 2 * n, bias=False)
        self.dt_proj = nn.Linear(self.rank, e, bias=True)
        with torch.no_grad():
            self.dt_proj.bias.copy_(inverse_softplus_dt(e, spec.dt_min, spec.dt_max))
        self.A_log = nn.Parameter(torch.log(torch.arange(1, n + 1, dtype=torch.float)).repeat(e, 1))
        self.D = nn.Parameter(torch.ones(e))
        self.out_proj = declare_role(nn.Linear(e, emb_dim, bias=spec.bias), "attn_out")
        self.norms = spec.inner_norms
        if self.norms:
            inner = RMSNormSpec(eps=spec.norm_eps)  # in float32 at least, as Jamba's
            self.dt_layernorm = RMSNorm(self.rank, inner, float32=True)
            self.b_layernorm = RMSNorm(n, inner, float32=True)
            self.c_layernorm = RMSNorm(n, inner, float32=True)

    def forward(self, x, memory=None, key_padding_mask=None, position_ids=None):
        no_memory(self.kind, memory)
        xs, z = self.in_proj(x).chunk(2, dim=-1)  # (B, T, E) each
        xs = masked(causal_conv(masked(xs, key_padding_mask), self.conv1d), key_padding_mask)
        r, B, C = self.x_proj(xs).split([self.rank, self.d_state, self.d_state], dim=-1)
        if self.norms:
            r, B, C = self.dt_layernorm(r), self.b_layernorm(B), self.c_layernorm(C)
        work = torch.promote_types(x.dtype, torch.float32)
        dt = r @ self.dt_proj.weight.t()  # (B, T, E)
        dt = masked(F.softplus(dt.to(work) + self.dt_proj.bias.to(work)), key_padding_mask)
        A = -torch.exp(self.A_log.to(work))  # (E, N)
        xw, B, C = xs.to(work), B.to(work), C.to(work)
        if self.impl == "recurrent":
            y = selective_recurrent(xw, dt, A, B, C)
        else:
            y = selective_chunked(xw, dt, A, B, C, self.chunk)  # (B, T, E)
        y = (y + xw * self.D.to(work)) * F.silu(z.to(work))
        return self.out_proj(y.to(x.dtype))  # (B, T, D)

    def state_size(self, t: int) -> int:
        """Numbers kept per sequence: the state (E, N) and the conv window."""
        return self.inner * self.d_state + (self.conv1d.kernel_size[0] - 1) * self.inner


@hookimpl
def register_attentions(register):
    def mamba2(spec, emb_dim, n_heads, context_length, drop_rate, qkv_bias, causal):
        refuse_bidirectional(spec.kind, causal)
        return Mamba2Mixer(emb_dim, n_heads, spec)

    def mamba(spec, emb_dim, n_heads, context_length, drop_rate, qkv_bias, causal):
        refuse_bidirectional(spec.kind, causal)
        return MambaMixer(emb_dim, spec)

    register("mamba2", Mamba2Spec, mamba2)
    register("mamba", MambaSpec, mamba)
