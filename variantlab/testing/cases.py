"""Standalone cases per slot: the component built alone with small explicit sizes, with the
slot's own contract (causality, cross-attention, padding masks, elementwise activations,
argument pass-through in residuals, init schemes that keep the parameter layout)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..model.build import accepts, block_scope, build_model, tag
from ..model.specs import DEFAULT_COMPONENTS, ComponentSpec, parse_model_spec, resolve_component
from ..plugin.registry import SLOTS, Registry
from .checker import CTX, HEADS, SEED, TINY_MODEL, B, Case, D, T, close, gen


def _default(slot: str, registry: Registry) -> ComponentSpec:
    return resolve_component(slot, DEFAULT_COMPONENTS[slot], registry)


def _maker(registry: Registry, slot: str, spec: ComponentSpec,
           optional: dict[str, Any] | None = None, **sizes: Any) -> Callable:
    """A builder of ``spec``'s component; ``optional`` keywords go only to builds that take
    them (as :class:`variantlab.Parts` passes them)."""
    comp = registry.get(slot, spec.kind)
    sizes.update({k: v for k, v in (optional or {}).items() if accepts(comp.build, k)})
    return lambda **more: tag(comp.build(spec, **{**sizes, **more}), slot, spec.kind)


def _x(*shape: int, seed: int = SEED) -> torch.Tensor:
    return torch.randn(*shape, generator=gen(seed))


def _eval(module: nn.Module, *args: Any, **kwargs: Any) -> torch.Tensor:
    module.eval()
    with torch.no_grad():
        return module(*args, **kwargs)


def _causality(make: Callable[[], nn.Module], what: str, causal: bool = True) -> Callable:
    def check() -> list[str]:
        """causality"""
        torch.manual_seed(0)
        module, x = make(), _x(B, T, D)
        y = x.clone()
        y[:, T // 2:] += _x(B, T - T // 2, D, seed=99)  # change only later positions
        same = close(_eval(module, x)[:, : T // 2], _eval(module, y)[:, : T // 2], 1e-5)
        if causal and not same:
            return [f"{what}: outputs at earlier positions change when later positions change"]
        if not causal and same:
            return [f"{what} with causal=False ignores later positions"]
        return []

    return check


def _causal_at_every_t(make: Callable[[], nn.Module], what: str) -> Callable:
    def check() -> list[str]:
        """causality at every position"""
        torch.manual_seed(0)
        module, x = make(), _x(B, T, D)
        base = _eval(module, x)
        bad = []
        for t in range(T - 1):  # change tokens t+1.. only
            y = x.clone()
            y[:, t + 1:] = _x(B, T - t - 1, D, seed=100 + t)
            if not close(_eval(module, y)[:, : t + 1], base[:, : t + 1], 1e-5):
                bad.append(t)
        return [f"{what}: outputs at earlier positions change when later positions change "
                f"(outputs at <= t when tokens after t change, t in {bad})"] if bad else []

    return check


def _state_size(make: Callable[[], nn.Module]) -> Callable:
    def check() -> list[str]:
        """state_size"""
        module = make()
        size = getattr(module, "state_size", None)
        if not callable(size):
            return ["a causal-only mixer must have state_size(t): the numbers it keeps per "
                    "sequence after t tokens (docs/plugins.md)"]
        got = [size(t) for t in (1, T, CTX)]
        if not all(isinstance(n, int) and n >= 0 for n in got) or got != sorted(got):
            return [f"state_size(1, {T}, {CTX}) = {got}: expected non-negative ints that do "
                    "not shrink as t grows"]
        return []

    return check


def _mixer_case(spec: ComponentSpec, make: Callable[..., nn.Module]) -> Case:
    """An attention-slot kind whose spec declares ``causal_only``: causal at every position,
    left padding honoured, and a clear refusal of bidirectional builds and of a memory."""
    def refuses_and_pads() -> list[str]:
        """refusals and padding"""
        found = []
        try:
            make(drop_rate=0.0, causal=False)
            found.append("causal_only, yet its build accepted causal=False (raise ValueError)")
        except ValueError:
            pass
        torch.manual_seed(0)
        module, x = make(drop_rate=0.0, causal=True), _x(B, T, D)
        try:
            _eval(module, x, memory=_x(B, 5, D, seed=3))
            found.append("causal_only, yet forward accepted a memory (raise ValueError)")
        except ValueError:
            pass
        pad = torch.zeros(B, T, dtype=torch.bool)
        pad[:, :3] = True  # left padding, as batched generation pads
        changed = x.clone()
        changed[:, :3] += 10.0
        a = _eval(module, x, key_padding_mask=pad)[:, 3:]
        b = _eval(module, changed, key_padding_mask=pad)[:, 3:]
        if not close(a, b, 1e-5):
            found.append("padded positions (key_padding_mask True) still influence the output")
        return found

    causal = lambda: make(drop_rate=0.0, causal=True)  # noqa: E731
    return Case(f"attention {spec.kind!r} (standalone, causal-only mixer)", causal, (_x(B, T, D),),
                expect=(B, T, D), extra=[
                    _causal_at_every_t(causal, "causal mixer"), refuses_and_pads,
                    _state_size(causal), _dropout_off(lambda: make(drop_rate=0.5, causal=True))])


def _dropout_off(make: Callable[[], nn.Module]) -> Callable:
    def check() -> list[str]:
        """dropout in eval mode"""
        torch.manual_seed(0)
        module, x = make(), _x(B, T, D)
        return [] if torch.equal(_eval(module, x), _eval(module, x)) else [
            "with drop_rate=0.5, eval-mode outputs still vary (dropout not switched off)"]

    return check


def _shape_kept(make: Callable[[], nn.Module], shape: tuple[int, ...], what: str) -> Callable:
    def check() -> list[str]:
        """other input shapes"""
        out = _eval(make(), _x(*shape))
        return [] if tuple(out.shape) == shape else [
            f"{what} {shape} gave output shape {tuple(out.shape)}"]

    return check


def _bias_switch(make: Callable[..., nn.Module]) -> Callable:
    def check() -> list[str]:
        """bias=False"""
        with_bias, without = make(bias=True), make(bias=False)
        count = [sum(p.numel() for p in m.parameters()) for m in (with_bias, without)]
        out = _eval(without, _x(B, T, D))
        found = [] if count[1] < count[0] else [
            f"bias=False kept all parameters ({count[1]} vs {count[0]} with bias=True)"]
        if tuple(out.shape) != (B, T, D) or not torch.isfinite(out).all():
            found.append(f"bias=False gave shape {tuple(out.shape)} or non-finite values")
        return found

    return check


def _optional_bias(registry: Registry, slot: str, spec: ComponentSpec, make: Callable) -> list:
    """The ``bias=False`` check, for builds that take the optional ``bias`` keyword."""
    return [_bias_switch(make)] if accepts(registry.get(slot, spec.kind).build, "bias") else []


def _attention_case(spec: ComponentSpec, registry: Registry) -> Case:
    sizes = dict(emb_dim=D, n_heads=HEADS, context_length=CTX, qkv_bias=True)
    default_norm = _default("norm", registry)

    def make_norm(dim: int, norm: ComponentSpec | None = None) -> nn.Module:
        """What build_model passes: a norm of the model's kind, or of ``norm``."""
        norm = norm or default_norm
        return registry.get("norm", norm.kind).build(norm, dim=dim)

    make = _maker(registry, "attention", spec, {"make_norm": make_norm}, **sizes)
    if getattr(type(spec), "causal_only", False):
        return _mixer_case(spec, make)

    def cross_and_padding() -> list[str]:
        """cross-attention and key padding mask"""
        torch.manual_seed(0)
        module, x, memory = make(drop_rate=0.0, causal=False), _x(B, T, D), _x(B, 5, D, seed=3)
        out = _eval(module, x, memory=memory)
        found = [] if tuple(out.shape) == (B, T, D) else [
            f"memory (B, S=5, D) gave output shape {tuple(out.shape)}, expected {(B, T, D)}"]
        pad = torch.zeros(B, 5, dtype=torch.bool)
        pad[:, 3:] = True
        changed = memory.clone()
        changed[:, 3:] += 10.0
        a = _eval(module, x, memory=memory, key_padding_mask=pad)
        b = _eval(module, x, memory=changed, key_padding_mask=pad)
        if not close(a, b, 1e-5):
            found.append("padded keys (key_padding_mask True) still influence the output")
        return found

    return Case(
        "attention (standalone, causal)", lambda: make(drop_rate=0.0, causal=True), (_x(B, T, D),),
        expect=(B, T, D), extra=[
            _causal_at_every_t(lambda: make(drop_rate=0.0, causal=True), "causal=True"),
            _causality(lambda: make(drop_rate=0.0, causal=False), "attention", causal=False),
            cross_and_padding, _dropout_off(lambda: make(drop_rate=0.5, causal=True)),
        ])


class _Sublayer(nn.Module):
    """A stand-in sublayer that records the extra arguments it receives."""

    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.proj = nn.Linear(d_in, d_out)
        self.seen: list[dict] = []

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        self.seen.append(dict(kwargs, _args=args))
        return self.proj(x) * kwargs.get("gain", 1.0)


def _residual_case(spec: ComponentSpec, registry: Registry) -> Case:
    if block_scope(spec):
        return _block_residual_case(spec, registry)
    norm = _default("norm", registry)
    make_norm = _maker(registry, "norm", norm)

    def make(drop_rate: float = 0.0) -> nn.Module:
        build = _maker(registry, "residual", spec, {"n_layers": TINY_MODEL["n_layers"]},
                       in_dim=D, out_dim=D, drop_rate=drop_rate)
        return build(sublayer=_Sublayer(D, D), make_norm=lambda dim: make_norm(dim=dim))

    def passes_arguments() -> list[str]:
        """extra arguments reach the sublayer"""
        module = make()
        _eval(module, _x(B, T, D), gain=0.5)
        sub = [m for m in module.modules() if isinstance(m, _Sublayer)]
        if not sub or not any(s.get("gain") == 0.5 for s in sub[0].seen):
            return ["forward(x, gain=0.5) did not pass gain=0.5 to the sublayer"]
        return []

    return Case("residual (standalone)", make, (_x(B, T, D),), expect=(B, T, D),
                zero_grad_is_bug=not getattr(type(spec), "zero_init_branch", False),
                extra=[passes_arguments, _dropout_off(lambda: make(0.5))])


def _block_residual_case(spec: ComponentSpec, registry: Registry) -> Case:
    """A block-scope residual (``scope = "block"``) around stand-in attention and
    feed-forward sublayers; extra forward arguments must reach the attention."""
    make_norm = _maker(registry, "norm", _default("norm", registry))

    def make(drop_rate: float = 0.0, attention: nn.Module | None = None) -> nn.Module:
        build = _maker(registry, "residual", spec, {"n_layers": TINY_MODEL["n_layers"]},
                       dim=D, drop_rate=drop_rate)
        return build(attention=attention or _Sublayer(D, D), feedforward=_Sublayer(D, D),
                     make_norm=lambda dim: make_norm(dim=dim))

    def passes_arguments() -> list[str]:
        """extra arguments reach the attention"""
        attention = _Sublayer(D, D)
        _eval(make(attention=attention), _x(B, T, D), gain=0.5)
        if not any(s.get("gain") == 0.5 for s in attention.seen):
            return ["forward(x, gain=0.5) did not pass gain=0.5 to the attention"]
        return []

    return Case("residual (standalone, block scope)", make, (_x(B, T, D),), expect=(B, T, D),
                zero_grad_is_bug=not getattr(type(spec), "zero_init_branch", False),
                extra=[passes_arguments, _dropout_off(lambda: make(0.5))])


def _init_case(spec: ComponentSpec, registry: Registry) -> Case:
    """An init scheme applied to a tiny ``block`` model: values change, layout does not."""
    comp = registry.get("init", spec.kind)
    base = parse_model_spec({**TINY_MODEL, "family": "block"}, registry)

    def make() -> nn.Module:
        model = build_model(base, registry)
        comp.build(spec)(model)
        return model

    def keeps_layout() -> list[str]:
        """keeps the parameter layout"""
        torch.manual_seed(0)
        model = build_model(base, registry)
        before = {n: (p.shape, p.dtype, p.requires_grad) for n, p in model.named_parameters()}
        comp.build(spec)(model)
        after = {n: (p.shape, p.dtype, p.requires_grad) for n, p in model.named_parameters()}
        bad = [n for n in before.keys() | after.keys() if before.get(n) != after.get(n)]
        nonfinite = [n for n, p in model.named_parameters() if not torch.isfinite(p).all()]
        return ([f"added, removed or changed parameters: {', '.join(sorted(bad)[:4])}"] * bool(bad)
                + [f"non-finite values in {', '.join(nonfinite[:4])}"] * bool(nonfinite))

    x = (_x(B, T, D),)
    return Case("init (on a block)", make, x, expect=(B, T, D), zero_grad_is_bug=False,
                extra=[keeps_layout])


def standalone_case(slot: str, spec: ComponentSpec, registry: Registry) -> Case:
    x = (_x(B, T, D),)
    if slot == "attention":
        return _attention_case(spec, registry)
    if slot == "residual":
        return _residual_case(spec, registry)
    if slot == "norm":
        make = _maker(registry, slot, spec, dim=D)
        return Case("norm (standalone)", make, x, expect=(B, T, D),
                    extra=[_shape_kept(make, (5, D), "input"),
                           *_optional_bias(registry, slot, spec, make)])
    if slot == "activation":
        make = _maker(registry, slot, spec)

        def elementwise() -> list[str]:
            """elementwise"""
            module, v = make(), x[0]
            full = _eval(module, v)
            ok = close(_eval(module, v.flip(-1)), full.flip(-1)) and close(
                _eval(module, v[:1, :3]), full[:1, :3])
            return [] if ok else ["output at a position depends on other positions"]

        return Case("activation (standalone)", make, x, expect=(B, T, D), extra=[elementwise])
    if slot == "feedforward":
        act = _maker(registry, "activation", _default("activation", registry))
        make = _maker(registry, slot, spec, emb_dim=D, make_activation=act)
        return Case("feedforward (standalone)", make, x, expect=(B, T, D),
                    extra=[_causality(make, "feedforward"),
                           *_optional_bias(registry, slot, spec, make)])
    if slot == "init":
        return _init_case(spec, registry)
    if slot == "positional":
        make = _maker(registry, slot, spec, emb_dim=D, context_length=CTX)
        return Case("positional (standalone)", make, x, expect=(B, T, D),
                    extra=[_shape_kept(make, (B, CTX, D), "input as long as context_length")])
    raise ValueError(f"unknown slot {slot!r}; choose one of {', '.join(SLOTS + ('family',))}")
