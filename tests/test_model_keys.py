"""Issue 9 model keys: per-place biases (nanoGPT bias=False exact at 124M), final_norm,
separate dropout rates, three-way embedding sharing; defaults build the same model as before."""

import types
from typing import Literal

import conftest
import pytest
import torch
from torch import nn

import variantlab as vl
from variantlab import SpecError
from variantlab.testing import check_component, component_problems

REGISTRY = vl.build_registry(entry_points=False)
TINY = {**conftest.TINY, "context_length": 16}
GPT2_124M = {"family": "gpt", "vocab_size": 50257, "context_length": 1024, "emb_dim": 768,
             "n_heads": 12, "n_layers": 12, "drop_rate": 0.0, "tie_weights": True}


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # shared tensors counted once


def build(data: dict, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return vl.build_model(data, REGISTRY)


def meta_build(data: dict) -> nn.Module:
    with torch.device("meta"):
        return vl.build_model(data, REGISTRY)


def test_nanogpt_bias_false_at_124m_is_exact():
    no_bias = {**GPT2_124M, "qkv_bias": False, "attn_out_bias": False, "ffn_bias": False,
               "norm_bias": False}
    assert n_params(meta_build(no_bias)) == 124_337_664
    # nanoGPT bias=True: every Linear and LayerNorm bias on
    assert n_params(meta_build({**GPT2_124M, "qkv_bias": True})) == 124_439_808


def test_llama_style_layers_have_no_bias_at_all():
    model = build({**TINY, "attn_out_bias": False, "norm": "rms", "feedforward": "glu",
                   "activation": "silu", "positional": "none"})
    assert not [n for n, _ in model.named_parameters() if n.endswith("bias") or "shift" in n]


def test_glu_bias_is_its_own_switch_and_off_by_default():
    glu = {**TINY, "feedforward": {"kind": "glu", "hidden_dim": 24}, "activation": "silu"}
    plain = {n for n, _ in build(glu).named_parameters()}
    assert not any(n.startswith("trf_blocks.0.ff.sublayer") and n.endswith("bias")
                   for n in plain)  # ffn_bias (default true) does not reach glu
    model = build({**glu, "feedforward": {"kind": "glu", "hidden_dim": 24, "bias": True}})
    added = {n for n, _ in model.named_parameters()} - plain
    assert added == {f"trf_blocks.{i}.ff.sublayer.{w}.bias" for i in range(2)
                     for w in ("W_gate", "W_up", "W_down")}
    ff = model.trf_blocks[0].ff.sublayer
    x = torch.randn(2, 3, 32)
    gate = x @ ff.W_gate.weight.T + ff.W_gate.bias
    up = x @ ff.W_up.weight.T + ff.W_up.bias
    expected = (gate * torch.sigmoid(gate) * up) @ ff.W_down.weight.T + ff.W_down.bias
    assert torch.allclose(ff(x), expected, atol=1e-6)
    assert n_params(model) - n_params(build(glu)) == 2 * (24 + 24 + 32)


@pytest.mark.parametrize(("key", "gone"), [
    ("attn_out_bias", ["att.sublayer.out_proj.bias"]),
    ("ffn_bias", ["ff.sublayer.layers.0.bias", "ff.sublayer.layers.2.bias"]),
    ("norm_bias", ["att.norm.shift", "ff.norm.shift"]),
])
def test_each_bias_switch_removes_exactly_its_place(key, gone):
    full = {n for n, _ in build(TINY).named_parameters()}
    less = {n for n, _ in build({**TINY, key: False}).named_parameters()}
    expected = {f"trf_blocks.{i}.{g}" for i in range(2) for g in gone}
    if key == "norm_bias":
        expected.add("final_norm.shift")
    assert full - less == expected and less <= full


@pytest.mark.parametrize("norm", ["rms", "batch", "none"])
def test_norms_without_a_bias_option_ignore_norm_bias(norm):
    data = {**TINY, "family": "encoder", "norm": norm}  # bidirectional: batch norm unwarned
    a = build(data)
    b = build({**data, "norm_bias": False})
    assert [n for n, _ in a.named_parameters()] == [n for n, _ in b.named_parameters()]


def test_old_norm_plugin_without_bias_kwarg_builds_with_norm_bias_off():
    reg = vl.build_registry(["tests/plugins_fixtures/local_norm.py"], entry_points=False)
    torch.manual_seed(0)
    model = vl.build_model({**TINY, "norm": "centre", "norm_bias": False, "ffn_bias": False},
                           reg)
    assert model(torch.randint(0, 64, (1, 4))).shape == (1, 4, 64)


def test_fused_layernorm_without_shift_equals_naive():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 32)
    naive = build({**TINY, "norm_bias": False}).final_norm
    fused = build({**TINY, "norm_bias": False, "norm": {"kind": "layer", "impl": "fused"}})
    with torch.no_grad():
        naive.scale.uniform_(0.5, 1.5)
        fused.final_norm.scale.copy_(naive.scale)
    assert torch.allclose(naive(x), fused.final_norm(x), atol=1e-6)


def test_final_norm_off():
    with_norm, without = build(TINY, seed=3), build({**TINY, "final_norm": False}, seed=3)
    assert n_params(with_norm) - n_params(without) == 2 * 32
    assert isinstance(without.final_norm, nn.Identity)
    idx = torch.randint(0, 64, (2, 5))
    with torch.no_grad():
        h = with_norm.trf_blocks(with_norm.embed(idx))
        assert torch.allclose(without(idx), with_norm.out_head(h), atol=1e-6)
    enc = build({**TINY, "family": "encoder_decoder", "final_norm": False})
    assert isinstance(enc.encoder.norm, nn.Identity) and isinstance(enc.decoder.norm, nn.Identity)


def dropout_rates(model: nn.Module) -> tuple[float, float, float]:
    block = model.trf_blocks[0]
    return model.embed.drop_emb.p, block.att.sublayer.dropout.p, block.ff.drop_shortcut.p


def test_one_drop_rate_sets_all_three_places():
    assert dropout_rates(build({**TINY, "drop_rate": 0.1})) == (0.1, 0.1, 0.1)


def test_separate_dropout_rates():
    model = build({**TINY, "drop_rate": 0.1, "emb_drop_rate": 0.2, "attn_drop_rate": 0.0,
                   "resid_drop_rate": 0.4})
    assert dropout_rates(model) == (0.2, 0.0, 0.4)
    assert model.trf_blocks[1].att.drop_shortcut.p == 0.4
    spec = vl.parse_model_spec({**TINY, "drop_rate": 0.3, "attn_drop_rate": 0.05}, REGISTRY)
    assert (spec.drop("emb"), spec.drop("attn"), spec.drop("resid")) == (0.3, 0.05, 0.3)
    with pytest.raises(SpecError, match="resid_drop_rate"):
        vl.parse_model_spec({**TINY, "resid_drop_rate": 1.5}, REGISTRY)


def test_three_way_embedding_sharing():
    base = {**TINY, "family": "encoder_decoder"}
    shared = build({**base, "share_embeddings": True})
    weight = shared.encoder.embed.tok_emb.weight
    assert shared.decoder.embed.tok_emb.weight is weight and shared.out_head.weight is weight
    assert n_params(build({**base, "tie_weights": True})) - n_params(shared) == 64 * 32
    spec = vl.parse_model_spec(base, REGISTRY)
    batch = vl.task_for(spec, REGISTRY).batch(spec, 2, 6)
    loss = torch.nn.functional.cross_entropy(
        shared(**batch.inputs).flatten(0, 1), batch.target.flatten())
    loss.backward()
    assert weight.grad is not None and torch.isfinite(weight.grad).all()
    with pytest.raises(SpecError, match="share_embeddings"):
        vl.parse_model_spec({**TINY, "share_embeddings": True}, REGISTRY)  # gpt: no such key


def test_defaults_build_the_same_model_as_before():
    """The new keys at their defaults change neither parameter names nor values nor outputs."""
    explicit = {**TINY, "attn_out_bias": True, "ffn_bias": True, "norm_bias": True,
                "final_norm": True, "emb_drop_rate": None, "attn_drop_rate": None,
                "resid_drop_rate": None}
    a, b = build(TINY, seed=7), build(explicit, seed=7)
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)
    names = [n for n, _ in a.named_parameters()]
    assert names[:4] == ["embed.tok_emb.weight", "embed.pos_emb.pos_emb.weight",
                         "trf_blocks.0.att.norm.scale", "trf_blocks.0.att.norm.shift"]
    assert "trf_blocks.0.att.sublayer.out_proj.bias" in names and names[-1] == "out_head.weight"


@pytest.mark.parametrize(("family", "keys"), [
    ("gpt", {"qkv_bias": False, "attn_out_bias": False, "ffn_bias": False, "norm_bias": False,
             "final_norm": False, "emb_drop_rate": 0.1, "attn_drop_rate": 0.2,
             "resid_drop_rate": 0.3}),
    ("encoder_decoder", {"share_embeddings": True, "norm_bias": False, "final_norm": False}),
])
def test_new_model_keys_pass_the_conformance_kit(family, keys):
    check_component("family", {"family": family, **keys}, registry=REGISTRY)


class IgnoresBiasSpec(vl.ComponentSpec):
    kind: Literal["ignores_bias"] = "ignores_bias"


def test_kit_flags_a_build_that_takes_bias_but_keeps_its_shift():
    plugin = types.ModuleType("ignores_bias_plugin")

    @vl.hookimpl
    def register_norms(register):
        def build(spec, dim, bias=True):  # says it takes bias, keeps the shift anyway
            return nn.LayerNorm(dim)

        register("ignores_bias", IgnoresBiasSpec, build)

    plugin.register_norms = register_norms
    reg = vl.build_registry(entry_points=False)
    reg.load_module(plugin, "ignores_bias_plugin", "module")
    problems = component_problems("norm", "ignores_bias", registry=reg, families=["gpt"])
    assert problems == ["norm (standalone): bias=False: bias=False kept all parameters "
                        "(64 vs 64 with bias=True)"]
    assert component_problems("norm", "layer", registry=REGISTRY, families=["gpt"]) == []
    assert component_problems("feedforward", "mlp", registry=REGISTRY, families=["gpt"]) == []
