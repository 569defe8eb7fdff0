"""Issue 9, item 3: padding masks. A query that may see no key gives finite (zero) outputs
and finite gradients in every attention kind and implementation; the gpt family's forward
takes a Hugging Face-style ``attention_mask`` and a padded row's real tokens get the outputs
of the unpadded sequence."""

import pytest
import torch

import variantlab as vl
from variantlab_plugins.rotary import ALiBiPositions, RotaryPositions

REG = vl.get_registry()
IMPLS = ["naive", "sdpa"]


def attentions():
    """Every registered attention kind, with each implementation it offers; the causal-only
    sequence mixers (no scores, no cross-attention) are checked by the conformance kit."""
    for kind in REG.kinds("attention"):
        comp = REG.get("attention", kind)
        if getattr(comp.spec_cls, "causal_only", False):
            continue
        impls = IMPLS if "impl" in comp.spec_cls.model_fields else [None]
        for impl in impls:
            yield kind, impl


@pytest.mark.parametrize("kind, impl", list(attentions()))
@pytest.mark.parametrize("positions", [None, RotaryPositions(), ALiBiPositions()],
                         ids=["plain", "rotary", "alibi"])
def test_fully_masked_query_rows_are_finite(kind, impl, positions):
    comp = REG.get("attention", kind)
    spec = comp.spec_cls.model_validate({"impl": impl} if impl else {})
    att = comp.build(spec, emb_dim=16, n_heads=4, context_length=8, drop_rate=0.0,
                     qkv_bias=True, causal=True, positions=positions)
    x = torch.randn(2, 5, 16, requires_grad=True)
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[0, :3] = True  # left padding: queries 0-2 of row 0 see no key under the causal mask
    out = att(x, key_padding_mask=pad)
    assert torch.isfinite(out).all()
    # no key, no attention: the context is zero, so the output is the out_proj bias
    torch.testing.assert_close(out[0, :3], att.out_proj.bias.expand(3, 16))
    (out * torch.randn_like(out)).sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in att.parameters())
    assert torch.equal(x.grad[0, :3], torch.zeros(3, 16))  # nothing flows from dead rows
    # cross-attention with every key of a row padded
    memory = torch.randn(2, 4, 16, requires_grad=True)
    all_pad = torch.zeros(2, 4, dtype=torch.bool)
    all_pad[1] = True
    att.causal = False
    cross = att(x, memory=memory, key_padding_mask=all_pad)
    cross.sum().backward()
    assert torch.isfinite(cross).all() and torch.isfinite(memory.grad).all()


def left_pad(idx, n, pad_id=0):
    """Prepend n pad tokens to (1, T) ids; the (1, T + n) attention mask with it."""
    padded = torch.cat([torch.full((1, n), pad_id), idx], dim=1)
    mask = torch.cat([torch.zeros(1, n, dtype=torch.long), torch.ones_like(idx)], dim=1)
    return padded, mask


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("positional", ["learned", "sinusoidal", "rotary", "alibi", "none"])
def test_padded_rows_equal_the_unpadded_sequences(tiny, impl, positional):
    spec = {**tiny, "positional": positional,
            "attention": {"kind": "mha", "impl": impl, "n_kv_heads": 2}}
    model = vl.build_model(spec, REG).eval()
    a, b = torch.randint(1, 64, (1, 6)), torch.randint(1, 64, (1, 4))
    ref_a, ref_b = model(a), model(b)
    b_left, b_mask = left_pad(b, 2, pad_id=5)  # left padding (generation style)
    b_right = torch.cat([b, torch.full((1, 2), 7)], dim=1)  # right padding (training style)
    idx = torch.cat([a, b_left, b_right])  # (3, 6)
    mask = torch.cat([torch.ones(1, 6, dtype=torch.long), b_mask,
                      torch.tensor([[1, 1, 1, 1, 0, 0]])])
    out = model(idx, attention_mask=mask)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[0], ref_a[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[1, 2:], ref_b[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[2, :4], ref_b[0], atol=1e-5, rtol=1e-5)


def test_mask_of_ones_changes_nothing_and_gradients_stay_finite(tiny):
    model = vl.build_model({**tiny, "positional": "rotary"}, REG)
    idx = torch.randint(0, 64, (2, 7))
    torch.testing.assert_close(model(idx, attention_mask=torch.ones(2, 7)), model(idx))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[0, :4] = 0
    out = model(idx, attention_mask=mask)
    out.logsumexp(-1).sum().backward()  # pads included: their gradients must stay finite
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("t, s, causal, window", [(8, 8, True, None), (8, 8, True, 3),
                                                  (8, 8, False, 2), (4, 8, True, None),
                                                  (8, 4, True, None), (5, 5, False, None)])
def test_shared_masks_equal_masks_made_each_call(t, s, causal, window):
    """mask_and_dead gives what attend_mask and dead_rows make (dead rows included, as a
    causal mask with fewer keys than queries has), one shared pair per shape; made inside
    inference mode, it can still be saved for backward after."""
    from variantlab_plugins.masks import _order_mask, attend_mask, dead_rows, mask_and_dead

    _order_mask.cache_clear()
    fresh = attend_mask(t, s, causal, window, None, torch.device("cpu"))
    with torch.inference_mode():
        shared, dead = mask_and_dead(t, s, causal, window, None, torch.device("cpu"))
    if fresh is None:
        assert shared is None and dead is None
        return
    assert torch.equal(shared, fresh) and not shared.is_inference()
    want = dead_rows(fresh)
    assert (dead is None) == (want is None) and (want is None or torch.equal(dead, want))
    again = mask_and_dead(t, s, causal, window, None, torch.device("cpu"))
    assert again[0] is shared  # made once
    scores = torch.randn(t, s, requires_grad=True)
    torch.where(shared, scores, 0.0).sum().backward()  # saved for backward: no error
    padded = torch.zeros(2, s, dtype=torch.bool)
    padded[0, 0] = True
    with_pads, _ = mask_and_dead(t, s, causal, window, padded, torch.device("cpu"))
    assert torch.equal(with_pads, attend_mask(t, s, causal, window, padded, torch.device("cpu")))


def test_the_shared_mask_is_not_used_while_compiling(monkeypatch):
    from variantlab_plugins import masks

    masks._order_mask.cache_clear()
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    allowed, dead = masks.mask_and_dead(6, 6, True, None, None, torch.device("cpu"))
    assert masks._order_mask.cache_info().currsize == 0
    assert torch.equal(allowed, torch.ones(6, 6, dtype=torch.bool).tril())
    assert dead is not None and not dead.any()  # kept in the graph, no row dead
