"""Chunked local attention (mha ``chunk``, Llama 4) and the parameter-free QK L2 norm
(issue 29.1, 29.3): each query sees exactly the keys of its own chunk up to itself (chunks
counted from the first real token under left padding), sdpa equals naive in float64, the
l2 norm is x / sqrt(mean x^2 + eps) and commutes with rotary."""

import pytest
import torch

import variantlab as vl
from variantlab_plugins.rotary import RotaryPositions

REG = vl.get_registry()


def model_with(positional="rotary", **attention):
    spec = {"family": "gpt", "vocab_size": 64, "context_length": 32, "emb_dim": 32, "n_heads": 4,
            "n_layers": 2, "drop_rate": 0.0, "positional": positional,
            "attention": {"kind": "mha", "chunk": 3, **attention}}
    torch.manual_seed(0)
    return vl.build_model(spec, REG)


def test_a_query_sees_its_chunk_only():
    att = model_with().trf_blocks[0].att.sublayer.eval()
    x = torch.randn(1, 8, 32)
    with torch.no_grad():
        base = att(x)
        for j in range(8):  # change key j: only queries of j's chunk at or after j move
            y = x.clone()
            y[:, j] += 5.0
            moved = (att(y) - base).abs().amax(-1)[0] > 1e-6  # (T,)
            expected = torch.tensor([i >= j and i // 3 == j // 3 for i in range(8)])
            assert torch.equal(moved, expected), j


@pytest.mark.parametrize("positional", ["rotary", "learned"])
@pytest.mark.parametrize("impl", ["naive", "sdpa"])
def test_chunks_count_from_the_first_real_token(positional, impl):
    """Under left padding, with rotary (the positions come with position_ids) and with
    learned positions (no position_ids reach the attention: the chunks are counted from the
    padding mask), for both implementations (issue 38: only rotary was tested)."""
    model = model_with(positional, impl=impl).eval()
    idx = torch.randint(0, 64, (1, 7))
    padded = torch.cat([torch.zeros(1, 2, dtype=torch.long), idx], 1)
    mask = torch.ones(1, 9, dtype=torch.long)
    mask[0, :2] = 0
    with torch.no_grad():
        assert (model(padded, attention_mask=mask)[:, 2:] - model(idx)).abs().max().item() < 1e-5


def test_sdpa_equals_naive_in_float64():
    naive = model_with(n_kv_heads=2, qk_norm={"kind": "l2"}).double()
    fused = model_with(n_kv_heads=2, qk_norm={"kind": "l2"}, impl="sdpa").double()
    fused.load_state_dict(naive.state_dict())
    idx = torch.randint(0, 64, (2, 10))
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, :4] = 0
    a, b = naive(idx, attention_mask=mask), fused(idx, attention_mask=mask)
    assert (a - b)[mask.bool()].abs().max().item() < 1e-10


def test_l2_norm_is_a_scale_free_rms_and_commutes_with_rotary():
    norm = model_with(qk_norm={"kind": "l2", "eps": 1e-6}).trf_blocks[0].att.sublayer.q_norm
    assert not list(norm.parameters())
    x = torch.randn(2, 4, 5, 8, dtype=torch.float64)
    ref = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert (norm(x) - ref).abs().max().item() < 1e-14
    rope = RotaryPositions(theta=100.0)
    q_then, _ = rope.rotate(norm(x), norm(x))
    q_first = norm(rope.rotate(x, x)[0])
    assert (q_then - q_first).abs().max().item() < 1e-6  # float32 angles
