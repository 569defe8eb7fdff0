"""Sequence mixers (variantlab_plugins/mixers.py) and gated attention: the chunked forms equal
the token-by-token recurrences in float64, padding, the refusals, hybrids, HF's gate."""

import math

import pytest
import torch

import variantlab as vl
from variantlab.errors import SpecError
from variantlab.testing import component_problems
from variantlab_plugins.mixers import chunked_scan, recurrent_scan, retention_decays

REG = vl.get_registry()
TINY = {"vocab_size": 50, "context_length": 16, "emb_dim": 32, "n_heads": 4, "n_layers": 2,
        "drop_rate": 0.0, "positional": "learned"}
MIXERS = [
    {"kind": "linear_attention"},
    {"kind": "linear_attention", "feature_map": "relu", "normalization": "head_norm",
     "output_gate": "swish", "chunk_size": 3},
    {"kind": "linear_attention", "feature_map": "identity", "normalization": "none",
     "chunk_size": 5},
    {"kind": "retention"},
    {"kind": "retention", "normalization": "none", "output_gate": "sigmoid", "chunk_size": 4},
    {"kind": "short_conv"},
    {"kind": "short_conv", "width": 2, "activation": "silu", "output_gate": "sigmoid"},
]


def model(attention, **more):
    return vl.build_model({**TINY, "attention": attention, **more}, REG)


def test_retention_decays_are_retnets():
    assert retention_decays(4).tolist() == [1 - 2 ** -5, 1 - 2 ** -6, 1 - 2 ** -7, 1 - 2 ** -8]


@pytest.mark.parametrize("chunk", [1, 3, 4, 7, 11, 64])
@pytest.mark.parametrize("decayed", [False, True])
def test_chunked_scan_equals_the_recurrence(chunk, decayed):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 11, n, generator=g, dtype=torch.float64) for n in (4, 4, 5))
    ld = retention_decays(3).log() if decayed else None
    ref = recurrent_scan(q, k, v, ld)  # (B, H, T, dv)
    # by hand at t = 4, head 2: o = sum_j gamma^(4-j) (q_4 . k_j) v_j
    gamma = 1.0 if ld is None else math.exp(ld[2])
    by_hand = sum(gamma ** (4 - j) * (q[0, 2, 4] @ k[0, 2, j]) * v[0, 2, j] for j in range(5))
    assert torch.allclose(ref[0, 2, 4], by_hand, atol=1e-12)
    assert torch.allclose(chunked_scan(q, k, v, ld, chunk), ref, atol=1e-12)


@pytest.mark.parametrize("attention", MIXERS, ids=lambda a: "-".join(map(str, a.values())))
def test_model_chunked_equals_recurrent_float64(attention):
    idx = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(1))
    outs = []
    for impl in ("chunked", "recurrent"):
        torch.manual_seed(0)
        m = model({**attention, "impl": impl}).double().eval()
        outs.append(m(idx))
    assert outs[0].dtype == torch.float64
    assert torch.allclose(outs[0], outs[1], atol=1e-10, rtol=0)


@pytest.mark.parametrize("attention", MIXERS[::2], ids=lambda a: a["kind"])
def test_left_padding_gives_the_unpadded_outputs(attention):
    torch.manual_seed(0)
    m = model(attention, positional="none").double().eval()
    idx = torch.randint(0, 50, (1, 10), generator=torch.Generator().manual_seed(2))
    padded = torch.cat([torch.full((1, 3), 7), idx], dim=1)  # (1, 13): 3 pads first
    mask = torch.cat([torch.zeros(1, 3), torch.ones(1, 10)], dim=1).long()
    out = m(padded, attention_mask=mask)[:, 3:]
    assert torch.allclose(out, m(idx), atol=1e-10)


@pytest.mark.parametrize("attention", MIXERS, ids=lambda a: "-".join(map(str, a.values())))
def test_mixers_pass_the_conformance_kit(attention):
    assert component_problems("attention", attention, families=["gpt", "block"]) == []


def test_kit_catches_a_mixer_that_reads_ahead(tmp_path):
    plugin = tmp_path / "peeking.py"
    plugin.write_text(
        "from typing import ClassVar, Literal\n"
        "import torch\n"
        "from variantlab import ComponentSpec, hookimpl\n"
        "class PeekSpec(ComponentSpec):\n"
        "    kind: Literal['peek'] = 'peek'\n"
        "    causal_only: ClassVar[bool] = True\n"
        "class Peek(torch.nn.Module):\n"
        "    causal = True\n"
        "    def __init__(self, d):\n"
        "        super().__init__(); self.lin = torch.nn.Linear(d, d)\n"
        "    def forward(self, x, memory=None, key_padding_mask=None, position_ids=None):\n"
        "        return self.lin(x + x.roll(-1, dims=1))  # sees the next token\n"
        "    def state_size(self, t):\n"
        "        return 0\n"
        "@hookimpl\n"
        "def register_attentions(register):\n"
        "    register('peek', PeekSpec, lambda spec, emb_dim, **_: Peek(emb_dim))\n")
    problems = component_problems("attention", {"kind": "peek"}, [str(plugin)],
                                  families=["gpt"])
    text = "\n".join(problems)
    assert "outputs at <= t when tokens after t change" in text
    assert "accepted causal=False" in text and "accepted a memory" in text
    assert "padded positions" in text


@pytest.mark.parametrize("data, loc, words", [
    ({"family": "encoder", "attention": "retention"}, "attention.kind", "bidirectionally"),
    ({"family": "block", "causal_attention": False, "attention": "linear_attention"},
     "attention.kind", "bidirectionally"),
    ({"family": "decoder", "attention": "short_conv"}, "attention.kind", "cross-attends"),
    ({"family": "encoder_decoder", "attention": "retention"}, "attention.kind",
     "cross-attends"),
    ({"attention": "retention", "positional": "rotary"}, "positional.kind",
     "does not take `positions`"),
    ({"attention": {"kind": "short_conv", "width": 17}}, "attention.width", "context_length"),
    ({"attention": {"kind": "linear_attention", "feature_map": "identity"}},
     "attention.normalization", "identity"),
    ({"positional": "alibi", "layout": {"kinds": {"lin": {"attention": "linear_attention"},
                                                  "att": {}}, "pattern": ["lin", "att"]}},
     "layout.kinds.lin.attention.kind", "alibi"),
])
def test_mixers_refuse_where_they_cannot_work(data, loc, words):
    with pytest.raises(SpecError) as err:
        vl.parse_model_spec({**TINY, **data}, REG)
    assert any(".".join(map(str, i.loc)) == loc and words in i.message
               for i in err.value.issues), str(err.value)


def test_builds_and_forwards_refuse_plainly():
    torch.manual_seed(0)
    mixers = [mod for mod in model("retention").modules()
              if getattr(mod, "variantlab_kind", "") == "retention"]
    with pytest.raises(ValueError, match="cannot cross-attend"):
        mixers[0](torch.randn(1, 4, 32), memory=torch.randn(1, 3, 32))
    comp = REG.get("attention", "retention")
    spec = vl.parse_model_spec({**TINY, "attention": "retention"}, REG).attention
    with pytest.raises(ValueError, match="bidirectional"):
        comp.build(spec, emb_dim=32, n_heads=4, context_length=16, drop_rate=0.0,
                   qkv_bias=False, causal=False)


def test_hybrid_layout_puts_mixers_in_their_layers():
    layout = {"kinds": {"ret": {"attention": "retention"}, "conv": {"attention": "short_conv"},
                        "att": {}}, "pattern": ["ret", "conv", "att"]}
    spec = vl.parse_model_spec({**TINY, "n_layers": 3, "positional": "rotary",
                                "layout": layout}, REG)
    m = vl.build_model(spec, REG)
    kinds = [mod.variantlab_kind for mod in m.modules()
             if getattr(mod, "variantlab_slot", None) == "attention"]
    assert kinds == ["retention", "short_conv", "mha"]
    assert m(torch.randint(0, 50, (2, 16))).shape == (2, 16, 50)


def test_gated_attention_keeps_old_keys_and_gates():
    plain = vl.parse_model_spec(TINY, REG)
    assert "output_gate" not in plain.to_data()["attention"]
    gated = vl.parse_model_spec({**TINY, "attention": {"kind": "mha", "output_gate":
                                                       "headwise"}}, REG)
    assert gated.to_data()["attention"]["output_gate"] == "headwise"
    torch.manual_seed(0)
    m = vl.build_model(gated, REG)
    gates = [mod.W_gate for mod in m.modules() if getattr(mod, "variantlab_kind", "") == "mha"]
    assert gates[0].weight.shape == (4, 32)  # one gate per head


def test_elementwise_gate_equals_qwen3_next_attention():
    """Our mha with output_gate elementwise, GQA and RMS QK-norm against HF's
    Qwen3NextAttention (q_proj holds [query, gate] per head; norms (1 + w), here w = 0;
    rotary made the identity with cos 1, sin 0)."""
    qn = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    from transformers import Qwen3NextConfig

    cfg = Qwen3NextConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=8, attention_bias=False, rms_norm_eps=1e-6)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = qn.Qwen3NextAttention(cfg, layer_idx=3).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.3)
        hf.q_norm.weight.zero_()
        hf.k_norm.weight.zero_()
    spec = vl.parse_model_spec({**TINY, "norm": {"kind": "rms", "eps": 1e-6}, "attention": {
        "kind": "mha", "n_kv_heads": 2, "head_dim": 8, "qk_norm": {"kind": "rms", "eps": 1e-6},
        "output_gate": "elementwise"}, "attn_out_bias": False}, REG)
    ours = [mod for mod in vl.build_model(spec, REG).modules()
            if getattr(mod, "variantlab_kind", "") == "mha"][0].eval()
    with torch.no_grad():
        q_and_gate = hf.q_proj.weight.view(4, 2, 8, 32)  # (H, [query, gate], hd, D)
        ours.W_query.weight.copy_(q_and_gate[:, 0].reshape(32, 32))
        ours.W_gate.weight.copy_(q_and_gate[:, 1].reshape(32, 32))
        ours.W_key.weight.copy_(hf.k_proj.weight)
        ours.W_value.weight.copy_(hf.v_proj.weight)
        ours.out_proj.weight.copy_(hf.o_proj.weight)
    x = torch.randn(2, 6, 32)
    cos, sin = torch.ones(2, 6, 8), torch.zeros(2, 6, 8)
    causal = torch.full((6, 6), -torch.inf).triu(1)[None, None]  # (1, 1, T, T)
    with torch.no_grad():
        want = hf(x, (cos, sin), causal)[0]
        got = ours(x)
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
