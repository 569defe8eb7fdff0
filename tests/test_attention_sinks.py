"""Attention sinks (issue 29.1, 29.3): mha's ``sinks`` (gpt-oss) equal to an explicit per-query
softmax with the sink's logit in the denominator, the fused (sdpa) form equal to the naive one
in float64 with windows, grouped heads, ALiBi and left padding, the init (zeros: softmax off by
one) and what a sink does (a large one lets a head attend to nothing)."""

import pytest
import torch

import variantlab as vl

REG = vl.get_registry()


def model_with(positional="rotary", **attention):
    spec = {"family": "gpt", "vocab_size": 64, "context_length": 32, "emb_dim": 32, "n_heads": 4,
            "n_layers": 2, "drop_rate": 0.0, "qkv_bias": True, "positional": positional,
            "attention": {"kind": "mha", "sinks": True, **attention}}
    torch.manual_seed(0)
    return vl.build_model(spec, REG)


@pytest.mark.parametrize("positional, options", [
    ("rotary", {"n_kv_heads": 2, "window": 3}),
    ("alibi", {}),
    ("learned", {"scale": 0.2}),
])
def test_sdpa_equals_naive_in_float64(positional, options):
    naive = model_with(positional, **options).double()
    with torch.no_grad():
        for layer in naive.trf_blocks:
            layer.att.sublayer.sinks.copy_(torch.randn(4, dtype=torch.float64))
    fused = model_with(positional, impl="sdpa", **options).double()
    fused.load_state_dict(naive.state_dict())
    idx = torch.randint(0, 64, (3, 9))
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, :5] = 0
    outs = []
    for model in (naive, fused):
        out = model(idx, attention_mask=mask)[mask.bool()]
        out.square().sum().backward()
        outs.append((out, torch.cat([p.grad.flatten() for p in model.parameters()])))
    assert (outs[0][0] - outs[1][0]).abs().max().item() < 1e-10
    assert (outs[0][1] - outs[1][1]).abs().max().item() < 1e-9


def test_naive_equals_a_per_query_softmax_with_the_sink():
    model = model_with("learned").double().eval()
    att = model.trf_blocks[0].att.sublayer
    with torch.no_grad():
        att.sinks.copy_(torch.tensor([-1.0, 0.0, 0.5, 3.0], dtype=torch.float64))
    x = torch.randn(1, 6, 32, dtype=torch.float64)
    q = (x[0] @ att.W_query.weight.T + att.W_query.bias).view(6, 4, 8)
    k = (x[0] @ att.W_key.weight.T + att.W_key.bias).view(6, 4, 8)
    v = (x[0] @ att.W_value.weight.T + att.W_value.bias).view(6, 4, 8)
    rows = []
    for i in range(6):
        heads = []
        for h in range(4):
            scores = torch.stack([q[i, h] @ k[j, h] / 8 ** 0.5 for j in range(i + 1)])
            e = torch.exp(scores)
            weights = e / (e.sum() + torch.exp(att.sinks[h]))  # the sink takes mass, no value
            heads.append(weights @ v[: i + 1, h])
        rows.append(torch.cat(heads))
    ref = torch.stack(rows) @ att.out_proj.weight.T + att.out_proj.bias
    with torch.no_grad():
        assert (att(x)[0] - ref).abs().max().item() < 1e-12


def test_sinks_start_at_zero_and_a_large_sink_empties_the_head():
    model = model_with("learned").eval()
    att = model.trf_blocks[0].att.sublayer
    assert torch.equal(att.sinks, torch.zeros(4))
    x = torch.randn(2, 7, 32)
    with torch.no_grad():
        att.sinks.fill_(50.0)  # every head gives its mass to the sink
        out = att(x)
    assert (out - att.out_proj.bias).abs().max().item() < 1e-6


def test_without_sinks_the_spec_data_is_unchanged():
    spec = vl.parse_model_spec({"family": "gpt", "attention": {"kind": "mha"}}, REG)
    assert "sinks" not in spec.to_data()["attention"]
