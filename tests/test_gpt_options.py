"""The gpt options the GPT-2-era imports added (issue 41.2): ``embedding_norm`` (BLOOM),
``head_bias`` (GPT-J), ``token_dim`` (OPT-350m) and the learned positional's ``offset`` (OPT):
off by default and left out of a spec's data then (so earlier specs keep their unit keys),
and each computing exactly what it says, checked against the model's parts run by hand."""

import torch
import yaml
from conftest import TINY_MODEL

import variantlab as vl

REG = vl.get_registry()
BASE = dict(yaml.safe_load(TINY_MODEL), drop_rate=0.0)


def build(**extra):
    torch.manual_seed(0)
    spec = vl.parse_model_spec({**BASE, **extra}, REG)
    return spec, vl.build_model(spec, REG).eval()


def test_off_by_default_and_left_out_of_the_data():
    spec, model = build()
    assert not spec.embedding_norm and not spec.head_bias and spec.token_dim is None
    assert spec.positional.offset == 0
    data = spec.to_data()
    assert not {"embedding_norm", "head_bias", "token_dim"} & set(data)
    assert "offset" not in data["positional"]
    assert model.embed_norm is None and model.project_out is None
    assert model.out_head.bias is None and model.embed.project_in is None
    spec, _ = build(embedding_norm=True, head_bias=True, token_dim=16,
                    positional={"kind": "learned", "offset": 2})
    data = spec.to_data()
    assert (data["embedding_norm"], data["head_bias"], data["token_dim"]) == (True, True, 16)
    assert data["positional"]["offset"] == 2


def by_hand(spec, model, idx):
    """The logits of ``model`` (learned positions) computed from its parts."""
    x = model.embed.tok_emb(idx)
    if model.embed.project_in is not None:
        x = model.embed.project_in(x)
    offset = spec.positional.offset  # position p reads row p + offset
    x = x + model.embed.pos_emb.pos_emb.weight[offset:offset + idx.shape[1]]
    if model.embed_norm is not None:
        x = model.embed_norm(x)
    for block in model.trf_blocks:
        x = block(x)
    x = model.final_norm(x)
    if model.project_out is not None:
        x = model.project_out(x)
    return x @ model.out_head.weight.t() + (0 if model.out_head.bias is None
                                             else model.out_head.bias)


def test_each_option_computes_what_it_says():
    idx = torch.randint(0, 64, (2, 9))
    for extra in ({"embedding_norm": True}, {"head_bias": True}, {"token_dim": 16},
                  {"token_dim": 16, "tie_weights": True},
                  {"positional": {"kind": "learned", "offset": 3}}):
        spec, model = build(**extra)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.1)
            assert torch.allclose(model(idx), by_hand(spec, model, idx), atol=1e-6), extra
    _, model = build(token_dim=16, tie_weights=True)
    assert model.out_head.weight is model.embed.tok_emb.weight
    assert model.embed.tok_emb.weight.shape == (64, 16)
    _, model = build(positional={"kind": "learned", "offset": 3})
    assert model.embed.pos_emb.pos_emb.weight.shape[0] == 32 + 3
