"""Multi-head latent attention (issue 29.1, 29.3): the three implementations (naive, sdpa,
absorbed) equal in float64 with rotary and left padding, the naive form equal to an
independent per-query reference written from the paper's equations, the KV cache counted as
the latent plus the rotary key, the init, and the spec's refusals."""

import math

import pytest
import torch

import variantlab as vl
from variantlab.errors import SpecError
from variantlab.probes.params import state_rows

REG = vl.get_registry()
MLA = {"kind": "mla", "kv_lora_rank": 12, "q_lora_rank": 10, "qk_rope_head_dim": 4,
       "qk_nope_head_dim": 6, "v_head_dim": 5}


def model_with(attention, **extra):
    spec = {"family": "gpt", "vocab_size": 64, "context_length": 32, "emb_dim": 32, "n_heads": 4,
            "n_layers": 2, "drop_rate": 0.0, "positional": {"kind": "rotary", "theta": 100.0},
            "norm": {"kind": "rms"}, "attention": attention, **extra}
    torch.manual_seed(0)
    return vl.build_model(spec, REG)


@pytest.mark.parametrize("options", [MLA, dict(MLA, q_lora_rank=None, qkv_bias=True),
                                     dict(MLA, scale=0.45)],
                         ids=["q-lora", "full-query", "own-scale"])
def test_implementations_equal_in_float64(options):
    options = dict(options)
    bias = options.pop("qkv_bias", False)
    base = model_with(options, qkv_bias=bias).double().eval()
    idx = torch.randint(0, 64, (3, 10))
    mask = torch.ones(3, 10, dtype=torch.long)
    mask[0, :4] = 0
    outs, grads = {}, {}
    for impl in ("naive", "sdpa", "absorbed"):
        model = model_with(dict(options, impl=impl), qkv_bias=bias).double()
        model.load_state_dict(base.state_dict())
        out = model(idx, attention_mask=mask)
        out[mask.bool()].square().sum().backward()
        outs[impl] = out[mask.bool()]
        grads[impl] = torch.cat([p.grad.flatten() for p in model.parameters()])
    for impl in ("sdpa", "absorbed"):
        assert (outs[impl] - outs["naive"]).abs().max().item() < 1e-10
        assert (grads[impl] - grads["naive"]).abs().max().item() < 1e-9
    fused = model_with(dict(options, impl="sdpa"), qkv_bias=bias).double().eval()
    fused.load_state_dict(base.state_dict())  # no mask: the padded-width causal kernel
    with torch.no_grad():
        assert (fused(idx) - base(idx)).abs().max().item() < 1e-10


def rope(x, positions, theta):  # x (T, d) in the rotate-half layout
    d = x.shape[-1]
    freq = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
    angle = positions[:, None].double() * freq  # (T, d/2)
    cos, sin = torch.cat([angle.cos()] * 2, -1), torch.cat([angle.sin()] * 2, -1)
    half = torch.cat([-x[:, d // 2:], x[:, :d // 2]], -1)
    return x * cos + half * sin


def reference(att, x, theta, scale=None, dv=5):
    """DeepSeek-V2's eq. 9-19 for one sequence x (T, D), one query and one head at a time,
    from the module's weights only (scores times ``scale``, default 1/sqrt(qk head dim);
    ``dv``: the spec's v_head_dim)."""
    t = x.shape[0]
    nope, rope_d, rank, heads = 6, 4, 12, 4

    def rms(v, scale):
        return scale * v / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6)

    c_q = rms(x @ att.q_a_proj.weight.T + att.q_a_proj.bias, att.q_a_norm.scale)
    q = (c_q @ att.q_b_proj.weight.T).view(t, heads, nope + rope_d)
    kv_a = x @ att.kv_a_proj.weight.T + att.kv_a_proj.bias  # (T, rank + rope)
    c_kv = rms(kv_a[:, :rank], att.kv_a_norm.scale)
    k_r = rope(kv_a[:, rank:], torch.arange(t), theta)  # (T, rope): shared by the heads
    up = att.kv_b_proj.weight.view(heads, nope + dv, rank)
    out = torch.zeros(t, heads * dv, dtype=x.dtype)
    for h in range(heads):
        k_c = c_kv @ up[h, :nope].T  # (T, nope)
        v = c_kv @ up[h, nope:].T  # (T, dv)
        q_r = rope(q[:, h, nope:], torch.arange(t), theta)
        for i in range(t):
            scores = torch.stack([(q[i, h, :nope] @ k_c[j] + q_r[i] @ k_r[j])
                                  * (scale or 1 / math.sqrt(nope + rope_d))
                                  for j in range(i + 1)])
            out[i, h * dv:(h + 1) * dv] = torch.softmax(scores, 0) @ v[: i + 1]
    return out @ att.out_proj.weight.T + att.out_proj.bias


@pytest.mark.parametrize("scale", [None, 0.45])
def test_naive_form_equals_the_papers_equations_per_query(scale):
    model = model_with(dict(MLA, scale=scale), qkv_bias=True).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)  # norm scales away from 1
    att = model.trf_blocks[0].att.sublayer
    x = torch.randn(1, 7, 32, dtype=torch.float64)
    with torch.no_grad():
        # 1e-7: the model's rotary angles are float32 (as Hugging Face's), the reference's not
        assert (att(x)[0] - reference(att, x[0], 100.0, scale)).abs().max().item() < 1e-7
        if scale is not None:  # the scale matters
            assert (att(x)[0] - reference(att, x[0], 100.0)).abs().max().item() > 1e-3


def test_kv_cache_is_the_latent_plus_the_rotary_key():
    model = model_with(MLA)
    att = model.trf_blocks[0].att.sublayer
    assert att.state_size(5) == (12 + 4) * 5
    rows = {(r["metric"], r["scope"], r["layer"]): r["value"] for r in state_rows(model)}
    assert rows[("state_bytes_per_token", "model", None)] == 2 * (12 + 4) * 4  # 2 layers, fp32
    gqa = model_with({"kind": "mha", "n_kv_heads": 1})  # K and V, one head of 8, per layer
    rows = {(r["metric"], r["scope"], r["layer"]): r["value"] for r in state_rows(gqa)}
    assert rows[("state_bytes_per_token", "model", None)] == 2 * 2 * 8 * 4


def test_init_latent_norms_at_one_and_projections_reached_by_the_inits():
    model = model_with(dict(MLA, kv_lora_rank=64, q_lora_rank=48), emb_dim=128, n_heads=4)
    att = model.trf_blocks[0].att.sublayer
    assert torch.equal(att.kv_a_norm.scale, torch.ones(64))
    assert torch.equal(att.q_a_norm.scale, torch.ones(48))
    bound = 1 / math.sqrt(128)  # each projection a fresh nn.Linear: U(-1/sqrt(in), 1/sqrt(in))
    w = att.kv_a_proj.weight
    assert w.abs().max().item() <= bound and abs(w.std().item() - bound / math.sqrt(3)) < 0.1 * bound
    normal = model_with(MLA, init={"kind": "normal", "std": 0.006})  # DeepSeek-V3's std
    att = normal.trf_blocks[0].att.sublayer
    for linear in (att.q_a_proj, att.q_b_proj, att.kv_a_proj, att.kv_b_proj):
        assert abs(linear.weight.std().item() - 0.006) < 0.0015
    assert att.out_proj.weight.std().item() < 0.006 / math.sqrt(4) * 1.3  # residual-scaled


def test_odd_rotary_width_is_refused():
    with pytest.raises(SpecError, match="qk_rope_head_dim=3 is odd"):
        vl.parse_model_spec({"family": "gpt", "emb_dim": 32, "n_heads": 4,
                             "attention": dict(MLA, qk_rope_head_dim=3)}, REG)


def test_default_sizes_follow_the_head_width():
    spec = vl.parse_model_spec({"family": "gpt", "emb_dim": 64, "n_heads": 4,
                                "attention": {"kind": "mla"}}, REG)
    assert spec.attention.sizes(64, 4) == {"kv_lora_rank": 64, "qk_rope_head_dim": 8,
                                           "qk_nope_head_dim": 16, "v_head_dim": 16}


def cross_reference(att, x, memory):
    """Cross-attention of MLA from its weights (DeepSeek-V2 eq. 9-19 without a mask and with
    no rotation: the target's queries and the memory's keys have no common positions), one
    query and one head at a time: x (T, D) attends to memory (S, D)."""
    t, s = x.shape[0], memory.shape[0]
    nope, rope_d, rank, dv, heads = 6, 4, 12, 5, 4

    def rms(v, scale):
        return scale * v / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6)

    def linear(layer, v):
        return v @ layer.weight.T + (0 if layer.bias is None else layer.bias)

    c_q = rms(linear(att.q_a_proj, x), att.q_a_norm.scale)
    q = linear(att.q_b_proj, c_q).view(t, heads, nope + rope_d)
    kv_a = linear(att.kv_a_proj, memory)  # (S, rank + rope)
    c_kv, k_r = rms(kv_a[:, :rank], att.kv_a_norm.scale), kv_a[:, rank:]
    up = att.kv_b_proj.weight.view(heads, nope + dv, rank)
    out = torch.zeros(t, heads * dv, dtype=x.dtype)
    for h in range(heads):
        k_c, v = c_kv @ up[h, :nope].T, c_kv @ up[h, nope:].T  # (S, nope), (S, dv)
        for i in range(t):
            scores = torch.stack([(q[i, h, :nope] @ k_c[j] + q[i, h, nope:] @ k_r[j])
                                  / math.sqrt(nope + rope_d) for j in range(s)])
            out[i, h * dv:(h + 1) * dv] = torch.softmax(scores, 0) @ v
    return linear(att.out_proj, out)


@pytest.mark.parametrize("impl", ["naive", "sdpa", "absorbed"])
def test_cross_attention_to_a_memory_of_another_length_equals_the_reference(impl):
    """An encoder-decoder with MLA and rotary: the decoder's cross-attention to a memory of
    7 positions from a target of 5 neither rotates (its positions are not the memory's) nor
    masks; every impl equals the per-query reference (issue 38: a mutant rotated them)."""
    spec = {"family": "encoder_decoder", "vocab_size": 64, "context_length": 32,
            "emb_dim": 32, "n_heads": 4, "n_layers": 1, "drop_rate": 0.0,
            "positional": {"kind": "rotary", "theta": 100.0}, "norm": {"kind": "rms"},
            "attention": dict(MLA, impl=impl)}
    torch.manual_seed(0)
    model = vl.build_model(spec, REG).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    att = model.decoder.layers[0].cross_att.sublayer
    x, memory = torch.randn(2, 5, 32, dtype=torch.float64), torch.randn(2, 7, 32,
                                                                         dtype=torch.float64)
    with torch.no_grad():
        got = att(x, memory=memory)
        for row in range(2):
            assert (got[row] - cross_reference(att, x[row], memory[row])).abs().max() < 1e-10
        src, tgt = torch.randint(0, 64, (2, 7)), torch.randint(0, 64, (2, 5))
        assert model(src, tgt).shape == (2, 5, 64)  # the whole model, lengths apart


@pytest.mark.parametrize("impl", ["naive", "sdpa", "absorbed"])
def test_values_wider_than_queries_and_keys_equal_the_reference(impl):
    """v_head_dim (12) above the query/key width (6 + 4): the fused causal path pads the
    narrower to one width and must keep the scale of the query/key width; every impl, with
    and without a mask, equals the per-query reference (issue 38: a mutant dropped
    ``scale=``)."""
    wide = dict(MLA, v_head_dim=12, impl=impl)
    model = model_with(wide, qkv_bias=True).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    att = model.trf_blocks[0].att.sublayer
    x = torch.randn(1, 7, 32, dtype=torch.float64)
    with torch.no_grad():
        want = reference(att, x[0], 100.0, dv=12)
        assert (att(x)[0] - want).abs().max().item() < 1e-7  # plain causal: the fused path
        pad = torch.zeros(1, 7, dtype=torch.bool)  # a key padding mask: the masked path
        assert (att(x, key_padding_mask=pad)[0] - want).abs().max().item() < 1e-7
