"""Gemma 2 and Gemma 3 (text) from transformers: perturbed weights, equal parameter counts,
logits within 1e-4 in float32 with and without a padding mask, a layout of sliding and full
layers (with their own rotary bases in Gemma 3), soft-capping, and a YAML round trip."""

import pytest
import torch
import yaml
from conftest import n_params, perturbed

transformers = pytest.importorskip("transformers")

import variantlab as vl  # noqa: E402
from variantlab import from_transformers  # noqa: E402
from variantlab.config.yamlio import spec_yaml  # noqa: E402

REG = vl.get_registry()
BASE = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            intermediate_size=48, num_hidden_layers=5, vocab_size=64,
            max_position_embeddings=64, sliding_window=4, query_pre_attn_scalar=24)
CASES = {
    "gemma2": ("Gemma2", dict(BASE, attn_logit_softcapping=2.0, final_logit_softcapping=3.0)),
    "gemma2-no-caps-untied": ("Gemma2", dict(BASE, attn_logit_softcapping=None,
                                             final_logit_softcapping=None,
                                             tie_word_embeddings=False)),
    "gemma3": ("Gemma3Text", dict(BASE, sliding_window_pattern=3, rope_theta=50_000.0,
                                  rope_local_base_freq=100.0)),
    "gemma3-caps": ("Gemma3Text", dict(BASE, layer_types=[
        "sliding_attention", "full_attention", "full_attention", "sliding_attention",
        "full_attention"], attn_logit_softcapping=4.0, final_logit_softcapping=5.0)),
}


def hf_model(family, kwargs):
    torch.manual_seed(0)
    config = getattr(transformers, f"{family}Config")(**kwargs, attn_implementation="eager")
    cls = "Gemma3ForCausalLM" if family == "Gemma3Text" else f"{family}ForCausalLM"
    return perturbed(getattr(transformers, cls)(config))


@pytest.mark.parametrize("case", list(CASES))
def test_logits_equal_on_perturbed_weights(case):
    hf = hf_model(*CASES[case])
    spec, model = from_transformers(hf, REG)
    model.eval()
    assert n_params(model) == n_params(hf)
    idx = torch.randint(0, 64, (2, 12))  # longer than the window: sliding layers differ
    with torch.no_grad():
        ref, ours = hf(idx).logits, model(idx)
    assert (ours - ref).abs().max().item() < 1e-4
    types = hf.config.layer_types
    assert [spec.layout.kind_at(i) for i in range(5)] == [t.split("_")[0] for t in types]


@pytest.mark.parametrize("case", ["gemma2", "gemma3"])
def test_left_padded_mask(case):
    hf = hf_model(*CASES[case])
    _, model = from_transformers(hf, REG)
    model.eval()
    idx = torch.randint(0, 64, (3, 11))
    mask = torch.ones(3, 11, dtype=torch.long)
    mask[0, :4] = 0
    mask[2, :1] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ref = hf(idx, attention_mask=mask, position_ids=positions).logits
        ours = model(idx, attention_mask=mask)
    real = mask.bool()
    assert (ours[real] - ref[real]).abs().max().item() < 1e-4


def test_what_the_spec_says():
    spec, _ = from_transformers(hf_model(*CASES["gemma3"]), REG)
    assert spec.scale_embeddings and spec.residual.kind == "sandwich"
    assert spec.attention.scale == pytest.approx(24 ** -0.5) and spec.attention.qk_norm
    assert spec.positional.theta == 50_000.0
    sliding = spec.layout.kinds["sliding"]
    assert sliding["attention"].window == 4 and sliding["positional"].theta == 100.0
    assert spec.layout.pattern == ["sliding", "sliding", "full"]
    g2, _ = from_transformers(hf_model(*CASES["gemma2"]), REG)
    assert g2.logit_softcap == 3.0 and g2.attention.softcap == 2.0
    assert g2.layout.pattern == ["sliding", "full"] and "positional" not in g2.layout.kinds["sliding"]


@pytest.mark.parametrize("case", ["gemma2", "gemma3"])
def test_yaml_round_trip(case):
    hf = hf_model(*CASES[case])
    spec, model = from_transformers(hf, REG)
    again = vl.parse_model_spec(yaml.safe_load(spec_yaml(spec))["model"], REG)
    assert again == spec
    torch.manual_seed(0)
    rebuilt = vl.build_model(again, REG)
    rebuilt.load_state_dict(model.state_dict())
    idx = torch.randint(0, 64, (1, 9))
    with torch.no_grad():
        assert torch.equal(rebuilt.eval()(idx), model(idx))


def test_softcap_with_sdpa_is_refused():
    with pytest.raises(vl.SpecError, match="cannot soft-cap"):
        from_transformers(hf_model(*CASES["gemma2"]), REG, impl="sdpa")
