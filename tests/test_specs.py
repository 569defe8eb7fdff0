"""Bad specs are refused before anything is built, with the key path and the options."""

import warnings

import pytest
import torch
from conftest import TINY

import variantlab as vl
from variantlab.errors import SpecError
from variantlab.model.build import Parts, make_model

REG = vl.get_registry()


def refuse(spec: dict) -> SpecError:
    """build_model must raise SpecError and consume no randomness (nothing was built)."""
    state = torch.get_rng_state()
    with pytest.raises(SpecError) as info:
        vl.build_model(spec, REG)
    assert torch.equal(state, torch.get_rng_state()), "a module was built before the error"
    return info.value


def test_unknown_kind_suggests_and_lists(tiny):
    err = refuse({**tiny, "norm": {"kind": "layr"}})
    (issue,) = err.issues
    assert issue.loc == ("norm", "kind")
    assert "did you mean 'layer'" in issue.message
    assert "batch" in issue.message and "rms" in issue.message
    assert str(err).startswith("norm.kind: unknown norm 'layr'")


def test_negative_eps_names_its_path(tiny):
    err = refuse({**tiny, "norm": {"kind": "layer", "eps": -1e-5}})
    (issue,) = err.issues
    assert issue.loc == ("norm", "eps")
    assert "greater than 0" in issue.message


def test_unknown_key_suggests_the_field(tiny):
    spec = {**tiny, "n_head": 4}
    err = refuse(spec)
    (issue,) = err.issues
    assert issue.loc == ("n_head",)
    assert "did you mean 'n_heads'" in issue.message


def test_unknown_component_key(tiny):
    err = refuse({**tiny, "attention": {"kind": "mha", "implementation": "sdpa"}})
    assert err.issues[0].loc == ("attention", "implementation")


def test_bad_impl_lists_the_options(tiny):
    err = refuse({**tiny, "attention": {"kind": "mha", "impl": "flash"}})
    assert err.issues[0].loc == ("attention", "impl")
    assert "'naive' or 'sdpa'" in err.issues[0].message


def test_heads_must_divide_emb_dim(tiny):
    err = refuse({**tiny, "emb_dim": 30, "n_heads": 4})
    (issue,) = err.issues
    assert issue.loc == ("n_heads",)
    assert "does not divide emb_dim=30" in issue.message
    assert issue.message.endswith("choose one of [1, 2, 3, 5, 6, 10, 15, 30] or change emb_dim")
    # the choices stop at 64 heads
    (wide,) = refuse({**tiny, "emb_dim": 128, "n_heads": 3}).issues
    assert "choose one of [1, 2, 4, 8, 16, 32, 64] or change" in wide.message
    (past,) = refuse({**tiny, "emb_dim": 130, "n_heads": 3}).issues  # 65 divides 130: left out
    assert past.message.endswith("choose one of [1, 2, 5, 10, 13, 26] or change emb_dim")


@pytest.mark.parametrize("key", ["emb_dim", "n_layers", "vocab_size", "context_length"])
def test_sizes_must_be_positive(tiny, key):
    err = refuse({**tiny, key: 0})
    assert err.issues[0].loc == (key,)


def test_all_issues_reported_at_once(tiny):
    err = refuse({**tiny, "norm": {"kind": "layr"}, "activation": {"kind": "gelu", "approximate": "x"},
                  "n_head": 2})
    assert {i.loc for i in err.issues} == {("norm", "kind"), ("activation", "approximate"), ("n_head",)}


def test_unknown_family():
    err = refuse({"family": "gtp"})
    assert err.issues[0].loc == ("family",)
    assert "did you mean 'gpt'" in err.issues[0].message


def test_component_shorthand_and_defaults(tiny):
    spec = vl.parse_model_spec({**tiny, "norm": "rms"}, REG)
    assert spec.norm.kind == "rms" and spec.norm.eps == 1e-5
    assert spec.activation.kind == "gelu" and spec.activation.approximate == "tanh"
    assert spec.attention.impl == "naive" and spec.residual.shortcut is True


def test_spec_round_trips_through_plain_data(tiny):
    spec = vl.parse_model_spec({**tiny, "family": "mlp", "layer_sizes": [4, 4, 2],
                                "feedforward": {"kind": "glu", "hidden_dim": 48}}, REG)
    data = spec.to_data()
    assert data["feedforward"] == {"kind": "glu", "hidden_mult": 8 / 3, "hidden_dim": 48,
                                   "bias": False}
    again = vl.parse_model_spec(data, REG)
    assert again == spec and type(again) is type(spec)


def test_model_spec_class_accepts_mappings_given_a_registry(tiny):
    data = {**tiny, "norm": {"kind": "rms"}}
    with pytest.raises(TypeError, match=r"needs a registry: use variantlab.parse_model_spec"):
        vl.ModelSpec(**data)  # no global registry to fall back on
    spec = vl.ModelSpec.model_validate(data, context={"registry": REG})
    assert spec.norm.kind == "rms"
    model = vl.build_model(spec, REG)
    assert sum(p.numel() for p in model.parameters()) > 0


def test_batchnorm_in_causal_model_warns_and_runs(tiny):
    with pytest.warns(vl.VariantWarning, match="future"):
        model = vl.build_model({**tiny, "norm": {"kind": "batch"}}, REG)
    assert any("pool over future positions" in w for w in model.variantlab_warnings)
    assert model.variantlab_spec.warnings() == model.variantlab_warnings
    idx = torch.randint(0, 64, (4, 8))
    model.train()
    logits = model(idx)
    assert logits.shape == (4, 8, 64) and torch.isfinite(logits).all()
    model.eval()
    assert torch.isfinite(model(idx)).all()


def test_batchnorm_leaks_the_future_in_training(tiny):
    """The warning is true: in train mode a token's output depends on later tokens."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", vl.VariantWarning)
        model = vl.build_model({**tiny, "norm": {"kind": "batch"}}, REG).train()
    idx = torch.randint(0, 64, (2, 8))
    changed = idx.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 64
    assert not torch.allclose(model(idx)[:, 0], model(changed)[:, 0])
    ln = vl.build_model(tiny, REG).train()
    torch.testing.assert_close(ln(idx)[:, 0], ln(changed)[:, 0])


def test_no_warning_for_batchnorm_in_encoder(tiny):
    with warnings.catch_warnings():
        warnings.simplefilter("error", vl.VariantWarning)
        model = vl.build_model({**tiny, "family": "encoder", "norm": {"kind": "batch"}}, REG)
    assert model.variantlab_warnings == []


def test_only_the_block_scope_wraps_a_whole_block(tiny):
    from variantlab.model.build import block_scope

    def scoped(name):
        return type("S", (), {} if name is None else {"scope": name})()

    assert block_scope(scoped("block")) is True
    assert [block_scope(scoped(s)) for s in (None, "sublayer", "attention", "b")] == [False] * 4
    # a per-sublayer residual asked of a model whose residual wraps a whole block, and back
    parts = Parts(vl.parse_model_spec({**tiny, "residual": "parallel"}, REG), REG)
    with pytest.raises(ValueError, match="residual 'parallel' wraps a whole block"):
        parts.residual(torch.nn.Identity())
    plain = Parts(vl.parse_model_spec(tiny, REG), REG)
    with pytest.raises(ValueError, match="build it with Parts.block"):
        plain.residual(torch.nn.Identity(), spec=parts.spec.residual)
    assert plain.residual(torch.nn.Identity(), spec=plain.spec.residual) is not None


def test_a_family_spec_is_built_as_given_and_a_base_spec_as_its_familys(tiny):
    spec = vl.parse_model_spec(tiny, REG)
    assert vl.build_model(spec, REG).variantlab_spec is spec  # no copy made
    base = vl.ModelSpec.model_validate(tiny, context={"registry": REG})
    built = vl.build_model(base, REG).variantlab_spec
    assert type(base) is vl.ModelSpec and type(built).__name__ == "GPTSpec" and built == spec


def test_a_variant_warning_points_at_the_caller_of_build_model(tiny):
    with pytest.warns(vl.VariantWarning) as record:
        vl.build_model({**tiny, "norm": {"kind": "batch"}}, REG)
    assert [w.filename for w in record] == [__file__]


def test_make_model_seeds_then_builds_on_the_device():
    spec = vl.parse_model_spec(TINY, REG)
    a, b = make_model(spec, 3, REG), make_model(spec, 3, REG)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert next(a.parameters()).device.type == "cpu"
    other = make_model(spec, 4, REG)
    assert not torch.equal(next(a.parameters()), next(other.parameters()))
    meta = make_model(spec, 3, REG, device=torch.device("meta"))
    assert {p.device.type for p in meta.parameters()} == {"meta"}


def test_the_defaults_are_gpt2_124m():
    """{} alone is seed 004's GPT_CONFIG_124M with GPT-2's biases, norms and eps."""
    spec = vl.parse_model_spec({}, REG)
    assert (spec.vocab_size, spec.context_length, spec.emb_dim, spec.n_heads, spec.n_layers,
            spec.drop_rate, spec.qkv_bias) == (50257, 1024, 768, 12, 12, 0.1, False)
    assert (spec.tie_weights, spec.attn_out_bias, spec.ffn_bias, spec.norm_bias,
            spec.final_norm) == (False, True, True, True, True)
    assert spec.norm.kind == "layer" and spec.norm.eps == 1e-5


@pytest.mark.parametrize("key", ["drop_rate", "emb_drop_rate", "attn_drop_rate",
                                 "resid_drop_rate"])
def test_dropout_rates_lie_in_zero_to_one(tiny, key):
    for rate in (0.0, 0.999):
        assert getattr(vl.parse_model_spec({**tiny, key: rate}, REG), key) == rate
    for rate in (-0.1, 1.0):
        assert refuse({**tiny, key: rate}).issues[0].loc == (key,)


def test_specs_are_frozen_and_strict(tiny):
    from pydantic import ValidationError

    spec = vl.parse_model_spec(tiny, REG)
    with pytest.raises(ValidationError, match="frozen"):
        spec.emb_dim = 64
    with pytest.raises(ValidationError, match="frozen"):
        spec.norm.eps = 1e-6
    assert refuse({**tiny, "emb_dim": "32"}).issues[0].loc == ("emb_dim",)  # no coercion
    assert refuse({**tiny, "norm": {"kind": "layer", "eps": "1e-5"}}).issues[0].loc == (
        "norm", "eps")


def test_added_component_options_at_their_defaults_stay_out_of_the_data(tiny):
    data = vl.parse_model_spec({**tiny, "feedforward": {"kind": "moe", "n_experts": 4}},
                               REG).to_data()
    assert "n_group" not in data["feedforward"] and data["feedforward"]["n_experts"] == 4


def test_every_layout_issue_is_reported_with_its_location(tiny):
    def locs(layout):
        return [(i.loc, i.message) for i in refuse({**tiny, "layout": layout}).issues]

    assert [loc for loc, _ in locs("abc")] == [("layout",)]  # the schema's, no crash
    got = locs({"kinds": {"a": "relu", "b": 3, "c": {"atention": "mha", "inits": {},
                                                    "norm": {"kind": "layr"}}},
                "pattern": ["a", "x"]})
    assert [loc for loc, _ in got] == [
        ("layout", "kinds", "a"), ("layout", "kinds", "b"), ("layout", "kinds", "c", "atention"),
        ("layout", "kinds", "c", "inits"), ("layout", "kinds", "c", "norm", "kind"),
        ("layout", "pattern", 1)]
    assert got[0][1].startswith("expected a mapping of slot overrides")
    assert got[2][1].startswith("'atention' cannot vary per layer; did you mean 'attention'? ")
    assert "did you mean" not in got[3][1]
    # a pattern of the wrong type besides: still one SpecError, the component's issue in it
    assert ("layout", "kinds", "c", "norm", "kind") in [
        loc for loc, _ in locs({"kinds": {"c": {"norm": "layr"}}, "pattern": "c"})]


def test_the_default_registry_causality_and_a_layer_kinds_warnings(tiny):
    assert vl.parse_model_spec(tiny) == vl.parse_model_spec(tiny, REG)  # registry None
    assert vl.parse_model_spec(tiny, REG).causal is True
    layered = vl.parse_model_spec({**tiny, "layout": {"kinds": {"b": {"norm": "batch"}},
                                                      "pattern": ["b"]}}, REG)
    assert any("pool over future positions" in w for w in layered.warnings())


def test_a_causal_mixer_fills_only_a_causal_self_attention_slot(tiny):
    """linear_attention is causal only and its build takes no ``positions``: a GPT with an
    embedding positional takes it; rotary or ALiBi (acting inside attention) is refused once,
    at the positional; a bidirectional or cross-attending family refuses the mixer."""
    mixer = {**tiny, "attention": "linear_attention"}
    assert vl.parse_model_spec(mixer, REG).attention.kind == "linear_attention"
    assert vl.parse_model_spec({**mixer, "positional": "sinusoidal"}, REG).causal is True
    for positional in ("rotary", "alibi"):
        (issue,) = refuse({**mixer, "positional": positional}).issues
        assert issue.loc == ("positional", "kind")
        assert issue.message == (
            f"positional {positional!r} acts inside attention, but attention "
            "'linear_attention' (plugin 'variantlab_plugins.mixers') does not take `positions` "
            "in its build; use attention 'mha' or a positional that adds to the embeddings "
            "(learned, sinusoidal, none)")
    (enc,) = refuse({**mixer, "family": "encoder"}).issues
    assert enc.loc == ("attention", "kind")
    assert enc.message == ("attention 'linear_attention' is a causal sequence mixer; family "
                           "'encoder' runs it bidirectionally (not causal); use a causal "
                           "family (gpt), or attention mha")
    (dec,) = refuse({**mixer, "family": "decoder"}).issues
    assert dec.loc == ("attention", "kind")
    assert dec.message.startswith("attention 'linear_attention' is a causal sequence mixer; "
                                  "family 'decoder' also cross-attends to a memory")
