"""variantlab_plugins/blocks.py by exact values (issue 30, mutation triage): layer tags
counted from 0, Gemma's embedding scale, position ids reaching the positional slot, and the
decoder layer's causal self-attention beside its non-causal cross-attention. Expected values
are computed from the weights by hand, never through the block under test."""

import types

import conftest
import pytest
import torch
from torch import nn

import variantlab as vl
from variantlab.model.build import Parts
from variantlab_plugins.blocks import DecoderBlock, TokenEmbedding

REG = vl.get_registry()
TINY = dict(conftest.TINY)


def test_blocks_are_tagged_with_their_layer_counted_from_zero():
    model = vl.build_model(TINY, REG)
    assert [b.variantlab_layer for b in model.trf_blocks] == [0, 1]
    encdec = vl.build_model({**TINY, "family": "encoder_decoder"}, REG)
    assert [b.variantlab_layer for b in encdec.encoder.layers] == [0, 1]
    assert [b.variantlab_layer for b in encdec.decoder.layers] == [2, 3]


def test_scaled_embeddings_are_the_token_rows_times_sqrt_emb_dim():
    torch.manual_seed(0)
    model = vl.build_model({**TINY, "scale_embeddings": True}, REG).eval()
    idx = torch.tensor([[3, 0, 63, 7]])
    tok = model.embed.tok_emb.weight[idx[0]]  # (T, D)
    pos = model.embed.pos_emb.pos_emb.weight[:4]  # learned positions 0..3
    want = tok * 32 ** 0.5 + pos
    torch.testing.assert_close(model.embed(idx)[0], want, atol=1e-6, rtol=1e-6)


def test_position_ids_reach_the_learned_positions():
    torch.manual_seed(1)
    model = vl.build_model(TINY, REG).eval()
    idx = torch.tensor([[5, 9, 2]])
    ids = torch.tensor([[7, 3, 0]])
    tok = model.embed.tok_emb.weight[idx[0]]
    rows = model.embed.pos_emb.pos_emb.weight
    torch.testing.assert_close(model.embed(idx, position_ids=ids)[0], tok + rows[[7, 3, 0]])
    torch.testing.assert_close(model.embed(idx)[0], tok + rows[:3])


class PlusOne(nn.Module):
    """A positional plugin that is not a ``Positions``: its forward takes the embeddings only."""

    def forward(self, x):
        return x + 1.0


def test_a_plain_positional_module_is_called_without_position_ids():
    parts = types.SimpleNamespace(positional=PlusOne)
    torch.manual_seed(2)
    embed = TokenEmbedding(parts, vocab_size=10, emb_dim=4, drop_rate=0.0).eval()
    idx = torch.tensor([[1, 2]])
    out = embed(idx, position_ids=torch.tensor([[4, 5]]))
    torch.testing.assert_close(out[0], embed.tok_emb.weight[[1, 2]] + 1.0)


def test_decoder_self_attention_is_causal_and_cross_attention_sees_all_memory():
    torch.manual_seed(3)
    model = vl.build_model({**TINY, "family": "decoder"}, REG).eval()
    layer = model.decoder.layers[0]
    x, memory = torch.randn(1, 5, 32), torch.randn(1, 6, 32)
    with torch.no_grad():
        out = layer(x, memory)
        later = x.clone()
        later[:, 3:] = torch.randn(1, 2, 32)  # change the last two target positions
        torch.testing.assert_close(layer(later, memory)[:, :3], out[:, :3])
        mem_end = memory.clone()
        mem_end[:, -1] += 5.0  # change only the last memory position
        moved = (layer(x, mem_end) - out)[0].abs().amax(-1)  # (T,)
    assert (moved > 1e-3).all()  # every query, the first included, attends to it


def test_a_block_scope_residual_is_refused_in_a_decoder_layer():
    spec = vl.parse_model_spec({**TINY, "residual": "parallel"}, REG)
    with pytest.raises(ValueError, match="a decoder layer has three sublayers"):
        DecoderBlock(Parts(spec, REG))
