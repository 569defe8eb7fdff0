"""One RMSNorm (variantlab_plugins/norms.py) for the norm slot and Jamba's inner norms: its
``float32`` option normalises in float32 at least. References are the formulas written out."""

import torch

from variantlab_plugins.norms import RMSNorm, RMSNormSpec
from variantlab_plugins.ssm import MambaMixer, MambaSpec


def _norm(dim: int, eps: float, float32: bool = False) -> RMSNorm:
    norm = RMSNorm(dim, RMSNormSpec(eps=eps), float32=float32)
    with torch.no_grad():
        norm.scale.copy_(torch.linspace(0.5, 1.5, dim))
    return norm


def test_the_default_is_the_formula_bit_for_bit():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 8) * 3
    norm = _norm(8, 1e-5)
    want = norm.scale * (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))
    assert torch.equal(norm(x), want)


def test_float32_changes_nothing_for_float32_input():
    torch.manual_seed(1)
    x = torch.randn(3, 4, 16)
    assert torch.equal(_norm(16, 1e-6, float32=True)(x), _norm(16, 1e-6)(x))


def test_float32_normalises_bfloat16_input_in_float32():
    torch.manual_seed(2)
    x = (torch.randn(2, 7, 16) * 4).bfloat16()
    up = x.float()
    want = (up / torch.sqrt(up.pow(2).mean(-1, keepdim=True) + 1e-6)).bfloat16()
    norm = _norm(16, 1e-6, float32=True)
    got = norm(x)
    assert torch.equal(got, norm.scale * want)
    # in bfloat16 throughout the mean of squares rounds: not the same numbers
    plain = _norm(16, 1e-6)(x)
    assert not torch.equal(plain, got)


def test_jambas_inner_norms_give_the_numbers_of_the_old_rsqrt_form():
    """The inner norms were a separate class computing weight * (x * rsqrt(mean(x^2) + eps))
    in float32: the one RMSNorm gives the same numbers within float32 rounding."""
    torch.manual_seed(3)
    mixer = MambaMixer(32, MambaSpec(d_state=4, dt_rank=3, inner_norms=True, chunk_size=3))
    for norm in (mixer.dt_layernorm, mixer.b_layernorm, mixer.c_layernorm):
        with torch.no_grad():
            norm.scale.uniform_(0.5, 1.5)
        assert norm.float32 and norm.eps == 1e-6
        x = torch.randn(2, 9, norm.scale.numel()) * 2
        old = norm.scale * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps))
        torch.testing.assert_close(norm(x), old, rtol=2e-7, atol=1e-7)
