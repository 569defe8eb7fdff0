"""Which keys each query may attend to: causal order, a sliding window, padded keys."""

from __future__ import annotations

import functools

import torch


def attend_mask(t: int, s: int, causal: bool, window: int | None,
                key_padding_mask: torch.Tensor | None, device: torch.device
                ) -> torch.Tensor | None:
    """Bool mask, True where query i may attend to key j: (T, S), (B, 1, T, S), or None when
    every query sees every key. ``key_padding_mask`` (B, S) is True at padded keys."""
    allowed = None
    if causal or window is not None:
        i = torch.arange(t, device=device)[:, None]  # (T, 1)
        j = torch.arange(s, device=device)[None, :]  # (1, S)
        allowed = j <= i if causal else torch.ones(t, s, dtype=torch.bool, device=device)
        if window is not None:
            near = (i - j < window) if causal else ((i - j).abs() < window)  # (T, S)
            allowed = allowed & near
    if key_padding_mask is not None:
        keep = ~key_padding_mask.bool()[:, None, None, :]  # (B, 1, 1, S)
        allowed = keep if allowed is None else allowed & keep  # (B, 1, T, S)
    return allowed


def masked_scores(scores: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """``scores.masked_fill(~allowed, -inf)``, as an added mask of 0 and -inf: the same bits
    wherever the scores are finite (x + 0 is x; a score of +inf at a masked key gives NaN
    here, -inf there, and such a run has diverged already). On CPU it takes a fifth of
    masked_fill's time on (B, H, T, S) scores, and its backward is no op at all; every naive
    attention masks its scores here."""
    return scores + torch.where(allowed, 0.0, -torch.inf).to(scores.dtype)


def dead_rows(allowed: torch.Tensor | None) -> torch.Tensor | None:
    """(.., T, 1) True at queries that may attend to no key (a left-padded row's pads under a
    causal mask), or None when there are none. Softmax over no key is 0/0; the attentions
    give such queries a zero output instead, with zero (finite) gradients."""
    if allowed is None:
        return None
    dead = ~allowed.any(dim=-1, keepdim=True)  # (.., T, 1)
    if dead.device.type == "meta" or torch.compiler.is_compiling():
        # no values to look at (the size guard's meta forward), or a data-dependent branch
        # that would break torch.compile's graph: keep the mask, where no row is dead it
        # changes nothing
        return dead
    return dead if bool(dead.any()) else None


def mask_and_dead(t: int, s: int, causal: bool, window: int | None,
                  key_padding_mask: torch.Tensor | None, device: torch.device
                  ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(attend_mask(...), dead_rows(of it))``. Without padded keys both depend on the
    shapes alone: they are made once per (t, s, causal, window, device) and shared by every
    later call (nothing writes them in place), where each forward made them again (2 aranges,
    a comparison and two reductions a layer: about 26 ms of a 100-step unit of the throughput
    sweep, benchmarks/throughput.md). Under torch.compile they are made in the graph, as before."""
    if key_padding_mask is not None or torch.compiler.is_compiling():
        allowed = attend_mask(t, s, causal, window, key_padding_mask, device)
        return allowed, dead_rows(allowed)
    return _order_mask(t, s, causal, window, torch.device(device))


@functools.lru_cache(maxsize=64)
def _order_mask(t: int, s: int, causal: bool, window: int | None, device: torch.device
                ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    with torch.inference_mode(False):  # made in inference mode, autograd could not save it
        allowed = attend_mask(t, s, causal, window, None, device)
        return allowed, dead_rows(allowed)
