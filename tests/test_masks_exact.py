"""variantlab_plugins/masks.py by exact values (issue 30, mutation triage): every
``attend_mask`` combination (causal, sliding window, padded keys, T != S) against a mask
written out query by query, and ``dead_rows`` on live, dead and meta-device masks."""

import pytest
import torch

from variantlab_plugins.masks import attend_mask, dead_rows, masked_scores

CPU = torch.device("cpu")


def by_hand(t: int, s: int, causal: bool, window: int | None) -> torch.Tensor:
    """(T, S): True where query i may see key j, one pair at a time."""
    rows = []
    for i in range(t):
        row = []
        for j in range(s):
            ok = j <= i if causal else True
            if window is not None:
                ok = ok and (i - j < window if causal else abs(i - j) < window)
            row.append(ok)
        rows.append(row)
    return torch.tensor(rows)


@pytest.mark.parametrize("t, s", [(5, 5), (3, 6), (6, 3)])
@pytest.mark.parametrize("causal, window", [(True, None), (True, 1), (True, 2), (False, 2),
                                            (False, 3)])
def test_attend_mask_equals_the_rule_written_out(t, s, causal, window):
    got = attend_mask(t, s, causal, window, None, CPU)
    assert got.dtype == torch.bool and torch.equal(got, by_hand(t, s, causal, window))


def test_no_rule_and_no_padding_is_none():
    assert attend_mask(4, 4, False, None, None, CPU) is None


def test_padded_keys_alone_and_with_the_causal_rule():
    pad = torch.tensor([[False, False, True], [True, False, False]])  # (B, S), True: padded
    alone = attend_mask(2, 3, False, None, pad, CPU)
    assert alone.shape == (2, 1, 1, 3)
    assert torch.equal(alone[:, 0, 0], ~pad)
    both = attend_mask(3, 3, True, None, pad.long(), CPU)  # an int mask counts as bool
    assert both.shape == (2, 1, 3, 3)
    for b in range(2):
        want = by_hand(3, 3, True, None) & ~pad[b][None, :]
        assert torch.equal(both[b, 0], want)


def test_dead_rows_are_the_queries_that_see_no_key():
    assert dead_rows(None) is None
    assert dead_rows(by_hand(4, 4, True, None)) is None  # every query sees itself
    allowed = torch.tensor([[[[False, False], [True, False], [False, False]]]])  # (1, 1, 3, 2)
    dead = dead_rows(allowed)
    assert dead.shape == (1, 1, 3, 1)
    assert dead.flatten().tolist() == [True, False, True]


def test_dead_rows_on_the_meta_device_keep_the_mask_without_reading_values():
    allowed = torch.ones(2, 1, 4, 4, dtype=torch.bool, device="meta")
    dead = dead_rows(allowed)
    assert dead is not None and dead.device.type == "meta" and dead.shape == (2, 1, 4, 1)


@pytest.mark.parametrize("padded", [False, True])
def test_masked_scores_are_masked_fill_bit_for_bit_with_the_same_gradient(padded):
    """The naive attentions' added 0 / -inf mask gives masked_fill's exact scores and,
    through softmax, the same weights and score gradients (-0.0 and 0.0 compare equal);
    dead rows (padded queries) are let see every key first, as the attentions do."""
    torch.manual_seed(0)
    pad = torch.tensor([[False] * 6, [True, True, False, False, False, False]])
    allowed = attend_mask(6, 6, True, 3, pad if padded else None, CPU)
    dead = dead_rows(allowed)
    assert (dead is not None) == padded
    allowed = allowed if dead is None else allowed | dead
    scores = (torch.randn(2, 3, 6, 6) * 4).requires_grad_()
    ref = scores.masked_fill(~allowed, -torch.inf)
    got = masked_scores(scores, allowed)
    assert torch.equal(got, ref)
    full = allowed.expand(2, 3, 6, 6)
    assert torch.equal(got[full], scores.detach()[full]) and (got[~full] == -torch.inf).all()
    g = torch.randn(2, 3, 6, 6)
    (want,) = torch.autograd.grad(torch.softmax(ref, -1), scores, g)
    (have,) = torch.autograd.grad(torch.softmax(got, -1), scores, g)
    assert torch.equal(have, want)
