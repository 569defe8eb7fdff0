"""Gated DeltaNet (variantlab_plugins/deltanet.py) against numbers worked out here, not by its
own code: the state a recurrent decoder keeps (the params probe's state_bytes) by formula,
the default head widths, and which head counts the spec accepts (the mutation triage of
docs/mutation.md)."""

import pytest
import torch

import variantlab as vl
from variantlab.errors import SpecError
from variantlab.probes import run_probe

REG = vl.get_registry()
TINY = {"family": "gpt", "vocab_size": 64, "context_length": 32, "emb_dim": 32, "n_heads": 4,
        "n_layers": 2, "drop_rate": 0.0}


def _state(rows, scope="model"):
    return {(r["name"], r["layer"]): r["value"] for r in rows
            if r["metric"] == "state_bytes" and r["scope"] == scope}


@pytest.mark.parametrize("attention, numbers", [
    # unset widths: 4 key and value heads of 32 / 4 = 8; S 4 x 8 x 8, conv window 3 x (8 + 8 + 8) x 4
    ({"kind": "gated_deltanet"}, 4 * 8 * 8 + 3 * (2 * 32 + 32)),
    # 2 key heads of 8, 4 value heads of 6, width 3: S 4 x 8 x 6, window 2 x (16 + 16 + 24)
    ({"kind": "gated_deltanet", "n_k_heads": 2, "n_v_heads": 4, "head_v_dim": 6,
      "conv_width": 3}, 4 * 8 * 6 + 2 * (16 + 16 + 24)),
    ({"kind": "gated_deltanet", "n_k_heads": 1, "head_k_dim": 5, "conv_width": 1}, 5 * 5),
])
def test_state_bytes_by_formula(attention, numbers):
    rows = run_probe("params", {**TINY, "attention": attention}, None, seed=0, registry=REG)
    per_layer = numbers * 4  # float32
    assert _state(rows, "layer") == {("", 0): per_layer, ("", 1): per_layer}
    assert _state(rows)[("", None)] == 2 * per_layer
    growth = [r["value"] for r in rows if r["metric"] == "state_bytes_per_token"]
    assert growth == [0]  # a fixed-size state: nothing grows with the context


def test_default_head_widths_are_emb_dim_over_n_heads():
    model = vl.build_model({**TINY, "attention": {"kind": "gated_deltanet"}}, REG)
    mixer = model.trf_blocks[0].att.sublayer
    # per key head q, k (8 each), per value head v, z (8 each): 4 x 32 rows
    assert mixer.in_proj_qkvz.weight.shape == (4 * (8 + 8 + 8 + 8), 32)
    assert mixer.in_proj_ba.weight.shape == (2 * 4, 32)
    assert mixer.conv1d.weight.shape == (3 * 32, 1, 4)
    assert mixer.out_proj.weight.shape == (32, 32)
    assert mixer.norm.weight.shape == (8,)


@pytest.mark.parametrize("k_heads, v_heads, ok", [
    (2, 4, True), (2, 6, True), (1, 3, True), (4, 4, True), (4, 2, False), (3, 4, False),
])
def test_value_heads_must_be_a_multiple_of_key_heads(k_heads, v_heads, ok):
    spec = {**TINY, "attention": {"kind": "gated_deltanet", "n_k_heads": k_heads,
                                  "n_v_heads": v_heads}}
    if ok:
        assert vl.parse_model_spec(spec, REG).attention.n_v_heads == v_heads
        return
    with pytest.raises(SpecError) as err:
        vl.parse_model_spec(spec, REG)
    assert [(i.loc, i.message) for i in err.value.issues] == [(
        ("attention", "n_v_heads"),
        f"n_v_heads={v_heads} is not a multiple of n_k_heads={k_heads}")]


@pytest.mark.parametrize("k_heads, v_heads, head_k, head_v", [
    (2, 6, 4, 3),  # three value heads per key head (HF's grouped in_proj layout)
    (4, 4, None, None),  # the unset widths: 32 / 4 = 8 each, one value head per key head
])
def test_head_groupings_equal_qwen3_next(k_heads, v_heads, head_k, head_v):
    """HF Qwen3NextGatedDeltaNet on the same perturbed weights, 9 tokens in chunks of 4,
    left padding in one row (tests/test_ssm.py covers 2 key heads of 4 value heads)."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    from variantlab_plugins.deltanet import GatedDeltaNet, GatedDeltaNetSpec

    torch.manual_seed(0)
    cfg = transformers.Qwen3NextConfig(
        hidden_size=32, linear_num_key_heads=k_heads, linear_num_value_heads=v_heads,
        linear_key_head_dim=head_k or 8, linear_value_head_dim=head_v or 8,
        linear_conv_kernel_dim=3, num_hidden_layers=1, rms_norm_eps=1e-6)
    hf = Qwen3NextGatedDeltaNet(cfg, layer_idx=0).eval()
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g))
    ours = GatedDeltaNet(32, 4, GatedDeltaNetSpec(
        n_k_heads=k_heads, n_v_heads=v_heads, head_k_dim=head_k, head_v_dim=head_v,
        conv_width=3, chunk_size=4))
    ours.load_state_dict(hf.state_dict())
    x = torch.randn(2, 9, 32, generator=g)
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :2] = 0
    real = mask.bool()
    with torch.no_grad():
        want = hf(x, attention_mask=mask)
        got = ours(x, key_padding_mask=mask == 0)
    assert torch.allclose(got[real], want[real], atol=1e-5), (got - want)[real].abs().max()


@pytest.mark.parametrize("impl", ["chunked", "recurrent"])
def test_impl_picks_the_form_it_names(monkeypatch, impl):
    """The two forms agree up to rounding, so only which one ran tells the setting was read."""
    import variantlab_plugins.deltanet as dn

    ran = []
    for name in ("delta_recurrent", "delta_chunked"):
        real = getattr(dn, name)
        monkeypatch.setattr(dn, name, lambda *a, _f=real, _n=name: ran.append(_n) or _f(*a))
    torch.manual_seed(0)
    mixer = dn.GatedDeltaNet(32, 4, dn.GatedDeltaNetSpec(impl=impl, chunk_size=2))
    assert mixer(torch.randn(1, 5, 32)).shape == (1, 5, 32)
    assert ran == [{"chunked": "delta_chunked", "recurrent": "delta_recurrent"}[impl]]


def test_the_walk_examples_are_settings_the_spec_accepts():
    """tests/test_registry_walk.py builds these; an example made invalid fails here too."""
    from variantlab_plugins.deltanet import GatedDeltaNetSpec

    for example in GatedDeltaNetSpec.walk_examples:
        spec = vl.parse_model_spec({**TINY, "attention": example}, REG)
        assert {key: getattr(spec.attention, key) for key in example} == example
