"""from_transformers: a converted tiny random (perturbed) HF model gives HF's logits."""

import pytest
import torch
from conftest import n_params, perturbed

transformers = pytest.importorskip("transformers")

import variantlab as vl  # noqa: E402
from variantlab import from_transformers  # noqa: E402
from variantlab.hf import ConversionError  # noqa: E402

REG = vl.get_registry()

BASE = dict(hidden_size=32, num_attention_heads=4, intermediate_size=48, num_hidden_layers=2,
            vocab_size=64, max_position_embeddings=32)
LLAMA = {
    "gqa-untied": dict(num_key_value_heads=2, rope_theta=500000.0, tie_word_embeddings=False),
    "mha-tied": dict(num_key_value_heads=4, tie_word_embeddings=True, rms_norm_eps=1e-5),
    "mqa-headdim": dict(num_key_value_heads=1, head_dim=16, tie_word_embeddings=False),
}


@pytest.mark.parametrize("impl", ["naive", "sdpa"])
@pytest.mark.parametrize("name", list(LLAMA))
def test_llama_logits_equal(name, impl):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**BASE, **LLAMA[name], attn_implementation="eager")
    hf = perturbed(transformers.LlamaForCausalLM(config))
    spec, model = from_transformers(hf, REG, impl=impl)
    model.eval()
    assert spec.attention.impl == impl
    assert n_params(model) == n_params(hf)
    idx = torch.randint(0, 64, (2, 10))
    with torch.no_grad():
        ref = hf(idx).logits
        ours = model(idx)
    assert ours.shape == ref.shape
    assert (ours - ref).abs().max().item() < 1e-4


def test_unsupported_class_and_options_are_named():
    with pytest.raises(ConversionError, match="GPT2Model"):
        from_transformers(transformers.GPT2Model(transformers.GPT2Config(
            n_embd=32, n_layer=1, n_head=4, vocab_size=64)), REG)
    cfg = transformers.LlamaConfig(**BASE, hidden_act="gelu_fast")
    with pytest.raises(ConversionError, match="hidden_act='gelu_fast'"):
        from_transformers(transformers.LlamaForCausalLM(cfg), REG)
    cfg = transformers.LlamaConfig(**BASE, rope_parameters={"rope_type": "proportional",
                                                            "rope_theta": 1e4})
    with pytest.raises(ConversionError, match="rope_type 'proportional' is not supported"):
        from_transformers(transformers.LlamaForCausalLM(cfg), REG)


QWEN3 = {
    "gqa-headdim-untied": dict(num_key_value_heads=2, head_dim=16, tie_word_embeddings=False),
    "mha-tied": dict(num_key_value_heads=4, tie_word_embeddings=True, rms_norm_eps=1e-5),
}


@pytest.mark.parametrize("impl", ["naive", "sdpa"])
@pytest.mark.parametrize("name", list(QWEN3))
def test_qwen3_logits_equal(name, impl):
    torch.manual_seed(0)
    config = transformers.Qwen3Config(**BASE, **QWEN3[name], attn_implementation="eager")
    hf = perturbed(transformers.Qwen3ForCausalLM(config))
    spec, model = from_transformers(hf, REG, impl=impl)
    model.eval()
    assert n_params(model) == n_params(hf)
    idx = torch.randint(0, 64, (2, 10))
    with torch.no_grad():
        assert (model(idx) - hf(idx).logits).abs().max().item() < 1e-4


@pytest.mark.parametrize("impl", ["naive", "sdpa"])
def test_llama_left_padded_mask(impl):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**BASE, **LLAMA["gqa-untied"], attn_implementation="eager")
    hf = perturbed(transformers.LlamaForCausalLM(config))
    _, model = from_transformers(hf, REG, impl=impl)
    model.eval()
    idx = torch.randint(0, 64, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[0, :3] = 0
    with torch.no_grad():
        ref = hf(idx, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
        ours = model(idx, attention_mask=mask)
    real = mask.bool()
    assert (ours[real] - ref[real]).abs().max().item() < 1e-4


def test_spec_yaml_round_trips_to_an_equal_spec():
    import yaml

    import variantlab as vl

    config = transformers.Qwen3Config(**BASE, **QWEN3["gqa-headdim-untied"])
    spec, _ = from_transformers(transformers.Qwen3ForCausalLM(config), REG, impl="sdpa")
    doc = yaml.safe_load(vl.spec_yaml(spec))
    back = vl.parse_model_spec(doc["model"], REG)
    assert back == spec
    assert back.attention.qk_norm.eps == config.rms_norm_eps
    assert back.attention.head_dim == 16 and back.attention.n_kv_heads == 2


def test_describe_yaml_prints_a_spec_that_loads_back(tmp_path):
    import yaml
    from click.testing import CliRunner

    import variantlab as vl
    from variantlab.cli.main import main

    config = transformers.LlamaConfig(**BASE, **LLAMA["mqa-headdim"])
    spec, _ = from_transformers(transformers.LlamaForCausalLM(config), REG)
    path = tmp_path / "llama.yaml"
    path.write_text(vl.spec_yaml(spec))
    result = CliRunner().invoke(main, ["describe", "--yaml", str(path)])
    assert result.exit_code == 0, result.output
    docs = [d for d in yaml.safe_load_all(result.output) if d]
    assert len(docs) == 1
    assert vl.parse_model_spec(docs[0]["model"], REG) == spec


# -- every class: several configs each, perturbed, logits equal in both implementations ------
NEOX_BASE = dict(BASE, max_position_embeddings=32)
GPT2_BASE = dict(n_embd=32, n_head=4, n_layer=2, vocab_size=64, n_positions=32,
                 bos_token_id=0, eos_token_id=0)
CASES = {
    "gpt2-tied": ("GPT2", dict(GPT2_BASE)),
    "gpt2-untied-relu-inner": ("GPT2", dict(GPT2_BASE, tie_word_embeddings=False,
                                            activation_function="relu", n_inner=48)),
    "gpt2-exact-gelu-wide": ("GPT2", dict(GPT2_BASE, n_embd=64, n_head=2,
                                          activation_function="gelu", layer_norm_epsilon=1e-3)),
    "neox-parallel-partial": ("GPTNeoX", dict(NEOX_BASE, rotary_pct=0.25,
                                              use_parallel_residual=True)),
    "neox-sequential-nobias-tied": ("GPTNeoX", dict(
        NEOX_BASE, use_parallel_residual=False, attention_bias=False,
        tie_word_embeddings=True, rotary_pct=0.5, rotary_emb_base=500.0)),
    "neox-odd-rotary-head12": ("GPTNeoX", dict(NEOX_BASE, hidden_size=48, rotary_pct=0.25,
                                               use_parallel_residual=True)),
    "neox-odd-rotary-sequential": ("GPTNeoX", dict(NEOX_BASE, rotary_pct=0.375,
                                                   use_parallel_residual=False)),
    "neox-full-rotary-params": ("GPTNeoX", dict(NEOX_BASE, hidden_act="gelu_new", rope_parameters={
        "rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 1.0})),
    "llama-biases-gelu-tanh": ("Llama", dict(BASE, num_key_value_heads=2, attention_bias=True,
                                             mlp_bias=True, hidden_act="gelu_pytorch_tanh",
                                             tie_word_embeddings=False)),
    "llama-attention-bias-relu2": ("Llama", dict(BASE, num_key_value_heads=1,
                                                 attention_bias=True, hidden_act="relu2")),
    "qwen3-gqa-headdim-bias": ("Qwen3", dict(BASE, num_key_value_heads=2, head_dim=16,
                                             attention_bias=True, tie_word_embeddings=False)),
    "olmo2-gqa-untied-bias": ("Olmo2", dict(BASE, num_key_value_heads=2, attention_bias=True,
                                            tie_word_embeddings=False, rope_theta=500.0)),
    "olmo2-mha-tied": ("Olmo2", dict(BASE, num_key_value_heads=4, tie_word_embeddings=True)),
    "olmo2-mqa-headdim": ("Olmo2", dict(BASE, num_key_value_heads=1, head_dim=16,
                                        tie_word_embeddings=False)),
}


def hf_model(family, kwargs):
    torch.manual_seed(0)
    config = getattr(transformers, f"{family}Config")(**kwargs, attn_implementation="eager")
    head = "LMHeadModel" if family == "GPT2" else "ForCausalLM"
    return perturbed(getattr(transformers, f"{family}{head}")(config))


@pytest.mark.parametrize("impl", ["naive", "sdpa"])
@pytest.mark.parametrize("case", list(CASES))
def test_every_class_logits_equal(case, impl):
    hf = hf_model(*CASES[case])
    spec, model = from_transformers(hf, REG, impl=impl)
    model.eval()
    assert spec.attention.impl == impl
    assert n_params(model) == n_params(hf)
    assert spec.tie_weights == bool(hf.config.tie_word_embeddings)
    idx = torch.randint(0, 64, (2, 10))
    with torch.no_grad():
        ref, ours = hf(idx).logits, model(idx)
    assert ours.shape == ref.shape
    assert (ours - ref).abs().max().item() < 1e-4


@pytest.mark.parametrize("impl", ["naive", "sdpa"])
@pytest.mark.parametrize("case", ["gpt2-untied-relu-inner", "neox-parallel-partial",
                                  "neox-sequential-nobias-tied", "neox-odd-rotary-head12",
                                  "olmo2-gqa-untied-bias",
                                  "llama-biases-gelu-tanh", "qwen3-gqa-headdim-bias"])
def test_every_class_left_padded_mask(case, impl):
    hf = hf_model(*CASES[case])
    _, model = from_transformers(hf, REG, impl=impl)
    model.eval()
    idx = torch.randint(0, 64, (3, 9))
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[0, :4] = 0
    mask[2, :1] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ref = hf(idx, attention_mask=mask, position_ids=positions).logits
        ours = model(idx, attention_mask=mask)
    real = mask.bool()
    assert (ours[real] - ref[real]).abs().max().item() < 1e-4


def test_mapped_options_reach_the_spec():
    spec, _ = from_transformers(hf_model(*CASES["neox-parallel-partial"]), REG)
    assert spec.residual.kind == "parallel" and spec.residual.shared_norm is False
    assert spec.positional.fraction == 0.25 and spec.norm.kind == "layer"
    spec, _ = from_transformers(hf_model(*CASES["neox-sequential-nobias-tied"]), REG)
    assert spec.residual.kind == "pre_norm" and spec.positional.theta == 500.0
    assert not spec.qkv_bias and not spec.attn_out_bias
    spec, _ = from_transformers(hf_model(*CASES["olmo2-gqa-untied-bias"]), REG)
    assert spec.residual.kind == "post_sublayer"
    assert spec.attention.qk_norm_scope == "projection" and spec.attention.n_kv_heads == 2
    spec, _ = from_transformers(hf_model(*CASES["llama-biases-gelu-tanh"]), REG)
    assert spec.feedforward.bias and spec.qkv_bias and spec.attn_out_bias
    assert spec.activation.kind == "gelu" and spec.activation.approximate == "tanh"
    spec, _ = from_transformers(hf_model("GPT2", dict(GPT2_BASE, embd_pdrop=0.2, attn_pdrop=0.3,
                                                      resid_pdrop=0.4)), REG)
    assert (spec.drop("emb"), spec.drop("attn"), spec.drop("resid")) == (0.2, 0.3, 0.4)
    assert spec.positional.kind == "learned" and spec.feedforward.hidden_dim == 128


def test_odd_rotary_count_rounds_up_as_transformers_does():
    """head_dim 12, rotary_pct 0.25: int(3.0) = 3 dims; HF's inv_freq has 2 frequencies
    theta^(-2i/3) over 4 dims. Rounding down (2 dims) gives other logits."""
    hf = hf_model(*CASES["neox-odd-rotary-head12"])
    spec, model = from_transformers(hf, REG)
    assert spec.positional.fraction == 0.25 and spec.positional.odd_rounding == "up"
    assert hf.gpt_neox.rotary_emb.inv_freq.numel() == 2
    down = vl.parse_model_spec({**spec.to_data(), "positional": {
        **spec.positional.model_dump(), "odd_rounding": "down"}}, REG)
    other = vl.build_model(down, REG)
    other.load_state_dict(model.state_dict())
    idx = torch.randint(0, 64, (2, 10))
    with torch.no_grad():
        ref = hf(idx).logits
        assert (model.eval()(idx) - ref).abs().max().item() < 1e-4
        assert (other.eval()(idx) - ref).abs().max().item() > 1e-2


@pytest.mark.parametrize("family, kwargs, match", [
    ("GPTNeoX", dict(NEOX_BASE, rope_scaling={"rope_type": "proportional", "factor": 2.0}),
     "rope_scaling.*'proportional'"),
    ("GPTNeoX", dict(NEOX_BASE, hidden_act="quick_gelu"), "hidden_act='quick_gelu'"),
    ("GPT2", dict(GPT2_BASE, scale_attn_by_inverse_layer_idx=True),
     "scale_attn_by_inverse_layer_idx=True"),
    ("GPT2", dict(GPT2_BASE, scale_attn_weights=False), "scale_attn_weights=False"),
    ("GPT2", dict(GPT2_BASE, add_cross_attention=True), "add_cross_attention=True"),
    ("GPT2", dict(GPT2_BASE, activation_function="gelu_fast"),
     "activation_function='gelu_fast'"),
    ("Llama", dict(BASE, rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                          "partial_rotary_factor": 0.5}),
     "partial_rotary_factor=0.5"),
    ("Olmo2", dict(BASE, rope_scaling={"rope_type": "linear", "factor": 2.0, "beta_fast": 3.0}),
     "rope_scaling.*'linear' with beta_fast: variantlab reads only factor"),
])
def test_unsupported_options_name_option_and_value(family, kwargs, match):
    config = getattr(transformers, f"{family}Config")(**kwargs)
    head = "LMHeadModel" if family == "GPT2" else "ForCausalLM"
    model = getattr(transformers, f"{family}{head}")(config)
    with pytest.raises(ConversionError, match=match):
        from_transformers(model, REG)


@pytest.mark.parametrize("case", ["gpt2-untied-relu-inner", "neox-parallel-partial",
                                  "olmo2-gqa-untied-bias", "llama-biases-gelu-tanh"])
def test_spec_yaml_round_trips_for_every_class(case):
    import yaml

    import variantlab as vl

    spec, model = from_transformers(hf_model(*CASES[case]), REG)
    back = vl.parse_model_spec(yaml.safe_load(vl.spec_yaml(spec))["model"], REG)
    assert back == spec
    assert n_params(vl.build_model(back, REG)) == n_params(model)


def test_rotary_settings_from_older_config_attributes():
    from types import SimpleNamespace

    from variantlab.hf.common import rotary

    neox4 = SimpleNamespace(rope_scaling=None, rotary_emb_base=500.0, rotary_pct=0.25)
    assert rotary(neox4, partial=True, head_dim=8) == {
        "kind": "rotary", "theta": 500.0, "fraction": 0.25}
    llama31 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    old = SimpleNamespace(rope_scaling=llama31, rope_theta=5e5, max_position_embeddings=131072)
    assert rotary(old, partial=False, head_dim=8) == {
        "kind": "rotary", "theta": 5e5, "fraction": 1.0, "scaling": "llama3", "factor": 8.0,
        "original_context": 8192, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    old = SimpleNamespace(rope_scaling={"rope_type": "llama3", "factor": 8.0}, rope_theta=5e5)
    with pytest.raises(ConversionError, match="rope_scaling.*'llama3' needs low_freq_factor"):
        rotary(old, partial=False, head_dim=8)
