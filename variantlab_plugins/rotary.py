"""Position schemes that act inside attention: rotary (RoPE) and ALiBi.

Both are :class:`variantlab.model.positions.Positions`: the token embeddings pass unchanged, and
the model's self-attentions call :meth:`rotate` or :meth:`score_bias`.
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

import torch
from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt

from variantlab import ComponentSpec
from variantlab.model.positions import Positions


class RotarySpec(ComponentSpec):
    """Rotary position embeddings (RoPE, Su et al. 2021, "RoFormer"): queries and keys
    rotated by position-dependent angles, so scores depend on relative positions."""

    kind: Literal["rotary"] = "rotary"
    acts_in_attention: ClassVar[bool] = True
    walk_examples: ClassVar[tuple[dict, ...]] = (  # tests/test_registry_walk.py tries these
        {"kind": "rotary", "theta": 500.0, "fraction": 0.5},
        {"kind": "rotary", "fraction": 0.375, "odd_rounding": "up"},
        {"kind": "rotary", "scaling": "linear", "factor": 2.0},
        {"kind": "rotary", "scaling": "dynamic", "factor": 2.0, "original_context": 4},
        {"kind": "rotary", "scaling": "yarn", "factor": 4.0, "original_context": 4,
         "beta_fast": 8.0, "truncate": False, "mscale": 1.0, "mscale_all_dim": 0.5},
        {"kind": "rotary", "scaling": "llama3", "factor": 8.0, "original_context": 4},
        {"kind": "rotary", "scaling": "longrope", "original_context": 4, "factor": 3.0,
         "fraction": 0.5, "short_factor": [1.0, 1.5], "long_factor": [2.0, 4.0]},)
    theta: PositiveFloat = Field(
        10000.0, description="base of the angle frequencies theta^(-2i/d) (Llama 3: 500000)")
    fraction: float = Field(
        1.0, gt=0.0, le=1.0, description="fraction of each head's dims rotated, r = "
        "int(head_dim * fraction), made even by odd_rounding (GPT-NeoX's rotary_pct; the rest "
        "pass unrotated)")
    odd_rounding: Literal["down", "up"] = Field(
        "down", description="an odd r: down rotates r - 1 dims; up rotates r + 1 dims with "
        "the r/2 rounded up frequencies theta^(-2i/r) of the odd r, as Hugging Face's rotary "
        "code does (GPT-NeoX with head_dim 12, rotary_pct 0.25)")

    scaling: Literal["none", "linear", "dynamic", "yarn", "llama3", "longrope"] = Field(
        "none", description="context extension of the frequencies (Hugging Face's rope_type): "
        "none; linear (positions / factor, Chen et al. 2023); dynamic (NTK-aware base grown "
        "with the sequence length past original_context); yarn (Peng et al. 2023: NTK-by-parts "
        "ramp between beta_fast and beta_slow rotations, cos and sin times an attention "
        "factor); llama3 (Llama 3.1: long wavelengths / factor, a smooth band between "
        "low_freq_factor and high_freq_factor); longrope (Phi-3: one rescale factor per "
        "frequency, short_factor up to original_context, long_factor past it)")
    factor: PositiveFloat = Field(
        1.0, description="the context extension factor (linear, dynamic, yarn, llama3; "
        "longrope: only in its default attention factor)")
    original_context: PositiveInt | None = Field(
        None, description="the pretraining context the scaling extends (original_max_position_"
        "embeddings; dynamic: the length past which the base grows, Hugging Face's "
        "max_position_embeddings); needed by dynamic, yarn, llama3 and longrope")
    low_freq_factor: PositiveFloat = Field(
        1.0, description="llama3: wavelengths above original_context / low_freq_factor are "
        "divided by factor")
    high_freq_factor: PositiveFloat = Field(
        4.0, description="llama3: wavelengths below original_context / high_freq_factor are "
        "kept; between the two bounds, a smooth mix")
    beta_fast: PositiveFloat = Field(
        32.0, description="yarn: frequencies turning more than beta_fast times over "
        "original_context are kept (extrapolated)")
    beta_slow: PositiveFloat = Field(
        1.0, description="yarn: frequencies turning fewer than beta_slow times are divided by "
        "factor (interpolated); a linear ramp between")
    truncate: bool = Field(
        True, description="yarn: round the ramp's bounds to whole dims (floor, ceil); false "
        "in gpt-oss")
    mscale: NonNegativeFloat | None = Field(
        None, description="yarn: with mscale_all_dim (DeepSeek), the attention factor is "
        "(0.1 mscale ln factor + 1) / (0.1 mscale_all_dim ln factor + 1)")
    mscale_all_dim: NonNegativeFloat | None = Field(
        None, description="yarn: see mscale")
    attention_factor: PositiveFloat | None = Field(
        None, description="yarn, longrope: cos and sin are multiplied by it (query-key scores "
        "by its square); unset = the paper's: yarn 0.1 ln factor + 1 (or the mscale ratio), "
        "longrope sqrt(1 + ln factor / ln original_context)")
    short_factor: list[PositiveFloat] | None = Field(
        None, description="longrope: one divisor per frequency (rotated dims / 2) for "
        "sequences up to original_context")
    long_factor: list[PositiveFloat] | None = Field(
        None, description="longrope: one divisor per frequency for longer sequences")

    #: the scaling options, in the order they were added; each kind reads those in USES
    added_options: ClassVar[tuple[str, ...]] = (
        "scaling", "factor", "original_context", "low_freq_factor", "high_freq_factor",
        "beta_fast", "beta_slow", "truncate", "mscale", "mscale_all_dim", "attention_factor",
        "short_factor", "long_factor")
    USES: ClassVar[dict[str, tuple[str, ...]]] = {
        "none": (), "linear": ("factor",), "dynamic": ("factor", "original_context"),
        "yarn": ("factor", "original_context", "beta_fast", "beta_slow", "truncate", "mscale",
                 "mscale_all_dim", "attention_factor"),
        "llama3": ("factor", "original_context", "low_freq_factor", "high_freq_factor"),
        "longrope": ("factor", "original_context", "attention_factor", "short_factor",
                     "long_factor")}

    def errors(self, model) -> list[tuple[str, str]]:
        head_dim = getattr(model.attention, "head_dim", None) or model.emb_dim // model.n_heads
        if hasattr(model.attention, "sizes"):  # MLA rotates its qk_rope_head_dim part
            head_dim = model.attention.sizes(model.emb_dim, model.n_heads)["qk_rope_head_dim"]
        rot = int(head_dim * self.fraction)
        if self.odd_rounding == "up" and rot % 2 and rot + 1 > head_dim:
            return [("odd_rounding", f"rounding int({head_dim} * {self.fraction}) = {rot} up "
                     f"rotates {rot + 1} dims, more than the head has ({head_dim}); use "
                     "odd_rounding: down")]
        return self.scaling_errors(rot if self.odd_rounding == "up" else rot - rot % 2)

    def scaling_errors(self, rot: int) -> list[tuple[str, str]]:
        """What the ``scaling`` kind lacks or does not read, for ``rot`` rotated dims."""
        uses = self.USES[self.scaling]
        fields = type(self).model_fields
        for name in self.added_options[1:]:
            if name not in uses and getattr(self, name) != fields[name].default:
                return [(name, f"{name} is not read by scaling {self.scaling!r}; drop it "
                         f"(it is read by {self._readers(name)})")]
        if self.scaling != "none" and "original_context" in uses and self.original_context is None:
            return [("original_context", f"scaling {self.scaling!r} needs original_context, "
                     "the pretraining context it extends")]
        if self.scaling == "llama3" and self.high_freq_factor <= self.low_freq_factor:
            return [("high_freq_factor", f"high_freq_factor={self.high_freq_factor} must "
                     f"exceed low_freq_factor={self.low_freq_factor}")]
        if self.scaling == "dynamic" and rot <= 2:
            return [("scaling", f"dynamic scaling grows the base by an exponent rot / (rot - "
                     f"2), undefined for {rot} rotated dims; rotate more dims")]
        if self.scaling == "longrope":
            for name in ("short_factor", "long_factor"):
                values = getattr(self, name)
                if values is None or len(values) != (rot + 1) // 2:
                    have = "none" if values is None else f"{len(values)} values"
                    return [(name, f"longrope needs {name} with one value per frequency, "
                             f"{(rot + 1) // 2} for {rot} rotated dims; it has {have}")]
        return []

    def _readers(self, name: str) -> str:
        return ", ".join(kind for kind, uses in self.USES.items() if name in uses)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) over the two halves of the last dim (the GPT-NeoX/HF Llama
    pairing: dim i rotates with dim i + d/2)."""
    x1, x2 = x.chunk(2, dim=-1)  # (..., d/2) each
    return torch.cat((-x2, x1), dim=-1)  # (..., d)


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature sqrt(1/t) = 0.1 ln(factor) + 1 (Peng et al. 2023, eq. 22),
    ``mscale`` times the log term as DeepSeek writes it; 1 for no extension."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def scaled_frequencies(spec: RotarySpec, rot: int, seq_len: int) -> tuple[torch.Tensor, float]:
    """The inverse frequencies (ceil(rot/2),) float32 of ``spec``'s scaling for a sequence
    of ``seq_len`` positions, and the factor cos and sin are multiplied by. Written from the
    papers and laid out as Hugging Face's ``modeling_rope_utils`` computes them (the same
    float32 operations, so the logits agree to rounding):

    - none: theta^(-2i/rot) (Su et al. 2021);
    - linear (position interpolation, Chen et al. 2023): each frequency / factor;
    - dynamic (NTK-aware, bloc97 / emozilla): past ``original_context`` = L0 the base becomes
      theta (factor L / L0 - (factor - 1))^(rot / (rot - 2)) for L = ``seq_len``;
    - yarn (Peng et al. 2023, NTK-by-parts): for the dims d(r) = rot ln(L0 / 2 pi r) /
      (2 ln theta) turning r = beta_fast and beta_slow times over L0 (floored and ceiled with
      ``truncate``), a ramp from the original frequency (fast) to frequency / factor (slow);
      cos and sin times ``attention_factor`` (default 0.1 ln factor + 1, or DeepSeek's
      ratio of that with mscale and with mscale_all_dim);
    - llama3 (Llama 3.1): wavelengths 2 pi / f past L0 / low_freq_factor divided by factor,
      those under L0 / high_freq_factor kept, a smooth mix s = (L0 / wavelength -
      low_freq_factor) / (high_freq_factor - low_freq_factor) between;
    - longrope (Ding et al. 2024, Phi-3): frequency i divided by ``short_factor[i]`` up to
      L0 positions, by ``long_factor[i]`` past; cos and sin times ``attention_factor``
      (default sqrt(1 + ln factor / ln L0)).
    """
    shape = torch.arange(0, rot, 2, dtype=torch.int64).float() / rot  # (ceil(rot/2),)
    inv_freq = 1.0 / (spec.theta ** shape)
    kind, factor, original = spec.scaling, spec.factor, spec.original_context or 0
    if kind == "none":
        return inv_freq, 1.0
    if kind == "linear":
        return inv_freq / factor, 1.0
    if kind == "dynamic":
        if seq_len <= original:
            return inv_freq, 1.0
        growth = torch.tensor(seq_len) * factor / original - (factor - 1)  # float32, as HF
        base = spec.theta * growth ** (rot / (rot - 2))
        return 1.0 / (base ** shape), 1.0
    if kind == "llama3":
        low_wavelen = original / spec.low_freq_factor
        high_wavelen = original / spec.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (original / wavelen - spec.low_freq_factor) / (
            spec.high_freq_factor - spec.low_freq_factor)
        mixed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        return torch.where(medium, mixed, scaled), 1.0
    if kind == "longrope":
        attention = spec.attention_factor or (1.0 if factor <= 1 else math.sqrt(
            1 + math.log(factor) / math.log(original)))
        divisors = spec.long_factor if seq_len > original else spec.short_factor
        return 1.0 / (torch.tensor(divisors, dtype=torch.float32) * spec.theta ** shape), \
            attention
    # yarn
    if spec.attention_factor is not None:
        attention = spec.attention_factor
    elif spec.mscale and spec.mscale_all_dim:
        attention = yarn_mscale(factor, spec.mscale) / yarn_mscale(factor, spec.mscale_all_dim)
    else:
        attention = yarn_mscale(factor)

    def correction_dim(rotations: float) -> float:
        return rot * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(spec.theta))

    low, high = correction_dim(spec.beta_fast), correction_dim(spec.beta_slow)
    if spec.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rot - 1)
    if low == high:
        high += 0.001  # a one-dim ramp, as Hugging Face guards it
    ramp = ((torch.arange(rot // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = spec.theta ** shape
    kept = 1 - ramp  # the share of the original (extrapolated) frequency
    return (1.0 / (factor * pos_freqs)) * (1 - kept) + (1.0 / pos_freqs) * kept, attention


class RotaryPositions(Positions):
    """RoPE (Su et al. 2021) in the rotate_half layout of GPT-NeoX and Hugging Face Llama:
    ``x * cos + rotate_half(x) * sin`` over the first ``rot`` dims of each head, with angle
    ``pos * theta^(-2i/rot)`` shared by dims i and i + rot/2. Angles are computed in float32
    and cast to the input's dtype, as Hugging Face does. With ``odd_rounding="up"`` and an
    odd ``r = int(head_dim * fraction)``, the angles are ``pos * theta^(-2i/r)`` for
    i < (r + 1)/2, so r + 1 dims rotate (Hugging Face's ``inv_freq`` over the odd r).

    With a ``scaling`` (``spec``), the frequencies and the factor on cos and sin are
    :func:`scaled_frequencies`; dynamic and longrope read the sequence length of each call,
    ``max(position_ids) + 1`` (the number of positions when none are given), as Hugging
    Face's do; unlike Hugging Face's dynamic kind, which keeps the frequencies of the
    longest sequence it has seen until one shorter than the original context comes, ours
    depend on the call alone (equal to a fresh Hugging Face model's)."""

    rotates = True

    def __init__(self, theta: float = 10000.0, fraction: float = 1.0,
                 odd_rounding: str = "down", spec: RotarySpec | None = None):
        super().__init__()
        self.theta, self.fraction, self.odd_rounding = theta, fraction, odd_rounding
        self.spec = spec or RotarySpec.model_validate(
            {"theta": theta, "fraction": fraction, "odd_rounding": odd_rounding})
        self._by_length = self.spec.scaling in ("dynamic", "longrope")
        self._cache: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def rotary_dims(self, head_dim: int) -> int:
        """The ``r`` whose frequencies theta^(-2i/r) rotate r dims (r even) or, rounded up,
        r + 1 (r odd)."""
        rot = int(head_dim * self.fraction)
        return rot if self.odd_rounding == "up" else rot - rot % 2

    def cos_sin(self, rot: int, position_ids: torch.Tensor, seq_len: int | None = None,
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin, (B or 1, 1, T, rot rounded up to even) in float32, for positions
        (B or 1, T) of a sequence of ``seq_len`` positions (default max(position_ids) + 1;
        read by the dynamic and longrope scalings only)."""
        if seq_len is None:
            seq_len = int(position_ids.max()) + 1 if self._by_length else 0
        inv_freq, attention = scaled_frequencies(self.spec, rot, seq_len)
        freqs = position_ids[..., None].float() * inv_freq.to(position_ids.device)  # (B, T, ceil(rot/2))
        emb = torch.cat((freqs, freqs), dim=-1)  # (B, T, 2 ceil(rot/2))
        cos, sin = emb.cos(), emb.sin()
        if attention != 1.0:
            cos, sin = cos * attention, sin * attention
        return cos[:, None], sin[:, None]  # (B, 1, T, 2 ceil(rot/2)) each

    def _default_cos_sin(self, rot: int, t: int, device: torch.device):
        key = (rot, t, str(device))
        if key not in self._cache:
            if len(self._cache) > 8:
                self._cache.clear()
            self._cache[key] = self.cos_sin(rot, torch.arange(t, device=device)[None], t)
        return self._cache[key]

    def rotate(self, q, k, position_ids=None):  # q (B, H, T, hd), k (B, H_kv, T, hd)
        rot = self.rotary_dims(q.shape[-1])
        if rot == 0:
            return q, k
        if position_ids is None:
            cos, sin = self._default_cos_sin(rot, q.shape[2], q.device)
        else:
            cos, sin = self.cos_sin(rot, position_ids)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)  # (B, 1, T, width)
        width = cos.shape[-1]  # rot, or rot + 1 for an odd rot rounded up
        return self._rotate_one(q, cos, sin, width), self._rotate_one(k, cos, sin, width)

    @staticmethod
    def _rotate_one(x, cos, sin, rot):  # x (B, H, T, hd)
        x_rot, x_pass = x[..., :rot], x[..., rot:]  # (B, H, T, rot), (B, H, T, hd - rot)
        x_rot = x_rot * cos + rotate_half(x_rot) * sin  # (B, H, T, rot)
        return torch.cat((x_rot, x_pass), dim=-1) if x_pass.shape[-1] else x_rot

    def extra_repr(self) -> str:
        odd = ", odd_rounding=up" if self.odd_rounding == "up" else ""
        scaled = (f", scaling={self.spec.scaling}, factor={self.spec.factor}"
                  if self.spec.scaling != "none" else "")
        return f"theta={self.theta}, fraction={self.fraction}{odd}{scaled}"


class QueryTemperatureSpec(ComponentSpec):
    """No position embeddings, and queries scaled by a temperature that grows with the
    position: q_t * (scale * ln(1 + floor((t + 1) / floor_scale)) + 1) (Nakanishi 2025,
    "Scalable-Softmax Is Superior for Attention", as Llama 4 applies it to its NoPE layers
    with ``attn_temperature_tuning``); keys unchanged. t counts sequence indices, padding
    included, as Llama 4's cache positions do."""

    kind: Literal["query_temperature"] = "query_temperature"
    acts_in_attention: ClassVar[bool] = True
    walk_examples: ClassVar[tuple[dict, ...]] = (  # tests/test_registry_walk.py tries these
        {"kind": "query_temperature", "floor_scale": 2, "scale": 0.5},)
    floor_scale: PositiveInt = Field(
        8192, description="positions per step of the temperature (Llama 4: 8192)")
    scale: NonNegativeFloat = Field(
        0.1, description="the temperature's growth per log step (Llama 4's attn_scale: 0.1)")


class QueryTemperaturePositions(Positions):
    """:class:`QueryTemperatureSpec`: each query times its position's temperature, computed
    in float32 and cast back, as transformers' Llama 4 does."""

    rotates = True

    def __init__(self, floor_scale: int = 8192, scale: float = 0.1):
        super().__init__()
        self.floor_scale, self.scale = floor_scale, scale

    def rotate(self, q, k, position_ids=None):  # q (B, H, T, hd), k (B, H_kv, T, hd)
        t = torch.arange(q.shape[2], device=q.device, dtype=torch.float32)  # sequence indices
        scales = torch.log1p(torch.floor((t + 1.0) / self.floor_scale)) * self.scale + 1.0
        return (q * scales[:, None]).to(q.dtype), k  # scales (T, 1) over (B, H, T, hd)

    def extra_repr(self) -> str:
        return f"floor_scale={self.floor_scale}, scale={self.scale}"


class ALiBiSpec(ComponentSpec):
    """Attention with Linear Biases (ALiBi, Press et al. 2022, "Train Short, Test Long"): no
    position embeddings; each head's scores get -slope * distance to the key."""

    kind: Literal["alibi"] = "alibi"
    acts_in_attention: ClassVar[bool] = True
    biases_scores: ClassVar[bool] = True  # a sequence mixer without scores cannot take it


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """Per-head slopes (Press et al. 2022, sec. 3): for n a power of 2, the geometric sequence
    2^(-8/n), 2^(-16/n), ..., 2^(-8); otherwise the slopes of the closest smaller power of 2,
    m, followed by every other slope of 2m, until n are taken (the paper's code)."""

    def power_of_2(n: int) -> list[float]:
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_heads).is_integer():
        return torch.tensor(power_of_2(n_heads))
    m = 2 ** math.floor(math.log2(n_heads))
    return torch.tensor(power_of_2(m) + power_of_2(2 * m)[0::2][: n_heads - m])


class ALiBiPositions(Positions):
    """ALiBi (Press et al. 2022): score bias -slope_h * |i - j| for query i and key j (for
    causal attention the paper's -slope_h * (i - j) on every visible key; bidirectional
    attention uses the symmetric distance). Distances count sequence indices: with left
    padding, the distances between real tokens are unchanged."""

    biases = True

    def score_bias(self, n_heads, t, s, device, dtype):
        slopes = alibi_slopes(n_heads).to(device=device, dtype=torch.float32)  # (H,)
        i = torch.arange(t, device=device)[:, None] + (s - t)  # (T, 1): queries end with keys
        j = torch.arange(s, device=device)[None, :]  # (1, S)
        distance = (i - j).abs().float()  # (T, S)
        return (-slopes[:, None, None] * distance).to(dtype)  # (H, T, S)
