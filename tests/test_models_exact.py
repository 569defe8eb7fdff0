"""The families' modules (``variantlab_plugins/models.py``) wired as their docs say: which
stacks are causal, Gemma's embedding scale and logit soft-cap by formula, tied and shared
embedding matrices, a left-padded row equal to the unpadded sequence (learned and rotary
positions), layer numbering across encoder and decoder, and the deep MLP's widths and
shortcuts (docs/mutation.md, models.py). Tiny models: emb_dim 32, 2 layers."""

import math

import pytest
import torch
from conftest import TINY

import variantlab as vl
from variantlab_plugins.residuals import PreNorm

REG = vl.get_registry()


def build(seed: int = 0, **changes) -> torch.nn.Module:
    torch.manual_seed(seed)
    return vl.build_model({**TINY, **changes}, REG).eval()


def first_block_input(model: torch.nn.Module, idx: torch.Tensor) -> torch.Tensor:
    seen = []
    handle = model.trf_blocks[0].register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    model(idx)
    handle.remove()
    return seen[0]


def changes_at_the_first_position(run, idx: torch.Tensor) -> bool:
    """Whether the output at position 0 moves when the last token changes."""
    later = idx.clone()
    later[:, -1] = (later[:, -1] + 1) % TINY["vocab_size"]
    return not torch.allclose(run(idx)[:, 0], run(later)[:, 0], atol=1e-6)


def test_gpt_is_causal_and_the_encoder_is_not():
    idx = torch.randint(0, TINY["vocab_size"], (2, 6))
    assert not changes_at_the_first_position(build(), idx)
    encoder = build(family="encoder")
    assert changes_at_the_first_position(encoder, idx)
    assert changes_at_the_first_position(encoder.encoder, idx)  # its own stack's output
    block = build(family="block", causal_attention=True)
    x = torch.randn(2, 6, 32)
    assert torch.equal(block(x), block.block(x))
    later = x.clone()
    later[:, -1] += 1.0
    torch.testing.assert_close(block(x)[:, 0], block(later)[:, 0])


def test_gemma_scales_the_embeddings_by_sqrt_emb_dim_and_soft_caps_the_logits():
    idx = torch.randint(0, TINY["vocab_size"], (2, 5))
    rotary = {"positional": "rotary"}  # adds nothing to the embeddings
    plain, scaled = build(**rotary), build(scale_embeddings=True, **rotary)
    torch.testing.assert_close(first_block_input(scaled, idx),
                               first_block_input(plain, idx) * math.sqrt(32))
    raw = plain(idx)
    capped = build(logit_softcap=0.5, **rotary)(idx)
    assert raw.abs().max() > 0.5  # the cap bites
    torch.testing.assert_close(capped, 0.5 * torch.tanh(raw / 0.5))


@pytest.mark.parametrize("family", ["gpt", "encoder", "decoder"])
def test_tied_weights_share_the_token_embedding_and_untied_do_not(family):
    tied, untied = build(family=family, tie_weights=True), build(family=family)
    stack = {"gpt": lambda m: m, "encoder": lambda m: m.encoder,
             "decoder": lambda m: m.decoder}[family]
    assert tied.out_head.weight is stack(tied).embed.tok_emb.weight
    assert untied.out_head.weight is not stack(untied).embed.tok_emb.weight


@pytest.mark.parametrize(("share", "tie", "encoder_decoder", "decoder_out"), [
    (True, False, True, True), (False, True, False, True), (False, False, False, False)])
def test_encoder_decoder_sharing(share, tie, encoder_decoder, decoder_out):
    model = build(family="encoder_decoder", share_embeddings=share, tie_weights=tie)
    enc, dec = model.encoder.embed.tok_emb.weight, model.decoder.embed.tok_emb.weight
    assert (enc is dec) == encoder_decoder
    assert (model.out_head.weight is dec) == decoder_out


def test_layers_are_numbered_through_encoder_and_decoder():
    model = build(family="encoder_decoder")
    assert [b.variantlab_layer for b in model.encoder.layers] == [0, 1]
    assert [b.variantlab_layer for b in model.decoder.layers] == [2, 3]
    assert [b.variantlab_layer for b in build(family="encoder").encoder.layers] == [0, 1]
    assert [b.variantlab_layer for b in build(family="decoder").decoder.layers] == [0, 1]
    assert [b.variantlab_layer for b in build().trf_blocks] == [0, 1]


def test_the_decoder_runs_every_layer():
    """Its output is the final norm of its layers applied in order (each with the memory)."""
    model = build(family="decoder")
    idx, memory = torch.randint(0, TINY["vocab_size"], (2, 5)), torch.randn(2, 3, 32)
    x = model.decoder.embed(idx)
    for layer in model.decoder.layers:
        x = layer(x, memory, None, None)
    torch.testing.assert_close(model(idx, memory), model.out_head(model.decoder.norm(x)))
    # and the encoder's: its layers in order, then its norm
    encoder = build(family="encoder").encoder
    x = encoder.embed(idx)
    for layer in encoder.layers:
        x = layer(x, key_padding_mask=None)
    torch.testing.assert_close(encoder(idx), encoder.norm(x))


@pytest.mark.parametrize("positional", ["learned", "rotary"])
def test_a_left_padded_row_gives_the_unpadded_sequences_outputs(positional):
    model = build(positional=positional)
    tokens = torch.tensor([[5, 9, 2, 7]])
    padded = torch.tensor([[0, 0, 5, 9, 2, 7], [3, 1, 4, 1, 5, 9]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    out = model(padded, attention_mask=mask)
    torch.testing.assert_close(out[0, 2:], model(tokens)[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out[1], model(padded[1:])[0], rtol=1e-5, atol=1e-5)
    # a pad between tokens: positions count the real tokens only (rotary's relative
    # distances too, which a left pad alone cannot tell from a shift)
    inner = model(torch.tensor([[5, 0, 9, 2, 7]]), attention_mask=torch.tensor([[1, 0, 1, 1, 1]]))
    torch.testing.assert_close(inner[0, [0, 2, 3, 4]], model(tokens)[0], rtol=1e-5, atol=1e-5)
    # padding that changes nothing the mask hides leaves the real tokens' outputs as they are
    other = padded.clone()
    other[0, :2] = torch.tensor([11, 12])
    torch.testing.assert_close(model(other, attention_mask=mask)[0, 2:], out[0, 2:])


def test_the_deep_mlp_keeps_its_widths_and_shortcuts_only_where_the_width_holds():
    model = build(family="mlp", layer_sizes=[4, 6, 6, 2], residual={"kind": "pre_norm"})
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert [tuple(m.weight.shape) for m in linears] == [(6, 4), (6, 6), (2, 6)]
    residuals = [m for m in model.layers]
    assert all(isinstance(r, PreNorm) for r in residuals)
    assert [r.shortcut for r in residuals] == [False, True, False]
    x = torch.randn(3, 4)
    want = x
    for layer in residuals:
        want = layer(want)
    torch.testing.assert_close(model(x), want)
    assert model(x).shape == (3, 2)
    # a shortcut turned off stays off where the width holds too
    plain = build(family="mlp", layer_sizes=[4, 4, 2], residual={"kind": "pre_norm",
                                                                  "shortcut": False})
    assert [r.shortcut for r in plain.layers] == [False, False]
