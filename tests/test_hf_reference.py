"""Issue 9: rotary, grouped-query attention and QK-norm against a reference nobody here
wrote: the attention layers of Hugging Face transformers (Llama, Qwen3, OLMo2, GPT-NeoX),
tiny and random, with the same weights, causal, left-padded, float32."""

import pytest
import torch

import variantlab as vl
from variantlab.model.positions import position_ids_from_mask
from variantlab_plugins.rotary import RotaryPositions

transformers = pytest.importorskip("transformers")

from transformers.models.gpt_neox import modeling_gpt_neox as neox  # noqa: E402
from transformers.models.llama import modeling_llama as llama  # noqa: E402
from transformers.models.olmo2 import modeling_olmo2 as olmo2  # noqa: E402
from transformers.models.qwen3 import modeling_qwen3 as qwen3  # noqa: E402

D, H = 32, 4
BASE = dict(hidden_size=D, num_attention_heads=H, intermediate_size=64, num_hidden_layers=1,
            vocab_size=64, attn_implementation="eager")
CASES = {  # name: (config, attention class, rotary class, our mha options, theta, fraction)
    "llama-gqa": (transformers.LlamaConfig(**BASE, num_key_value_heads=2, rope_theta=500000.0),
                  llama.LlamaAttention, llama.LlamaRotaryEmbedding, {"n_kv_heads": 2},
                  500000.0, 1.0),
    "llama-mqa-bias": (transformers.LlamaConfig(**BASE, num_key_value_heads=1, attention_bias=True),
                       llama.LlamaAttention, llama.LlamaRotaryEmbedding, {"n_kv_heads": 1},
                       10000.0, 1.0),
    "qwen3-head-qknorm": (
        transformers.Qwen3Config(**BASE, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6),
        qwen3.Qwen3Attention, qwen3.Qwen3RotaryEmbedding,
        {"n_kv_heads": 2, "head_dim": 16, "qk_norm": {"kind": "rms", "eps": 1e-6}}, 10000.0, 1.0),
    "olmo2-projection-qknorm": (
        transformers.Olmo2Config(**BASE, num_key_value_heads=4, rms_norm_eps=1e-6),
        olmo2.Olmo2Attention, olmo2.Olmo2RotaryEmbedding,
        {"qk_norm": {"kind": "rms", "eps": 1e-6}, "qk_norm_scope": "projection"}, 10000.0, 1.0),
    "neox-partial": (transformers.GPTNeoXConfig(**BASE, rotary_pct=0.25, rotary_emb_base=500),
                     neox.GPTNeoXAttention, neox.GPTNeoXRotaryEmbedding, {}, 500.0, 0.25),
}


def copy_weights(ours, ref, name):
    """Hugging Face projection weights into variantlab's layout (same tensors, renamed)."""
    with torch.no_grad():
        if name.startswith("neox"):  # fused qkv laid out per head: (H, [q, k, v], hd, D)
            w = ref.query_key_value.weight.view(H, 3, D // H, D)
            b = ref.query_key_value.bias.view(H, 3, D // H)
            for i, lin in enumerate((ours.W_query, ours.W_key, ours.W_value)):
                lin.weight.copy_(w[:, i].reshape(D, D))
                lin.bias.copy_(b[:, i].reshape(D))
            ours.out_proj.load_state_dict(ref.dense.state_dict())
            return
        for mine, theirs in ((ours.W_query, ref.q_proj), (ours.W_key, ref.k_proj),
                             (ours.W_value, ref.v_proj), (ours.out_proj, ref.o_proj)):
            mine.load_state_dict(theirs.state_dict())
        if ours.q_norm is not None:
            ours.q_norm.scale.copy_(ref.q_norm.weight)
            ours.k_norm.scale.copy_(ref.k_norm.weight)


@pytest.mark.parametrize("impl", ["naive", "sdpa"])
@pytest.mark.parametrize("name", list(CASES))
def test_attention_equals_transformers(name, impl):
    config, att_cls, rope_cls, options, theta, fraction = CASES[name]
    torch.manual_seed(0)
    ref = att_cls(config, layer_idx=0).eval()
    for p in ref.parameters():  # random norm scales and biases, not their 1 / 0 inits
        torch.nn.init.normal_(p, std=0.3)
    bias = getattr(config, "attention_bias", False) or name.startswith("neox")
    registry = vl.get_registry()
    comp = registry.get("attention", "mha")
    spec = comp.spec_cls.model_validate({**options, "impl": impl}, context={"registry": registry})
    ours = comp.build(spec, emb_dim=D, n_heads=H, context_length=16, drop_rate=0.0,
                      qkv_bias=bias, causal=True, positions=RotaryPositions(theta, fraction),
                      out_bias=bias,
                      make_norm=lambda dim, s: registry.get("norm", s.kind).build(s, dim=dim)).eval()
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in ref.parameters())
    copy_weights(ours, ref, name)

    x = torch.randn(2, 6, D)
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[0, :2] = 0  # row 0 left-padded by two
    position_ids = position_ids_from_mask(mask)  # what HF generate passes for left padding
    blocked = torch.ones(6, 6).triu(1).bool() | (mask[:, None, None, :] == 0)  # (B, 1, T, S)
    additive = torch.zeros(blocked.shape).masked_fill(blocked, torch.finfo(torch.float32).min)
    cos_sin = rope_cls(config=config)(x, position_ids)
    with torch.no_grad():
        if name.startswith("neox"):
            expected = ref(x, attention_mask=additive, position_embeddings=cos_sin)[0]
        else:
            expected = ref(x, position_embeddings=cos_sin, attention_mask=additive)[0]
        got = ours(x, key_padding_mask=mask == 0, position_ids=position_ids)
    real = mask.bool()  # HF's outputs at fully masked pad queries are arbitrary
    torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=1e-4)


def test_rotary_equals_transformers_apply_rotary_pos_emb():
    config = transformers.LlamaConfig(**BASE, rope_theta=1234.0)
    q, k = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8)
    ids = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])
    cos, sin = llama.LlamaRotaryEmbedding(config=config)(q, ids)
    ref_q, ref_k = llama.apply_rotary_pos_emb(q, k, cos, sin)
    got_q, got_k = RotaryPositions(1234.0).rotate(q, k, ids)
    torch.testing.assert_close(got_q, ref_q)
    torch.testing.assert_close(got_k, ref_k)
