"""Exact values for mha's options (issue 30, the mutation triage of ``attentions.py``): scale,
soft-cap, output gates, dropout, the KV-cache size, chunks from a padding mask, the fused
sink key and the dynamics probe's attention numbers, each against a per-query computation
written here (loops over heads and queries, Python floats where it matters)."""

import math

import pytest
import torch

import variantlab as vl
from variantlab.model.roles import role_of
from variantlab_plugins.attentions import attention_stats, same_chunk, with_sink_key
from variantlab_plugins.rotary import ALiBiPositions

REG = vl.get_registry()


def make(emb_dim=8, n_heads=2, causal=True, positions=None, qkv_bias=True, drop_rate=0.0,
         make_norm=None, **options):
    comp = REG.get("attention", "mha")
    spec = comp.spec_cls.model_validate(options, context={"registry": REG})
    kw = {} if make_norm is None else {"make_norm": make_norm}
    return comp.build(spec, emb_dim=emb_dim, n_heads=n_heads, context_length=16,
                      drop_rate=drop_rate, qkv_bias=qkv_bias, causal=causal,
                      positions=positions, **kw)


def per_query(att, x, score, visible, gate=None):
    """The attention output by loops: for head h and query i, weights softmax over the visible
    keys j of score(h, i, j, q·k), times the values, optionally times gate(h) (T, hd), then the
    output projection. x (1, T, D); one key/value head per query head."""
    d = att.head_dim
    q, k, v = att.W_query(x[0]), att.W_key(x[0]), att.W_value(x[0])
    t = x.shape[1]
    heads = []
    for h in range(att.n_heads):
        qh, kh, vh = (m[:, h * d:(h + 1) * d] for m in (q, k, v))
        rows = []
        for i in range(t):
            js = [j for j in range(t) if visible(i, j)]
            logits = torch.stack([score(h, i, j, qh[i] @ kh[j]) for j in js])
            rows.append(torch.softmax(logits, 0) @ vh[js])
        ctx = torch.stack(rows)  # (T, hd)
        heads.append(ctx if gate is None else ctx * gate(h))
    return att.out_proj(torch.cat(heads, -1))[None]


def causal(i, j):
    return j <= i


def test_defaults_are_plain_multi_head_attention():
    spec = REG.get("attention", "mha").spec_cls()
    assert (spec.impl, spec.n_kv_heads, spec.head_dim, spec.qk_norm, spec.qk_norm_scope) == (
        "naive", None, None, None, "head")
    assert (spec.window, spec.scale, spec.softcap, spec.output_gate, spec.sinks, spec.chunk) == (
        None, None, None, "none", False, None)
    att = make()
    assert att.W_gate is None and att.sinks is None and att.q_norm is None
    assert att.record_stats is False and att.last_stats is None
    assert [role_of(m) for m in (att.W_query, att.W_key, att.W_value, att.out_proj)] == [
        "query", "key", "value", "attn_out"]


@pytest.mark.parametrize("impl", ["naive", "sdpa"])
def test_a_given_scale_replaces_one_over_sqrt_head_dim(impl):
    torch.manual_seed(0)
    att = make(impl=impl, scale=0.3)
    x = torch.randn(1, 4, 8)
    want = per_query(att, x, lambda h, i, j, qk: qk * 0.3, causal)
    torch.testing.assert_close(att(x), want)


@pytest.mark.parametrize("scale", [None, 0.7])
def test_softcap_caps_the_scaled_scores_before_the_alibi_bias(scale):
    """Gemma 2: softcap * tanh(score / softcap) of the scaled q·k, then the bias."""
    torch.manual_seed(0)
    att = make(softcap=0.5, scale=scale, positions=ALiBiPositions())
    with torch.no_grad():
        att.W_query.weight.mul_(4.0)  # scores well past the cap
    x = torch.randn(1, 4, 8)
    mult = scale or 1 / math.sqrt(4)
    slopes = [2.0 ** -4, 2.0 ** -8]  # two heads

    def score(h, i, j, qk):
        return 0.5 * torch.tanh(qk * mult / 0.5) - slopes[h] * (i - j)

    torch.testing.assert_close(att(x), per_query(att, x, score, causal))


@pytest.mark.parametrize("qkv_bias", [True, False])
def test_output_gates_multiply_each_channel_or_each_head(qkv_bias):
    torch.manual_seed(0)
    x = torch.randn(1, 3, 8)
    def plain(h, i, j, qk):
        return qk / 2.0  # head_dim 4

    for gate, width in (("elementwise", 8), ("headwise", 2)):
        att = make(output_gate=gate, qkv_bias=qkv_bias)
        assert att.W_gate.weight.shape == (width, 8)
        assert (att.W_gate.bias is not None) == qkv_bias
        g = torch.sigmoid(att.W_gate(x[0])).view(3, 2, -1)  # (T, heads, 4 or 1)
        torch.testing.assert_close(att(x), per_query(att, x, plain, causal,
                                                     lambda h, g=g: g[:, h]))


@pytest.mark.parametrize("impl", ["naive", "sdpa"])
def test_dropout_acts_in_training_only(impl):
    """drop_rate 1 drops every attention weight while training (the output is the out_proj
    bias) and none in eval (the output of drop_rate 0)."""
    torch.manual_seed(0)
    att = make(impl=impl, drop_rate=1.0)
    ref = make(impl=impl)
    ref.load_state_dict(att.state_dict())
    x = torch.randn(1, 4, 8)
    torch.testing.assert_close(att.eval()(x), ref(x))
    torch.testing.assert_close(att.train()(x), att.out_proj.bias.expand(1, 4, 8))


@pytest.mark.parametrize("options, t, kept", [
    ({}, 10, 10), ({"window": 3}, 10, 3), ({"window": 3}, 2, 2), ({"chunk": 5}, 10, 5),
    ({"chunk": 5}, 4, 4), ({"window": 3, "chunk": 2}, 10, 2), ({"window": 2, "chunk": 4}, 10, 2),
])
def test_state_size_is_the_kv_cache_it_keeps(options, t, kept):
    att = make(emb_dim=16, n_heads=4, n_kv_heads=2, head_dim=3, **options)
    assert att.state_size(t) == 2 * 2 * 3 * kept  # keys and values, 2 heads of 3


def test_qk_norm_without_make_norm_is_refused_plainly():
    with pytest.raises(TypeError, match="qk_norm needs make_norm"):
        make(qk_norm={"kind": "rms"})


def test_softcap_under_sdpa_is_a_located_error(tiny):
    with pytest.raises(vl.SpecError) as info:
        vl.parse_model_spec({**tiny, "attention": {"kind": "mha", "impl": "sdpa",
                                                   "softcap": 5.0}}, REG)
    (issue,) = info.value.issues
    assert issue.loc == ("attention", "softcap")
    assert "cannot soft-cap the scores; use impl: naive with softcap" in issue.message


def test_chunks_from_a_padding_mask_count_from_the_first_real_token():
    """No position_ids: positions 0.. from each row's first unpadded token; chunk 2."""
    pad = torch.tensor([[True, False, False, False, False], [False] * 5])
    got = same_chunk(None, 2, 5, None, pad, torch.device("cpu"))  # (2, 1, 5, 5)
    ids = [[0, 0, 0, 1, 1], [0, 0, 1, 1, 2]]  # position // 2 per row
    want = torch.tensor([[[a == b for b in row] for a in row] for row in ids])[:, None]
    assert torch.equal(got, want)
    plain = same_chunk(None, 2, 5, None, None, torch.device("cpu"))  # 0..4 for every row
    assert torch.equal(plain, want[1:])
    causal_mask = torch.ones(5, 5).tril().bool()
    assert torch.equal(same_chunk(causal_mask, 2, 5, None, None, torch.device("cpu")),
                       want[1:] & causal_mask)
    explicit = same_chunk(None, 3, 5, torch.tensor([[4, 5, 6, 7, 8]]), pad, torch.device("cpu"))
    ids = [4 // 3, 5 // 3, 6 // 3, 7 // 3, 8 // 3]  # given positions win over the mask
    assert torch.equal(explicit[0, 0], torch.tensor([[a == b for b in ids] for a in ids]))


def test_the_sink_key_is_a_zero_key_whose_score_is_the_sink_logit():
    q, k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4)
    sinks = torch.tensor([0.5, -1.0])
    allowed = torch.ones(3, 3).tril().bool()
    bias = torch.randn(2, 3, 3)
    q2, k2, v2, mask = with_sink_key(q, k, v, allowed, bias, sinks)
    assert q2 is q and k2.shape == (1, 2, 4, 4) and v2.shape == (1, 2, 4, 4)
    assert torch.equal(k2[:, :, :3], k) and torch.equal(v2[:, :, :3], v)
    assert not k2[:, :, 3].any() and not v2[:, :, 3].any()
    assert mask.shape == (1, 2, 3, 4)
    for h in range(2):
        for i in range(3):
            for j in range(3):
                want = bias[h, i, j].item() if j <= i else -math.inf
                assert mask[0, h, i, j].item() == want
            assert mask[0, h, i, 3].item() == sinks[h].item()
    _, _, _, plain = with_sink_key(q, k, v, None, None, sinks)
    assert torch.equal(plain[..., :3], torch.zeros(1, 2, 3, 3))


def stats_by_hand(q, k, allowed, bias, scale, softcap, sinks):
    """attention_stats' numbers by loops over batch, head and query, in Python floats."""
    b_n, h_n, t_n, d = q.shape
    logits, entropies, firsts, sink_masses = [], [], [], []
    for b in range(b_n):
        for h in range(h_n):
            for i in range(t_n):
                js = [j for j in range(k.shape[2]) if allowed is None or bool(allowed[i, j])]
                if not js:
                    continue
                raw = {j: float(q[b, h, i] @ k[b, h, j]) * scale for j in js}
                logits += raw.values()
                s = {j: (softcap * math.tanh(x / softcap) if softcap else x)
                     + (float(bias[h, i, j]) if bias is not None else 0.0) for j, x in raw.items()}
                z = sum(math.exp(x) for x in s.values())
                p = {j: math.exp(x) / z for j, x in s.items()}
                entropies.append(-sum(pj * math.log(pj) for pj in p.values()))
                z_sink = z + (math.exp(float(sinks[h])) if sinks is not None else 0.0)
                if sinks is not None:
                    sink_masses.append(math.exp(float(sinks[h])) / z_sink)
                if i > 0 and 0 in js:
                    firsts.append(math.exp(s[0]) / z_sink)
    out = {"max_logit": max(logits), "entropy": sum(entropies) / len(entropies),
           "first_token_mass": sum(firsts) / len(firsts) if firsts else math.nan}
    if sinks is not None:
        out["sink_mass"] = sum(sink_masses) / len(sink_masses)
    return out


@pytest.mark.parametrize("case", ["plain", "scale-softcap-bias", "window-sinks", "dead-query",
                                  "cross", "negative"])
def test_attention_stats_match_a_per_query_computation(case):
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 2, 5, 3, generator=gen, dtype=torch.float64) * 2
    k = torch.randn(2, 2, 7 if case == "cross" else 5, 3, generator=gen, dtype=torch.float64)
    i, j = torch.arange(5)[:, None], torch.arange(5)[None]
    allowed, bias, scale, softcap, sinks = j <= i, None, None, None, None
    if case == "dead-query":  # query 0 sees no key (a left pad); key 0 is hidden from all
        allowed = (j <= i) & (j >= 1)
    if case == "cross":  # 5 queries, 7 keys, no mask
        allowed = None
    if case == "negative":  # every visible q.k negative: the masked ones must not show as 0
        q, k = q.abs(), -k.abs()
    if case == "scale-softcap-bias":
        bias, scale, softcap = ALiBiPositions().score_bias(2, 5, 5, None, torch.float64), 0.4, 1.5
    if case == "window-sinks":
        allowed, sinks = (j <= i) & (i - j < 3), torch.tensor([0.3, -0.8])
    got = attention_stats(q, k, allowed, bias, 3, scale, softcap, sinks)
    want = stats_by_hand(q, k, allowed, bias, scale or 3 ** -0.5, softcap, sinks)
    assert got.keys() == want.keys()
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-6, abs=1e-9, nan_ok=True), key


def test_attention_stats_without_a_mask_and_with_no_visible_key():
    q = torch.tensor([[[[1.0, 0.0], [0.0, 2.0]]]])  # (1, 1, 2, 2)
    k = torch.tensor([[[[3.0, 0.0], [0.0, -1.0]]]])
    got = attention_stats(q, k, None, None, 2)  # bidirectional: both queries see both keys
    s = 2 ** -0.5
    rows = [[3 * s, 0.0], [0.0, -2 * s]]

    def softmax(row):
        z = sum(math.exp(x) for x in row)
        return [math.exp(x) / z for x in row]

    ent = [-sum(p * math.log(p) for p in softmax(r)) for r in rows]
    assert got["max_logit"] == pytest.approx(3 * s)
    assert got["entropy"] == pytest.approx(sum(ent) / 2)
    assert got["first_token_mass"] == pytest.approx(softmax(rows[1])[0])  # query 1 only
    none = attention_stats(q, k, torch.zeros(2, 2, dtype=torch.bool), None, 2,
                           sinks=torch.tensor([0.0]))
    assert math.isnan(none["entropy"]) and math.isnan(none["sink_mass"])
    assert math.isnan(none["first_token_mass"])


def test_mha_walk_examples_are_valid_in_a_four_head_model(tiny):
    spec_cls = REG.get("attention", "mha").spec_cls
    for example in spec_cls.walk_examples:
        attention = vl.parse_model_spec({**tiny, "attention": example}, REG).attention
        assert all(getattr(attention, key) == value for key, value in example.items()
                   if key != "qk_norm"), example


def test_qk_norm_takes_none_a_built_spec_or_a_mapping():
    spec_cls = REG.get("attention", "mha").spec_cls
    rms = REG.get("norm", "rms").spec_cls()
    assert spec_cls(qk_norm=None).qk_norm is None
    assert spec_cls(qk_norm="none").qk_norm is None
    assert spec_cls(qk_norm=rms).qk_norm is rms
    assert spec_cls.model_validate({"qk_norm": {"kind": "rms"}},
                                   context={"registry": REG}).qk_norm == rms


def test_softcap_is_accepted_with_the_naive_impl(tiny):
    spec = vl.parse_model_spec({**tiny, "attention": {"kind": "mha", "softcap": 5.0}}, REG)
    assert (spec.attention.impl, spec.attention.softcap) == ("naive", 5.0)


def test_built_by_hand_the_output_projection_has_a_bias():
    from variantlab_plugins.attentions import MHASpec, MultiHeadAttention

    att = MultiHeadAttention(8, 2, 0.0, False, True, MHASpec())
    assert att.out_proj.bias is not None and att.W_query.bias is None


@pytest.mark.parametrize("case, route", [
    ({}, "is_causal"),  # plain causal self-attention: torch's causal kernels, no mask tensor
    ({"window": 2}, "bool mask"),
    ({"pad": True}, "bool mask"),
    ({"causal": False}, "no mask"),
    ({"causal": False, "cross": True}, "no mask"),
    ({"cross": True}, "bool mask"),  # causal flag with 5 keys for 3 queries
    ({"cross": True, "short": True}, "bool mask"),  # and with 2 keys for 3 queries
    ({"causal": False, "window": 2}, "bool mask"),
    ({"positions": ALiBiPositions()}, "float mask"),
    ({"positions": ALiBiPositions(), "causal": False}, "float mask"),
    ({"sinks": True}, "float mask"),
    ({"scale": 0.3}, "is_causal"),
])
def test_the_fused_impl_calls_torch_with_the_mask_it_needs(monkeypatch, case, route):
    """impl sdpa hands torch's fused attention the least it needs (is_causal alone for plain
    causal self-attention), its scale only when one is set, and equals naive throughout."""
    case = dict(case)
    pad, cross, scale = case.pop("pad", False), case.pop("cross", False), case.get("scale")
    n_memory = 2 if case.pop("short", False) else 5
    calls = []
    fused = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        mask = ("no mask" if attn_mask is None else
                "bool mask" if attn_mask.dtype == torch.bool else "float mask")
        calls.append(("is_causal" if kw.get("is_causal") else mask, kw.get("scale"),
                      k.shape[2]))
        return fused(q, k, v, attn_mask, **kw)

    torch.manual_seed(0)
    sdpa = make(impl="sdpa", **case)
    naive = make(impl="naive", **case)
    naive.load_state_dict(sdpa.state_dict())
    x = torch.randn(2, 3, 8)
    memory = torch.randn(2, n_memory, 8) if cross else None
    kw = {"key_padding_mask": torch.tensor([[True, False, False], [False] * 3])} if pad else {}
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    out = sdpa(x, memory=memory, **kw)
    keys = (n_memory if cross else 3) + bool(case.get("sinks"))
    assert calls == [(route, scale, keys)]
    torch.testing.assert_close(out, naive(x, memory=memory, **kw))
