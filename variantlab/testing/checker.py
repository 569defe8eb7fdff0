"""Conformance kit for plugin authors: ``check_component(slot, spec, plugins=[...])``.

It builds the component on its own with small explicit sizes, then inside a tiny model of
every family it fits, and runs the same battery on each: output shape, finite values, a
gradient for every parameter, train/eval, determinism under a seed, ``state_dict``
round-trip, float64 and device moves, plus the slot's own contract (causality, cross-
attention, padding masks, elementwise activations, argument pass-through in residuals).
Every broken point is collected; one :class:`AssertionError` lists them all.
"""

from __future__ import annotations

import copy
import json
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .build import VariantWarning, build_model, tag
from .errors import SpecError
from .registry import SLOTS, Registry, build_registry
from .specs import DEFAULT_COMPONENTS, ComponentSpec, ModelSpec, parse_model_spec, resolve_component

__all__ = ["TINY_MODEL", "check_component", "component_problems"]

#: The tiny model every component is tried in (emb_dim 32, 2 layers, no dropout).
TINY_MODEL: dict[str, Any] = {
    "vocab_size": 64, "context_length": 32, "emb_dim": 32, "n_heads": 4, "n_layers": 2,
    "drop_rate": 0.0,
}
B, T, D, HEADS, CTX = 2, 8, 32, 4, 32  # standalone sizes
SEED = 1234


@dataclass
class Case:
    """One module under test: how to build it, feed it and score it."""

    name: str
    make: Callable[[], nn.Module]
    args: tuple
    kwargs: dict = field(default_factory=dict)
    expect: tuple[int, ...] | None = None
    loss: Callable[[torch.Tensor], torch.Tensor] | None = None
    zero_grad_is_bug: bool = True  # standalone modules: a parameter with an all-zero grad
    extra: list[Callable[[], list[str]]] = field(default_factory=list)


def _gen(seed: int = SEED) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _map(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple):
        return tuple(_map(o, fn) for o in obj)
    if isinstance(obj, dict):
        return {k: _map(v, fn) for k, v in obj.items()}
    return obj


def _to(dtype: torch.dtype | None = None, device: str | None = None) -> Callable:
    def move(t: torch.Tensor) -> torch.Tensor:
        t = t.to(device) if device else t
        return t.to(dtype) if dtype and t.is_floating_point() else t

    return move


def _close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-5) -> bool:
    return a.shape == b.shape and torch.allclose(a.float().cpu(), b.float().cpu(), rtol=tol, atol=tol)


def _projection_loss(shape: Sequence[int]) -> Callable[[torch.Tensor], torch.Tensor]:
    """A fixed random projection: no symmetry hides a parameter's gradient (unlike .sum())."""
    w = torch.randn(tuple(shape), generator=_gen(7), dtype=torch.float64)
    return lambda out: (out * w.to(out.device, out.dtype)).sum()


class _Checker:
    def __init__(self, case: Case):
        self.case, self.problems = case, []

    def fail(self, check: str, message: str) -> None:
        self.problems.append(f"{self.case.name}: {check}: {message}")

    def build(self, seed: int = 0) -> nn.Module:
        torch.manual_seed(seed)
        module = self.case.make()
        if not isinstance(module, nn.Module):
            raise TypeError(f"build returned {type(module).__name__}, not an nn.Module")
        return module

    def forward(self, module: nn.Module, move: Callable | None = None) -> torch.Tensor:
        args, kwargs = self.case.args, self.case.kwargs
        if move is not None:
            args, kwargs = _map(args, move), _map(kwargs, move)
        out = module(*args, **kwargs)
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"forward returned {type(out).__name__}, not a tensor")
        return out

    def guarded(self, check: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as exc:  # a plugin may raise anything; it is a finding
            self.fail(check, f"raised {type(exc).__name__}: {exc}")

    def run(self) -> list[str]:
        try:
            module = self.build()
        except Exception as exc:
            self.fail("build", f"raised {type(exc).__name__}: {exc}")
            return self.problems
        state = copy.deepcopy(module.state_dict())
        before = len(self.problems)
        self.guarded("forward/backward (train mode)", lambda: self.train_step(module))
        if any("raised" in p for p in self.problems[before:]):
            return self.problems  # every later check would raise the same way
        module.load_state_dict(state)  # undo running-statistics updates of the train pass
        self.guarded("train/eval switch", lambda: self.train_eval(module))
        self.guarded("determinism under a seed", self.determinism)
        self.guarded("state_dict round-trip", self.state_dict_round_trip)
        self.guarded("dtype move to float64", self.float64)
        self.guarded("device move", self.devices)
        for extra in self.case.extra:
            name = extra.__doc__ or extra.__name__
            try:
                for message in extra():
                    self.fail(name, message)
            except Exception as exc:
                self.fail(name, f"raised {type(exc).__name__}: {exc}")
        return self.problems

    def check_output(self, check: str, out: torch.Tensor) -> None:
        if self.case.expect is not None and tuple(out.shape) != tuple(self.case.expect):
            self.fail(check, f"output shape {tuple(out.shape)}, expected {tuple(self.case.expect)}")
        if out.is_floating_point() and not torch.isfinite(out).all():
            self.fail(check, "output has NaN or inf")

    def train_step(self, module: nn.Module) -> None:
        module.train()
        # float inputs become leaves that take a gradient, as they would inside a model
        out = self.forward(module, lambda t: t.detach().clone().requires_grad_(
            t.is_floating_point()))
        self.check_output("forward (train mode)", out)
        loss_fn = self.case.loss or _projection_loss(out.shape)
        loss = loss_fn(out)
        if not torch.isfinite(loss):
            self.fail("loss", f"loss is {loss.item()}")
        if not loss.requires_grad:
            self.fail("gradients", "the output does not depend on the input or any parameter")
            return
        module.zero_grad(set_to_none=True)
        loss.backward()
        found: dict[str, list[str]] = {}
        for name, p in module.named_parameters():
            if not p.requires_grad:
                continue
            if p.grad is None:
                found.setdefault("got no gradient (used in forward?)", []).append(name)
            elif not torch.isfinite(p.grad).all():
                found.setdefault("have a NaN or inf gradient", []).append(name)
            elif self.case.zero_grad_is_bug and not p.grad.abs().sum() > 0:
                found.setdefault("have an all-zero gradient", []).append(name)
        for what, names in found.items():
            more = f" (+{len(names) - 4} more)" if len(names) > 4 else ""
            self.fail("gradients", f"{len(names)} parameter(s) {what}: "
                      f"{', '.join(names[:4])}{more}")

    def train_eval(self, module: nn.Module) -> None:
        module.eval()
        if any(m.training for m in module.modules()):
            self.fail("train/eval switch", ".eval() left a submodule in training mode")
        with torch.no_grad():
            first, second = self.forward(module), self.forward(module)
        self.check_output("forward (eval mode)", first)
        if not torch.equal(first, second):
            self.fail("train/eval switch", "two eval-mode forwards of the same input differ")
        module.train()
        if not all(m.training for m in module.modules()):
            self.fail("train/eval switch", ".train() left a submodule in eval mode")

    def eval_out(self, module: nn.Module, move: Callable | None = None) -> torch.Tensor:
        module.eval()
        with torch.no_grad():
            return self.forward(module, move)

    def determinism(self) -> None:
        a, b = self.build(seed=5), self.build(seed=5)
        sa, sb = a.state_dict(), b.state_dict()
        if list(sa) != list(sb):
            self.fail("determinism under a seed", "two builds have different state_dict keys")
            return
        differ = [k for k in sa if not torch.equal(sa[k], sb[k])]
        if differ:
            more = f" (+{len(differ) - 4} more)" if len(differ) > 4 else ""
            self.fail("determinism under a seed",
                      f"two builds after torch.manual_seed(5) differ in {', '.join(differ[:4])}"
                      f"{more}; "
                      "draw initial values from torch's global generator only")
        if not torch.equal(self.eval_out(a), self.eval_out(b)):
            self.fail("determinism under a seed",
                      "two builds after torch.manual_seed(5) give different eval outputs")

    def state_dict_round_trip(self) -> None:
        a, b = self.build(seed=1), self.build(seed=2)
        b.load_state_dict(a.state_dict())
        if not _close(self.eval_out(a), self.eval_out(b), 1e-6):
            self.fail("state_dict round-trip",
                      "a fresh build loaded with the state_dict gives different outputs; "
                      "register every tensor the forward uses as a parameter or buffer")

    def float64(self) -> None:
        a = self.build()
        ref = self.eval_out(a)
        a64 = a.to(torch.float64)
        if a64 is None:
            self.fail("dtype move to float64", ".to(torch.float64) returned None")
            return
        wrong = [n for n, t in [*a64.named_parameters(), *a64.named_buffers()]
                 if t.is_floating_point() and t.dtype != torch.float64]
        if wrong:
            self.fail("dtype move to float64", f"tensors left in another dtype: {', '.join(wrong)}")
        out = self.eval_out(a64, _to(dtype=torch.float64))
        if out.dtype != torch.float64:
            self.fail("dtype move to float64", f"float64 input gave a {out.dtype} output")
        elif not _close(out, ref, 1e-3):
            self.fail("dtype move to float64", "float64 output differs from the float32 one")

    def devices(self) -> None:
        a = self.build()
        ref = self.eval_out(a)
        if not _close(self.eval_out(a.to("cpu"), _to(device="cpu")), ref, 1e-6):
            self.fail("device move", "output changed after .to('cpu')")
        if not torch.cuda.is_available():
            return
        gpu = self.build().to("cuda")
        out = self.eval_out(gpu, _to(device="cuda"))
        if out.device.type != "cuda":
            self.fail("device move", f"cuda input gave an output on {out.device}")
        elif not _close(out, ref, 2e-3):
            self.fail("device move", "cuda output differs from the cpu one")


# -- standalone cases per slot ----------------------------------------------------------
def _default(slot: str, registry: Registry) -> ComponentSpec:
    return resolve_component(slot, DEFAULT_COMPONENTS[slot], registry)


def _maker(registry: Registry, slot: str, spec: ComponentSpec, **sizes: Any) -> Callable:
    comp = registry.get(slot, spec.kind)
    return lambda **more: tag(comp.build(spec, **{**sizes, **more}), slot, spec.kind)


def _x(*shape: int, seed: int = SEED) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen(seed))


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
        same = _close(_eval(module, x)[:, : T // 2], _eval(module, y)[:, : T // 2], 1e-5)
        if causal and not same:
            return [f"{what}: outputs at earlier positions change when later positions change"]
        if not causal and same:
            return [f"{what} with causal=False ignores later positions"]
        return []

    return check


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


def _attention_case(spec: ComponentSpec, registry: Registry) -> Case:
    sizes = dict(emb_dim=D, n_heads=HEADS, context_length=CTX, qkv_bias=True)
    make = _maker(registry, "attention", spec, **sizes)

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
        if not _close(a, b, 1e-5):
            found.append("padded keys (key_padding_mask True) still influence the output")
        return found

    return Case(
        "attention (standalone, causal)", lambda: make(drop_rate=0.0, causal=True), (_x(B, T, D),),
        expect=(B, T, D), extra=[
            _causality(lambda: make(drop_rate=0.0, causal=True), "causal=True"),
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
    norm = _default("norm", registry)
    make_norm = _maker(registry, "norm", norm)

    def make(drop_rate: float = 0.0) -> nn.Module:
        build = _maker(registry, "residual", spec, in_dim=D, out_dim=D, drop_rate=drop_rate)
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


def _standalone_case(slot: str, spec: ComponentSpec, registry: Registry) -> Case:
    x = (_x(B, T, D),)
    if slot == "attention":
        return _attention_case(spec, registry)
    if slot == "residual":
        return _residual_case(spec, registry)
    if slot == "norm":
        make = _maker(registry, slot, spec, dim=D)
        return Case("norm (standalone)", make, x, expect=(B, T, D),
                    extra=[_shape_kept(make, (5, D), "input")])
    if slot == "activation":
        make = _maker(registry, slot, spec)

        def elementwise() -> list[str]:
            """elementwise"""
            module, v = make(), x[0]
            full = _eval(module, v)
            ok = _close(_eval(module, v.flip(-1)), full.flip(-1)) and _close(
                _eval(module, v[:1, :3]), full[:1, :3])
            return [] if ok else ["output at a position depends on other positions"]

        return Case("activation (standalone)", make, x, expect=(B, T, D), extra=[elementwise])
    if slot == "feedforward":
        act = _maker(registry, "activation", _default("activation", registry))
        make = _maker(registry, slot, spec, emb_dim=D, make_activation=act)
        return Case("feedforward (standalone)", make, x, expect=(B, T, D),
                    extra=[_causality(make, "feedforward")])
    if slot == "init":
        return _init_case(spec, registry)
    if slot == "positional":
        make = _maker(registry, slot, spec, emb_dim=D, context_length=CTX)
        return Case("positional (standalone)", make, x, expect=(B, T, D),
                    extra=[_shape_kept(make, (B, CTX, D), "input as long as context_length")])
    raise ValueError(f"unknown slot {slot!r}; choose one of {', '.join(SLOTS + ('model',))}")


# -- inside tiny models ----------------------------------------------------------------
def _model_case(spec: ModelSpec, registry: Registry) -> Case:
    batch = spec.make_batch(B, T, generator=_gen())
    out_shape = tuple(batch.target.shape)
    if spec.input_kind == "tokens":
        out_shape += (spec.vocab_size,)
    return Case(
        f"in family {spec.family!r}", lambda: build_model(spec, registry), (), dict(batch.inputs),
        expect=out_shape, loss=lambda out: spec.loss(out, batch.to(out.device)),
        zero_grad_is_bug=False)


def _uses(model: nn.Module, slot: str, kind: str) -> bool:
    if slot == "init":  # build_model applies the init scheme to every family
        return True
    return any(getattr(m, "variantlab_slot", None) == slot and getattr(m, "variantlab_kind", None)
               == kind for m in model.modules())


def _round_trip(data: Any, parse: Callable[[Any], Any], original: Any, what: str) -> list[str]:
    try:
        plain = json.loads(json.dumps(data))
    except (TypeError, ValueError) as exc:
        return [f"spec round-trip: {what} is not plain JSON data: {exc}"]
    try:
        again = parse(plain)
    except SpecError as exc:
        return [f"spec round-trip: {what} does not validate again: {exc}"]
    return [] if again == original else [f"spec round-trip: {what} validates to a different spec"]


def _family_problems(slot: str, spec: Any, registry: Registry,
                     families: Sequence[str] | None) -> list[str]:
    problems, fitted = [], []
    names = list(families) if families is not None else registry.kinds("model")
    for family in names:
        data = {**TINY_MODEL, "family": family}
        if slot == "model":
            data.update({k: v for k, v in spec.items() if k != "family"})
        else:
            data[slot] = spec.model_dump(mode="json")
        try:
            model_spec = parse_model_spec(data, registry)
            if slot != "model" and not _uses(build_model(model_spec, registry), slot, spec.kind):
                raise SpecError.at((slot,), f"family {family!r} has no {slot} slot")
        except Exception as exc:
            if families is not None:  # named explicitly: it must fit
                problems.append(f"in family {family!r}: build: {type(exc).__name__}: {exc}")
            continue
        fitted.append(family)
        problems += _Checker(_model_case(model_spec, registry)).run()
        problems += [f"in family {family!r}: {p}" for p in _round_trip(
            model_spec.to_data(), lambda d: parse_model_spec(d, registry), model_spec,
            "the model spec")]
    if not fitted and families is None:
        problems.append(f"fits no registered family ({', '.join(names)})")
    return problems


def component_problems(
    slot: str,
    spec: Mapping[str, Any] | ComponentSpec | str,
    plugins: Sequence[str] = (),
    *,
    families: Sequence[str] | None = None,
    registry: Registry | None = None,
) -> list[str]:
    """Every broken point of the component, as messages (empty when it conforms)."""
    registry = registry or build_registry(extra=plugins)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", VariantWarning)
        if slot == "model":
            data = dict(spec if isinstance(spec, Mapping) else {"family": spec})
            registry.get("model", data.get("family", "gpt"), ("family",))
            return _family_problems("model", data, registry, families)
        if slot not in SLOTS:
            raise ValueError(f"unknown slot {slot!r}; choose one of {', '.join(SLOTS)}, model")
        comp_spec = resolve_component(slot, spec, registry, (slot,))  # SpecError: bad spec
        problems = _round_trip(comp_spec.model_dump(mode="json"),
                               lambda d: resolve_component(slot, d, registry), comp_spec,
                               f"{slot} spec")
        problems += _Checker(_standalone_case(slot, comp_spec, registry)).run()
        problems += _family_problems(slot, comp_spec, registry, families)
    return problems


def check_component(
    slot: str,
    spec: Mapping[str, Any] | ComponentSpec | str,
    plugins: Sequence[str] = (),
    *,
    families: Sequence[str] | None = None,
    registry: Registry | None = None,
) -> None:
    """Check a component against its slot's contract; raise AssertionError listing every
    broken point. ``plugins`` are module names or ``.py`` paths loaded on top of the
    built-ins and installed entry points; ``families`` limits (and requires) the families
    tried, default every registered family that has the slot. ``slot="model"`` checks a
    model family: ``spec`` is then a model mapping such as ``{"family": "gpt"}``."""
    problems = component_problems(slot, spec, plugins, families=families, registry=registry)
    if problems:
        kind = spec.get("kind", spec.get("family")) if isinstance(spec, Mapping) else getattr(
            spec, "kind", spec)
        listing = "\n".join(f"  - {p}" for p in problems)
        raise AssertionError(f"{slot} {kind!r} breaks {len(problems)} point(s) of its contract:\n"
                             f"{listing}")
