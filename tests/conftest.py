"""Shared fixtures: tiny models (emb_dim 32, 2 layers) keep the suite fast."""

import warnings

import pytest
import torch

TINY = {
    "family": "gpt",
    "vocab_size": 64,
    "context_length": 32,
    "emb_dim": 32,
    "n_heads": 4,
    "n_layers": 2,
    "drop_rate": 0.0,
}


@pytest.fixture
def tiny() -> dict:
    """A tiny GPT spec mapping; copy and edit freely."""
    return dict(TINY)


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        yield
