"""variantlab_plugins/norms.py by exact values (issue 30, mutation triage): every norm kind's
defaults, parameters and formula written out by hand (LayerNorm with and without its shift,
in both implementations; BatchNorm's batch and running statistics; RMSNorm in float32; the
parameter-free L2 norm; DyT), BatchNorm's causal warning, and the registered builds."""

import conftest
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import variantlab as vl
from variantlab_plugins.norms import DyT, LayerNorm, RMSNorm

REG = vl.get_registry()


def build(kind: str, dim: int = 4, **options):
    comp = REG.get("norm", kind)
    extra = {k: options.pop(k) for k in ("bias",) if k in options}
    return comp.build(comp.spec_cls(**options), dim=dim, **extra)


def x_low_variance() -> torch.Tensor:
    """Rows whose variance (~1e-6) is the size of eps, so that eps shows in the output."""
    return torch.tensor([[[1.0, 1.001, 0.999, 1.002], [0.0, 0.002, -0.001, 0.0005]]])


def test_defaults_of_every_norm_spec():
    spec = {k: REG.get("norm", k).spec_cls() for k in ("layer", "batch", "rms", "l2", "dyt")}
    assert spec["layer"].eps == 1e-5 and spec["layer"].impl == "naive"
    assert spec["batch"].eps == 1e-5 and spec["batch"].momentum == 0.1
    assert spec["rms"].eps == 1e-5 and spec["l2"].eps == 1e-6
    assert spec["dyt"].alpha0 == 0.5


@pytest.mark.parametrize("impl", ["naive", "fused"])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_formula_with_and_without_shift(impl, bias):
    x = x_low_variance()
    norm = build("layer", impl=impl, bias=bias)
    with torch.no_grad():
        norm.scale.copy_(torch.tensor([1.0, -2.0, 0.5, 3.0]))
        if bias:
            norm.shift.copy_(torch.tensor([0.25, 0.0, -1.0, 2.0]))
    mu = x.mean(-1, keepdim=True)
    want = (x - mu) / torch.sqrt(((x - mu) ** 2).mean(-1, keepdim=True) + 1e-5)
    want = want * torch.tensor([1.0, -2.0, 0.5, 3.0])
    if bias:
        want = want + torch.tensor([0.25, 0.0, -1.0, 2.0])
    torch.testing.assert_close(norm(x), want, atol=1e-5, rtol=1e-5)
    assert [n for n, _ in norm.named_parameters()] == (["scale", "shift"] if bias else ["scale"])


def test_registered_builds_default_to_a_shift():
    assert build("layer").shift is not None and build("dyt").shift is not None
    assert isinstance(build("none"), nn.Identity)


def test_batch_norm_pools_batch_and_positions_then_uses_running_statistics():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4) * torch.tensor([1.0, 2.0, 0.5, 3.0]) + 1.0  # (B, T, C)
    norm = build("batch")
    flat = x.reshape(6, 4)
    mean, var = flat.mean(0), flat.var(0, unbiased=False)
    torch.testing.assert_close(norm(x), (x - mean) / torch.sqrt(var + 1e-5), atol=1e-5, rtol=1e-5)
    running_mean = 0.1 * mean  # momentum 0.1 from 0
    running_var = 0.9 + 0.1 * flat.var(0, unbiased=True)  # from 1
    torch.testing.assert_close(norm.bn.running_mean, running_mean)
    torch.testing.assert_close(norm.bn.running_var, running_var)
    norm.eval()
    want = (x - running_mean) / torch.sqrt(running_var + 1e-5)
    torch.testing.assert_close(norm(x), want, atol=1e-5, rtol=1e-5)


def test_batch_norm_is_warned_about_in_causal_families_only():
    found = vl.parse_model_spec({**conftest.TINY, "norm": "batch"}, REG).warnings()
    assert len(found) == 1 and "pool over future positions" in found[0]
    assert "'gpt'" in found[0]
    spec = vl.parse_model_spec({**conftest.TINY, "family": "encoder", "norm": "batch"}, REG)
    assert spec.warnings() == []


def test_rms_norm_formula_and_float32_for_bfloat16_input():
    x = x_low_variance()
    norm = build("rms")
    with torch.no_grad():
        norm.scale.copy_(torch.tensor([1.0, -2.0, 0.5, 3.0]))
    want = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.scale
    torch.testing.assert_close(norm(x), want, atol=1e-6, rtol=1e-6)
    wide = type(norm)(64, REG.get("norm", "rms").spec_cls(eps=1e-5), float32=True)
    torch.manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16):  # normalised in float32, cast back
        xb = (torch.randn(4, 64) * 3).to(dtype)
        y = xb.float()
        want = (y / torch.sqrt(y.pow(2).mean(-1, keepdim=True) + 1e-5)).to(dtype) * wide.scale
        got = wide(xb)
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, atol=0, rtol=0)
    # float16 squares overflow past 65504: only the float32 path gives finite numbers
    big = torch.tensor([[300.0, -200.0, 100.0, 50.0]]).half()
    narrow = type(norm)(4, REG.get("norm", "rms").spec_cls(), float32=True)
    assert torch.isfinite(narrow(big)).all()
    assert not torch.isfinite(big.pow(2)).all()


def test_l2_norm_has_no_parameters_and_its_eps():
    norm = build("l2")
    assert list(norm.parameters()) == []
    x = x_low_variance()
    want = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(norm(x), want, atol=1e-6, rtol=1e-6)


def test_dyt_formula_and_without_shift():
    x = torch.tensor([[-3.0, -0.5, 0.0, 2.0]])
    norm = build("dyt")
    assert norm.alpha.item() == 0.5
    with torch.no_grad():
        norm.scale.copy_(torch.tensor([1.0, -2.0, 0.5, 3.0]))
        norm.shift.copy_(torch.tensor([0.25, 0.0, -1.0, 2.0]))
    want = torch.tensor([1.0, -2.0, 0.5, 3.0]) * torch.tanh(0.5 * x) + torch.tensor(
        [0.25, 0.0, -1.0, 2.0])
    torch.testing.assert_close(norm(x), want)
    bare = build("dyt", alpha0=2.0, bias=False)
    assert [n for n, _ in bare.named_parameters()] == ["alpha", "scale"]
    torch.testing.assert_close(bare(x), torch.tanh(2.0 * x))


@pytest.mark.parametrize("impl", ["naive", "fused"])
def test_layer_norm_impl_picks_the_code_that_runs_bit_for_bit(impl):
    """The written-out formula and ``F.layer_norm`` round differently in float32 (349 of
    these 512 values), so each implementation is told apart by exact equality."""
    torch.manual_seed(0)
    x = torch.randn(8, 64) * 3 + 1
    norm = build("layer", dim=64, impl=impl)
    with torch.no_grad():
        norm.scale.copy_(torch.linspace(0.5, 1.5, 64))
        norm.shift.copy_(torch.linspace(-0.5, 0.5, 64))
    mean, var = x.mean(-1, keepdim=True), x.var(-1, keepdim=True, unbiased=False)
    naive = norm.scale * ((x - mean) / torch.sqrt(var + 1e-5)) + norm.shift
    fused = F.layer_norm(x, (64,), norm.scale, norm.shift, 1e-5)
    assert not torch.equal(naive, fused)
    assert torch.equal(norm(x), naive if impl == "naive" else fused)


@pytest.mark.parametrize("momentum, ok", [(0.0, False), (1e-3, True), (1.0, True), (1.5, False)])
def test_batch_norm_momentum_is_in_0_exclusive_to_1(momentum, ok):
    data = {**conftest.TINY, "family": "encoder", "norm": {"kind": "batch", "momentum": momentum}}
    if ok:
        assert vl.parse_model_spec(data, REG).norm.momentum == momentum
    else:
        with pytest.raises(vl.SpecError, match="momentum"):
            vl.parse_model_spec(data, REG)


def test_norm_classes_built_directly_keep_their_defaults():
    specs = {k: REG.get("norm", k).spec_cls() for k in ("layer", "rms", "dyt")}
    assert LayerNorm(4, specs["layer"]).shift is not None
    assert DyT(4, specs["dyt"]).shift is not None
    torch.manual_seed(0)
    xb = (torch.randn(4, 64) * 3).bfloat16()
    default = RMSNorm(64, specs["rms"])  # computes in the input's dtype
    want = xb / torch.sqrt(xb.pow(2).mean(-1, keepdim=True) + 1e-5)
    assert torch.equal(default(xb), want * default.scale)
