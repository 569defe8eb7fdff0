"""variantlab_plugins/activations.py by exact values (issue 30, mutation triage): each
activation, both GELU forms and both implementations, against its formula evaluated with
Python's ``math`` one number at a time."""

import math

import pytest
import torch
import torch.nn.functional as F

import variantlab as vl

REG = vl.get_registry()
XS = [-4.0, -1.5, -0.5, 0.0, 0.25, 1.0, 2.0, 3.5]


def build(kind: str, **options):
    comp = REG.get("activation", kind)
    return comp.build(comp.spec_cls(**options))


def gelu_tanh(x: float) -> float:
    return 0.5 * x * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def gelu_erf(x: float) -> float:
    return 0.5 * x * (1.0 + math.erf(x / math.sqrt(2.0)))


def check(module, formula):
    got = module(torch.tensor(XS, dtype=torch.float64))
    want = torch.tensor([formula(x) for x in XS], dtype=torch.float64)
    torch.testing.assert_close(got, want, atol=1e-7, rtol=1e-7)


def test_gelu_defaults_to_the_naive_tanh_approximation():
    spec = REG.get("activation", "gelu").spec_cls()
    assert (spec.approximate, spec.impl) == ("tanh", "naive")
    check(build("gelu"), gelu_tanh)


@pytest.mark.parametrize("impl", ["naive", "fused"])
def test_gelu_forms_in_each_implementation(impl):
    check(build("gelu", approximate="tanh", impl=impl), gelu_tanh)
    check(build("gelu", approximate="none", impl=impl), gelu_erf)


def test_the_two_gelu_forms_differ_where_the_approximation_shows():
    # they differ by ~1e-4 near |x| = 2; a swapped form fails the checks above
    assert abs(gelu_tanh(2.0) - gelu_erf(2.0)) > 1e-5


def test_relu_silu_and_squared_relu():
    check(build("relu"), lambda x: max(0.0, x))
    check(build("silu"), lambda x: x / (1.0 + math.exp(-x)))
    check(build("relu2"), lambda x: max(0.0, x) ** 2)


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_impl_picks_the_code_that_runs_bit_for_bit(approximate):
    """In float32 the explicit formula and ``F.gelu`` round differently on some inputs (119
    and 356 of these 1001), so each implementation is told apart by exact equality."""
    x = torch.linspace(-6, 6, 1001)
    fused = F.gelu(x, approximate=approximate)
    if approximate == "none":
        naive = 0.5 * x * (1 + torch.erf(x / math.sqrt(2.0)))
    else:
        c = torch.sqrt(torch.tensor(2.0 / torch.pi))
        naive = 0.5 * x * (1 + torch.tanh(c * (x + 0.044715 * torch.pow(x, 3))))
    assert not torch.equal(naive, fused)
    assert torch.equal(build("gelu", approximate=approximate, impl="fused")(x), fused)
    assert torch.equal(build("gelu", approximate=approximate, impl="naive")(x), naive)
