"""from_transformers: a converted tiny random (perturbed) HF model gives HF's logits."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from variantlab import from_transformers  # noqa: E402
from variantlab.hfimport import ConversionError  # noqa: E402

BASE = dict(hidden_size=32, num_attention_heads=4, intermediate_size=48, num_hidden_layers=2,
            vocab_size=64, max_position_embeddings=32)
LLAMA = {
    "gqa-untied": dict(num_key_value_heads=2, rope_theta=500000.0, tie_word_embeddings=False),
    "mha-tied": dict(num_key_value_heads=4, tie_word_embeddings=True, rms_norm_eps=1e-5),
    "mqa-headdim": dict(num_key_value_heads=1, head_dim=16, tie_word_embeddings=False),
}


def perturbed(model):
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return model.eval()


def n_params(model):
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


@pytest.mark.parametrize("impl", ["naive", "sdpa"])
@pytest.mark.parametrize("name", list(LLAMA))
def test_llama_logits_equal(name, impl):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**BASE, **LLAMA[name], attn_implementation="eager")
    hf = perturbed(transformers.LlamaForCausalLM(config))
    spec, model = from_transformers(hf, impl=impl)
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
            n_embd=32, n_layer=1, n_head=4, vocab_size=64)))
    cfg = transformers.LlamaConfig(**BASE, hidden_act="gelu")
    with pytest.raises(ConversionError, match="hidden_act='gelu'"):
        from_transformers(transformers.LlamaForCausalLM(cfg))
    cfg = transformers.LlamaConfig(**BASE, rope_scaling={"rope_type": "linear", "factor": 2.0})
    with pytest.raises(ConversionError, match="rope_scaling"):
        from_transformers(transformers.LlamaForCausalLM(cfg))


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
    spec, model = from_transformers(hf, impl=impl)
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
    _, model = from_transformers(hf, impl=impl)
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
    spec, _ = from_transformers(transformers.Qwen3ForCausalLM(config), impl="sdpa")
    doc = yaml.safe_load(vl.spec_yaml(spec))
    back = vl.parse_model_spec(doc["model"])
    assert back == spec
    assert back.attention.qk_norm.eps == config.rms_norm_eps
    assert back.attention.head_dim == 16 and back.attention.n_kv_heads == 2


def test_describe_yaml_prints_a_spec_that_loads_back(tmp_path):
    import yaml
    from click.testing import CliRunner

    import variantlab as vl
    from variantlab.cli import main

    config = transformers.LlamaConfig(**BASE, **LLAMA["mqa-headdim"])
    spec, _ = from_transformers(transformers.LlamaForCausalLM(config))
    path = tmp_path / "llama.yaml"
    path.write_text(vl.spec_yaml(spec))
    result = CliRunner().invoke(main, ["describe", "--yaml", str(path)])
    assert result.exit_code == 0, result.output
    docs = [d for d in yaml.safe_load_all(result.output) if d]
    assert len(docs) == 1
    assert vl.parse_model_spec(docs[0]["model"]) == spec
