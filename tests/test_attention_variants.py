"""Issue 9: grouped-query attention, QK-norm, head_dim, sliding window and out_bias against
their formulas on hand-sized inputs; naive equals sdpa (outputs and gradients) over every
combination with rotary/ALiBi, causal/bidirectional/cross and padding; validation errors."""

import itertools
import math

import pytest
import torch

import variantlab as vl
from variantlab_plugins.rotary import ALiBiPositions, RotaryPositions

REG = vl.get_registry()


def make(emb_dim=8, n_heads=4, causal=True, positions=None, out_bias=True, drop_rate=0.0,
         **options):
    comp = REG.get("attention", "mha")
    spec = comp.spec_cls.model_validate(options, context={"registry": REG})
    return comp.build(spec, emb_dim=emb_dim, n_heads=n_heads, context_length=16,
                      drop_rate=drop_rate, qkv_bias=True, causal=causal, positions=positions,
                      out_bias=out_bias, make_norm=registry_norm)


def registry_norm(dim, spec):
    """A norm of width ``dim`` as the spec says (what build_model's make_norm gives)."""
    return REG.get("norm", spec.kind).build(spec, dim=dim)


def by_hand(q_heads, k_heads, v_heads, allowed):
    """softmax(q k^T / sqrt(d)) v for lists of (T, d) / (S, d) heads; allowed (T, S)."""
    out = []
    for q, k, v in zip(q_heads, k_heads, v_heads):
        scores = q @ k.T / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(~allowed, -torch.inf)
        out.append(torch.softmax(scores, -1) @ v)
    return torch.cat(out, dim=-1)  # (T, H * d)


def heads(x, n, d):  # (T, n * d) -> n tensors (T, d)
    return [x[:, i * d:(i + 1) * d] for i in range(n)]


@pytest.mark.parametrize("n_kv_heads", [1, 2, 4])
def test_grouped_query_attention_matches_the_formula(n_kv_heads):
    att = make(n_kv_heads=n_kv_heads)  # 4 query heads of width 2
    assert att.W_key.weight.shape == (2 * n_kv_heads, 8)
    assert att.W_value.weight.shape == (2 * n_kv_heads, 8)
    x = torch.randn(1, 5, 8)
    q, k, v = att.W_query(x[0]), att.W_key(x[0]), att.W_value(x[0])
    group = 4 // n_kv_heads
    kh, vh = heads(k, n_kv_heads, 2), heads(v, n_kv_heads, 2)
    # query head h reads key/value head h // group (Ainslie et al. 2023, fig. 2)
    ctx = by_hand(heads(q, 4, 2), [kh[h // group] for h in range(4)],
                  [vh[h // group] for h in range(4)], torch.ones(5, 5).tril().bool())
    torch.testing.assert_close(att(x)[0], att.out_proj(ctx))


def test_independent_head_dim_and_no_output_bias():
    att = make(emb_dim=8, n_heads=2, head_dim=6, out_bias=False, n_kv_heads=1)
    assert att.W_query.weight.shape == (12, 8) and att.W_key.weight.shape == (6, 8)
    assert att.out_proj.weight.shape == (8, 12) and att.out_proj.bias is None
    x = torch.randn(1, 4, 8)
    q, k, v = att.W_query(x[0]), att.W_key(x[0]), att.W_value(x[0])
    ctx = by_hand(heads(q, 2, 6), [k, k], [v, v], torch.ones(4, 4).tril().bool())
    torch.testing.assert_close(att(x)[0], ctx @ att.out_proj.weight.T)


def rms(x, scale, eps=1e-5):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * scale


def layer(x, scale, shift, eps=1e-5):
    mean, var = x.mean(-1, keepdim=True), x.var(-1, keepdim=True, unbiased=False)
    return (x - mean) / torch.sqrt(var + eps) * scale + shift


def test_qk_norm_per_head_matches_the_formula():
    att = make(qk_norm={"kind": "rms"}, qk_norm_scope="head", n_kv_heads=2)
    assert att.q_norm.scale.shape == (2,)  # over one head's dims, shared by the heads
    with torch.no_grad():
        att.q_norm.scale.copy_(torch.tensor([0.5, 2.0]))
        att.k_norm.scale.copy_(torch.tensor([1.5, -1.0]))
    x = torch.randn(1, 4, 8)
    q, k, v = att.W_query(x[0]), att.W_key(x[0]), att.W_value(x[0])
    qh = [rms(h, torch.tensor([0.5, 2.0])) for h in heads(q, 4, 2)]
    kh = [rms(h, torch.tensor([1.5, -1.0])) for h in heads(k, 2, 2)]
    ctx = by_hand(qh, [kh[h // 2] for h in range(4)], [heads(v, 2, 2)[h // 2] for h in range(4)],
                  torch.ones(4, 4).tril().bool())
    torch.testing.assert_close(att(x)[0], att.out_proj(ctx))


def test_qk_norm_over_the_projection_matches_the_formula():
    att = make(qk_norm={"kind": "layer"}, qk_norm_scope="projection", n_kv_heads=2)
    assert att.q_norm.scale.shape == (8,) and att.k_norm.scale.shape == (4,)
    with torch.no_grad():
        for p in (att.q_norm.scale, att.q_norm.shift, att.k_norm.scale, att.k_norm.shift):
            p.uniform_(-1, 1)
    x = torch.randn(1, 4, 8)
    q = layer(att.W_query(x[0]), att.q_norm.scale, att.q_norm.shift)  # across all heads
    k = layer(att.W_key(x[0]), att.k_norm.scale, att.k_norm.shift)
    v = att.W_value(x[0])
    ctx = by_hand(heads(q, 4, 2), [heads(k, 2, 2)[h // 2] for h in range(4)],
                  [heads(v, 2, 2)[h // 2] for h in range(4)], torch.ones(4, 4).tril().bool())
    torch.testing.assert_close(att(x)[0], att.out_proj(ctx))


def test_qk_norm_before_rotary():
    rope = RotaryPositions()
    att = make(qk_norm={"kind": "rms"}, positions=rope, n_heads=2)
    x = torch.randn(1, 3, 8)
    q = torch.stack(heads(att.W_query(x[0]), 2, 4))[None]  # (1, 2, 3, 4)
    k = torch.stack(heads(att.W_key(x[0]), 2, 4))[None]
    q, k = rope.rotate(rms(q, att.q_norm.scale), rms(k, att.k_norm.scale))
    v = heads(att.W_value(x[0]), 2, 4)
    ctx = by_hand(list(q[0]), list(k[0]), v, torch.ones(3, 3).tril().bool())
    torch.testing.assert_close(att(x)[0], att.out_proj(ctx))


@pytest.mark.parametrize("causal", [True, False])
def test_sliding_window_matches_the_formula(causal):
    att = make(window=2, causal=causal, n_heads=2)
    x = torch.randn(1, 6, 8)
    i, j = torch.arange(6)[:, None], torch.arange(6)[None]
    allowed = ((j <= i) & (i - j < 2)) if causal else ((i - j).abs() < 2)
    q, k, v = (heads(w(x[0]), 2, 4) for w in (att.W_query, att.W_key, att.W_value))
    torch.testing.assert_close(att(x)[0], att.out_proj(by_hand(q, k, v, allowed)))
    y = x.clone()
    y[:, 0] += 5.0  # outside every window from position 2 on
    torch.testing.assert_close(att(x)[:, 2:], att(y)[:, 2:])


# -- naive equals sdpa over every combination ---------------------------------------------
def outputs_and_grads(module, x, memory, kw):
    x = x.clone().requires_grad_()
    memory = None if memory is None else memory.clone().requires_grad_()
    module.zero_grad()
    out = module(x, memory=memory, **kw)
    (out * torch.linspace(-1, 1, out.shape[-1])).sum().backward()
    grads = {n: p.grad for n, p in module.named_parameters()}
    grads["x"] = x.grad
    if memory is not None:
        grads["memory"] = memory.grad
    return out.detach(), grads


POSITIONS = {"none": None, "rotary": RotaryPositions(fraction=0.5), "alibi": ALiBiPositions()}
OPTIONS = [  # (n_kv_heads, window, qk_norm)
    (kv, w, n) for kv, w, n in itertools.product(
        [None, 2, 1], [None, 3],
        [None, {"kind": "rms"}, {"kind": "layer", "scope": "projection"}])]


@pytest.mark.parametrize("mode", ["causal", "bidirectional", "cross"])
@pytest.mark.parametrize("positional", list(POSITIONS))
def test_sdpa_equals_naive_for_every_combination(mode, positional):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(3, 6, 16, generator=gen)
    memory = torch.randn(3, 7, 16, generator=gen) if mode == "cross" else None
    n_keys = 7 if mode == "cross" else 6
    pad = torch.zeros(3, n_keys, dtype=torch.bool)
    pad[0, :2] = True  # left padding: under a causal mask, queries 0-1 of row 0 see no key
    pad[1, -1] = True
    pad[2, :] = mode == "cross"  # a cross row with every key padded
    for (kv, window, qk_norm), padded in itertools.product(OPTIONS, [False, True]):
        options = {"n_kv_heads": kv, "window": window}
        if qk_norm is not None:
            options["qk_norm"] = {"kind": qk_norm["kind"]}
            options["qk_norm_scope"] = "projection" if "scope" in qk_norm else "head"
        torch.manual_seed(0)
        naive = make(16, 4, mode == "causal", POSITIONS[positional], impl="naive", **options)
        sdpa = make(16, 4, mode == "causal", POSITIONS[positional], impl="sdpa", **options)
        sdpa.load_state_dict(naive.state_dict())
        kw = {"key_padding_mask": pad} if padded else {}
        ref = outputs_and_grads(naive, x, memory, kw)
        fast = outputs_and_grads(sdpa, x, memory, kw)
        where = f"{positional} {mode} {options} padded={padded}"
        torch.testing.assert_close(fast[0], ref[0], atol=1e-5, rtol=1e-4, msg=where)
        assert torch.isfinite(ref[0]).all(), where
        for name in ref[1]:
            assert torch.isfinite(ref[1][name]).all(), f"{where} {name}"
            torch.testing.assert_close(fast[1][name], ref[1][name], atol=1e-5, rtol=1e-4,
                                       msg=f"{where} {name}")


def test_cross_attention_ignores_rotary_and_alibi():
    x, memory = torch.randn(2, 4, 16), torch.randn(2, 5, 16)
    torch.manual_seed(0)
    plain = make(16, 4, causal=False)
    for positions in (RotaryPositions(), ALiBiPositions()):
        att = make(16, 4, causal=False, positions=positions)
        att.load_state_dict(plain.state_dict())
        torch.testing.assert_close(att(x, memory=memory), plain(x, memory=memory))
        assert not torch.allclose(att(x), plain(x))  # self-attention does apply them


# -- validation ---------------------------------------------------------------------------
def test_n_kv_heads_that_does_not_divide_n_heads_is_a_located_error(tiny):
    with pytest.raises(vl.SpecError) as info:
        vl.parse_model_spec({**tiny, "attention": {"kind": "mha", "n_kv_heads": 3}}, REG)
    (issue,) = info.value.issues
    assert issue.loc == ("attention", "n_kv_heads")
    assert "n_kv_heads=3 does not divide n_heads=4; choose one of 1, 2, 4" in issue.message


def test_bad_qk_norm_kind_is_a_located_error(tiny):
    with pytest.raises(vl.SpecError) as info:
        vl.parse_model_spec({**tiny, "attention": {"kind": "mha", "qk_norm": {"kind": "rsm"}}}, REG)
    assert info.value.issues[0].loc[:2] == ("attention", "qk_norm")
    assert "did you mean 'rms'?" in str(info.value)


def test_validate_command_points_at_the_yaml_line(tmp_path):
    from click.testing import CliRunner
    from test_experiment import exp

    from variantlab.cli.main import main

    path = tmp_path / "exp.yaml"
    text = exp("measure:\n  params: {}\n").replace(
        "  activation:", "  attention: {kind: mha, n_kv_heads: 3}\n  activation:")
    path.write_text(text)
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    line = text.splitlines().index("  attention: {kind: mha, n_kv_heads: 3}") + 1
    assert f"{path}:{line}:" in result.output and "n_kv_heads=3 does not divide" in result.output


def test_qk_norm_spec_round_trips(tiny):
    spec = vl.parse_model_spec({**tiny, "attention": {
        "kind": "mha", "qk_norm": {"kind": "rms", "eps": 1e-6}, "qk_norm_scope": "projection"}}, REG)
    assert spec.attention.qk_norm.kind == "rms" and spec.attention.qk_norm.eps == 1e-6
    assert vl.parse_model_spec(spec.to_data(), REG) == spec
    assert vl.parse_model_spec({**tiny, "attention": {"kind": "mha", "qk_norm": "none"}}, REG
                               ).attention.qk_norm is None


def test_llama_style_model_builds_with_the_expected_parameters(tiny):
    spec = {**tiny, "positional": "rotary", "norm": "rms", "attention": {
        "kind": "mha", "n_kv_heads": 2, "qk_norm": {"kind": "rms"}, "impl": "sdpa"}}
    model = vl.build_model(spec, REG)
    att = model.trf_blocks[0].att.sublayer
    assert att.W_key.weight.shape == (16, 32) and att.q_norm.scale.shape == (8,)
    idx = torch.randint(0, 64, (2, 8))
    model(idx).sum().backward()
    assert all(p.grad is not None for p in model.parameters())
