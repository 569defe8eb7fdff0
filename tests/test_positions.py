"""Issue 9: rotary and ALiBi against their formulas on hand-sized inputs, the positions
contract (one module, shared by reference), and the validation of unfit pairings."""

import math

import pytest
import torch

import variantlab as vl
from variantlab.model.positions import Positions, accepts, position_ids_from_mask
from variantlab_plugins.rotary import ALiBiPositions, RotaryPositions, alibi_slopes

REG = vl.get_registry()


def rope_by_hand(x, positions, theta, rot):
    """Su et al. 2021, eq. 34, in the rotate_half pairing: dims i and i + rot/2 form a pair
    turned by the angle pos * theta^(-2i/rot); dims from rot on pass unchanged."""
    out = x.clone()
    half = rot // 2
    for t, pos in enumerate(positions):
        for i in range(half):
            angle = pos * theta ** (-2 * i / rot)
            a, b = x[..., t, i], x[..., t, i + half]
            out[..., t, i] = a * math.cos(angle) - b * math.sin(angle)
            out[..., t, i + half] = b * math.cos(angle) + a * math.sin(angle)
    return out


@pytest.mark.parametrize("theta, fraction, head_dim", [(10000.0, 1.0, 4), (100.0, 0.5, 8),
                                                       (10000.0, 0.25, 12)])
def test_rotary_matches_the_formula(theta, fraction, head_dim):
    q = torch.randn(2, 3, 5, head_dim, dtype=torch.float64)
    k = torch.randn(2, 1, 5, head_dim, dtype=torch.float64)
    rope = RotaryPositions(theta, fraction)
    rot = int(head_dim * fraction) // 2 * 2
    q_rot, k_rot = rope.rotate(q, k)
    torch.testing.assert_close(q_rot, rope_by_hand(q, range(5), theta, rot))
    torch.testing.assert_close(k_rot, rope_by_hand(k, range(5), theta, rot))
    if rot < head_dim:
        assert torch.equal(q_rot[..., rot:], q[..., rot:])  # partial rotary: the rest passes


@pytest.mark.parametrize("fraction, head_dim", [(0.25, 12), (0.375, 8), (0.6, 5)])
def test_odd_rotary_count_rounded_up_matches_the_formula(fraction, head_dim):
    """odd_rounding up (Hugging Face's inv_freq over an odd r = int(head_dim * fraction)):
    pairs (i, i + (r+1)/2) turn by pos * theta^(-2i/r), so r + 1 dims rotate."""
    q = torch.randn(1, 2, 6, head_dim, dtype=torch.float64)
    r = int(head_dim * fraction)
    assert r % 2 == 1
    rope = RotaryPositions(500.0, fraction, odd_rounding="up")
    q_rot, _ = rope.rotate(q, q)
    half = (r + 1) // 2
    want = q.clone()
    for t in range(6):
        for i in range(half):
            angle = t * 500.0 ** (-2 * i / r)
            a, b = q[..., t, i], q[..., t, i + half]
            want[..., t, i] = a * math.cos(angle) - b * math.sin(angle)
            want[..., t, i + half] = b * math.cos(angle) + a * math.sin(angle)
    torch.testing.assert_close(q_rot, want)
    assert torch.equal(q_rot[..., r + 1:], q[..., r + 1:])
    down, _ = RotaryPositions(500.0, fraction).rotate(q, q)  # the default: r - 1 dims
    torch.testing.assert_close(down, rope_by_hand(q, range(6), 500.0, r - 1))


def test_odd_rounding_up_past_the_head_is_refused():
    data = {"family": "gpt", "vocab_size": 64, "context_length": 16, "emb_dim": 20,
            "n_heads": 4, "n_layers": 1,
            "positional": {"kind": "rotary", "fraction": 1.0, "odd_rounding": "up"}}
    with pytest.raises(vl.SpecError, match="odd_rounding.*rotates 6 dims, more than"):
        vl.parse_model_spec(data, REG)


def test_rotary_hand_numbers_and_explicit_positions():
    rope = RotaryPositions(theta=10000.0)
    q = torch.tensor([[[[1.0, 0.0, 0.0, 1.0]] * 3]])  # (1, 1, 3, 4)
    out, _ = rope.rotate(q, q)
    # position 1: pair (0, 2) turns by 1 rad, pair (1, 3) by 1/100 rad
    c, s, c2, s2 = math.cos(1), math.sin(1), math.cos(0.01), math.sin(0.01)
    torch.testing.assert_close(out[0, 0, 1], torch.tensor([c, -s2, s, c2]))
    torch.testing.assert_close(out[0, 0, 0], q[0, 0, 0])  # position 0: no turn
    ids = torch.tensor([[4, 5, 6]])
    shifted, _ = rope.rotate(q, q, ids)
    torch.testing.assert_close(shifted, rope_by_hand(q, [4, 5, 6], 10000.0, 4))


def test_rotary_scores_depend_on_relative_position_only():
    rope = RotaryPositions(theta=500.0)
    q = torch.randn(1, 2, 6, 8, dtype=torch.float64)
    k = torch.randn(1, 2, 6, 8, dtype=torch.float64)
    a_q, a_k = rope.rotate(q, k)
    b_q, b_k = rope.rotate(q, k, torch.arange(6)[None] + 37)
    # angles are float32 (as in Hugging Face), hence the tolerance
    torch.testing.assert_close(a_q @ a_k.transpose(-1, -2), b_q @ b_k.transpose(-1, -2),
                               atol=1e-5, rtol=1e-5)


def test_alibi_slopes_follow_the_paper():
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -i for i in range(1, 9)]))
    torch.testing.assert_close(alibi_slopes(4), torch.tensor([2.0 ** -i for i in (2, 4, 6, 8)]))
    # 6 heads: the 4-head slopes, then every other one of the 8-head slopes
    torch.testing.assert_close(alibi_slopes(6), torch.tensor(
        [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8, 2.0 ** -1, 2.0 ** -3]))


def test_alibi_bias_and_attention_match_the_formula():
    bias = ALiBiPositions().score_bias(2, 3, 3, torch.device("cpu"), torch.float32)
    expected = torch.tensor([[0, 1, 2], [1, 0, 1], [2, 1, 0]], dtype=torch.float32)
    torch.testing.assert_close(bias[0], -expected / 16)  # 2 heads: slopes 1/16, 1/256
    torch.testing.assert_close(bias[1], -expected / 256)
    # a causal attention with ALiBi: softmax(q k^T / sqrt(d) - m (i - j)) v, by hand
    comp = REG.get("attention", "mha")
    att = comp.build(comp.spec_cls(), emb_dim=4, n_heads=2, context_length=8, drop_rate=0.0,
                     qkv_bias=False, causal=True, positions=ALiBiPositions(), out_bias=False)
    x = torch.randn(1, 3, 4)
    q, k, v = att.W_query(x), att.W_key(x), att.W_value(x)  # (1, 3, 4): 2 heads of 2
    heads = []
    for h, m in enumerate([1 / 16, 1 / 256]):
        qh, kh, vh = (t[0, :, 2 * h: 2 * h + 2] for t in (q, k, v))  # (3, 2)
        rows = []
        for i in range(3):
            logits = torch.stack([qh[i] @ kh[j] / math.sqrt(2) - m * (i - j) for j in range(i + 1)])
            rows.append(torch.softmax(logits, 0) @ vh[: i + 1])
        heads.append(torch.stack(rows))
    expected_out = att.out_proj(torch.cat(heads, dim=-1))[None]
    torch.testing.assert_close(att(x), expected_out)


def test_learned_positions_follow_position_ids():
    spec = REG.get("positional", "learned")
    pos = spec.build(spec.spec_cls(), emb_dim=4, context_length=8)
    x = torch.zeros(1, 3, 4)
    ids = torch.tensor([[0, 0, 1]])
    torch.testing.assert_close(pos(x, position_ids=ids)[0], pos.pos_emb.weight[[0, 0, 1]])
    torch.testing.assert_close(pos(x)[0], pos.pos_emb.weight[:3])


def test_position_ids_count_real_tokens():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    assert position_ids_from_mask(mask).tolist() == [
        [0, 0, 0, 1, 2], [0, 1, 2, 3, 4], [0, 1, 2, 2, 2]]


@pytest.mark.parametrize("family", ["gpt", "encoder", "encoder_decoder"])
@pytest.mark.parametrize("positional", ["learned", "sinusoidal", "rotary", "alibi", "none"])
def test_one_positions_module_shared_by_reference(tiny, family, positional):
    model = vl.build_model({**tiny, "family": family, "positional": positional}, REG)
    embeds = [m for m in model.modules() if getattr(m, "variantlab_slot", "") == "positional"]
    atts = [m for m in model.modules() if getattr(m, "variantlab_slot", "") == "attention"]
    assert len(embeds) == (2 if family == "encoder_decoder" else 1)
    assert all(any(a.positions is e for e in embeds) for a in atts)
    assert not any("positions" in name for name, _ in model.named_modules())
    if family == "encoder_decoder":  # the decoder's self-attentions get the decoder's own
        dec = model.decoder
        assert dec.layers[0].self_att.sublayer.positions is dec.embed.pos_emb
    n_pos = sum("pos_emb" in k for k in model.state_dict())
    assert n_pos == (len(embeds) if positional == "learned" else 0)


def test_rotary_and_alibi_change_the_model_but_not_its_parameters(tiny):
    torch.manual_seed(0)
    base = vl.build_model({**tiny, "positional": "none"}, REG)
    idx = torch.randint(0, 64, (2, 8))
    outs = {}
    for kind in ("rotary", "alibi"):
        model = vl.build_model({**tiny, "positional": kind}, REG)
        assert model.state_dict().keys() == base.state_dict().keys()
        model.load_state_dict(base.state_dict())
        outs[kind] = model(idx)
        assert not torch.allclose(outs[kind], base(idx), atol=1e-4)


PLAIN_ATTENTION = '''
from typing import Literal
import torch
from variantlab import ComponentSpec, hookimpl
from variantlab_plugins.attentions import MultiHeadAttention, MHASpec

class PlainSpec(ComponentSpec):
    """An attention written against the old contract: no positions, make_norm, out_bias."""
    kind: Literal["plain"] = "plain"

@hookimpl
def register_attentions(register):
    def build(spec, emb_dim, n_heads, context_length, drop_rate, qkv_bias, causal):
        return MultiHeadAttention(emb_dim, n_heads, drop_rate, qkv_bias, causal, MHASpec())
    register("plain", PlainSpec, build)
'''


def test_old_contract_attention_runs_and_refuses_inner_positions(tmp_path, tiny):
    path = tmp_path / "plain_attention.py"
    path.write_text(PLAIN_ATTENTION)
    reg = vl.build_registry(extra=[str(path)], entry_points=False)
    model = vl.build_model({**tiny, "attention": "plain"}, reg)  # learned: no new kwargs
    assert model(torch.randint(0, 64, (2, 8))).shape == (2, 8, 64)
    for kind in ("rotary", "alibi"):
        with pytest.raises(vl.SpecError) as info:
            vl.parse_model_spec({**tiny, "attention": "plain", "positional": kind}, reg)
        (issue,) = info.value.issues
        assert issue.loc == ("positional", "kind")
        assert f"positional {kind!r}" in issue.message and "attention 'plain'" in issue.message


def test_none_positional_is_the_no_op_contract():
    pos = Positions()
    x = torch.randn(2, 3, 4)
    assert pos(x) is x and pos.rotate(x, x) == (x, x)
    assert pos.score_bias(2, 3, 3, x.device, x.dtype) is None


def test_flags_say_which_schemes_act_in_attention():
    """``rotates`` / ``biases`` / ``acts_in_attention`` of every scheme (the contract a model
    reads to tell whether its attention must cooperate)."""
    learned = REG.get("positional", "learned")
    cases = [(Positions(), False, False), (RotaryPositions(), True, False),
             (ALiBiPositions(), False, True),
             (learned.build(learned.spec_cls(), emb_dim=4, context_length=8), False, False)]
    for pos, rotates, biases in cases:
        assert (pos.rotates, pos.biases) == (rotates, biases), type(pos).__name__
        assert pos.acts_in_attention is (rotates or biases), type(pos).__name__


def test_accepts_reads_keywords_and_passes_nothing_to_builtins():
    def named(spec, positions=None):
        return spec

    def var_keyword(spec, **options):
        return spec

    def plain(spec):
        return spec

    assert accepts(named, "positions") and accepts(var_keyword, "positions")
    assert not accepts(named, "make_norm") and not accepts(plain, "positions")
    assert accepts(max, "key") is False  # a builtin without a signature (ValueError)
    assert accepts(42, "key") is False  # not callable at all (TypeError)


def sinusoid_by_hand(length, dim):
    """Vaswani et al. 2017, sec. 3.5: PE(pos, 2i) = sin(pos / 10000^(2i/D)),
    PE(pos, 2i+1) = cos(pos / 10000^(2i/D)), written out entry by entry."""
    pe = torch.zeros(length, dim, dtype=torch.float64)
    for pos in range(length):
        for col in range(dim):
            angle = pos / 10000.0 ** (2 * (col // 2) / dim)
            pe[pos, col] = math.sin(angle) if col % 2 == 0 else math.cos(angle)
    return pe


@pytest.mark.parametrize("dim, scale_embeddings", [(6, True), (5, True), (6, False)])
def test_sinusoidal_positions_match_the_formula(dim, scale_embeddings):
    comp = REG.get("positional", "sinusoidal")
    spec = comp.spec_cls.model_validate({"scale_embeddings": scale_embeddings})
    pos = comp.build(spec, emb_dim=dim, context_length=7)
    want = sinusoid_by_hand(7, dim).float()
    x = torch.randn(2, 4, dim)
    factor = math.sqrt(dim) if scale_embeddings else 1.0
    torch.testing.assert_close(pos(x), x * factor + want[:4])
    ids = torch.tensor([[6, 0, 3, 3], [1, 2, 5, 4]])
    torch.testing.assert_close(pos(x, position_ids=ids), x * factor + want[ids])
    assert "pe" not in pos.state_dict()  # a fixed table, not a checkpointed tensor


def test_sinusoidal_frequencies_hold_at_far_positions():
    """Position 2047 multiplies a wrong frequency's error by 2047: a base of 10001 for 10000
    moves the angles there by 1e-3."""
    comp = REG.get("positional", "sinusoidal")
    pos = comp.build(comp.spec_cls(scale_embeddings=False), emb_dim=6, context_length=2048)
    ids = torch.tensor([[1000, 2047]])
    want = torch.tensor([[[math.sin(p / 10000.0 ** (c // 2 * 2 / 6)) if c % 2 == 0
                           else math.cos(p / 10000.0 ** (c // 2 * 2 / 6)) for c in range(6)]
                          for p in (1000, 2047)]])
    torch.testing.assert_close(pos(torch.zeros(1, 2, 6), position_ids=ids), want,
                               atol=1e-4, rtol=0)  # float32 angles near 95 rad: ~1e-5 off


def test_sinusoidal_scales_embeddings_by_default():
    spec = REG.get("positional", "sinusoidal").spec_cls()
    assert spec.scale_embeddings is True


def test_the_registry_builds_each_scheme_from_its_spec():
    def build(data):
        comp = REG.get("positional", data["kind"])
        return comp.build(comp.spec_cls.model_validate(data), emb_dim=4, context_length=8)

    rope = build({"kind": "rotary", "theta": 500.0, "fraction": 0.5, "odd_rounding": "up"})
    assert type(rope) is RotaryPositions
    assert (rope.theta, rope.fraction, rope.odd_rounding) == (500.0, 0.5, "up")
    assert type(build({"kind": "alibi"})) is ALiBiPositions
    assert type(build({"kind": "none"})) is Positions
    learned = build({"kind": "learned"})
    assert learned.pos_emb.weight.shape == (8, 4)


def test_rotary_spec_defaults_are_roformers():
    spec = REG.get("positional", "rotary").spec_cls()
    assert (spec.theta, spec.fraction, spec.odd_rounding) == (10000.0, 1.0, "down")
    rope = RotaryPositions()
    assert (rope.theta, rope.fraction, rope.odd_rounding) == (10000.0, 1.0, "down")
    assert rope.extra_repr() == "theta=10000.0, fraction=1.0"
    up = RotaryPositions(500.0, 0.25, "up")
    assert up.extra_repr() == "theta=500.0, fraction=0.25, odd_rounding=up"


@pytest.mark.parametrize("head_dim, fraction, refused", [
    (5, 1.0, True),  # int(5 * 1.0) = 5, up: 6 dims of 5
    (3, 1.0, True),  # 3 up: 4 dims of 3
    (8, 0.875, False),  # 7 up: 8 dims, exactly the head
    (6, 0.5, False),  # 3 up: 4 dims
    (8, 1.0, False),  # even: nothing to round
])
@pytest.mark.parametrize("head_dim_from", ["attention", "emb_dim"])
def test_odd_rounding_up_is_refused_only_past_the_head(head_dim, fraction, refused,
                                                      head_dim_from):
    """The head's width is the attention's head_dim when set, else emb_dim // n_heads;
    odd_rounding down never rounds past the head."""
    data = {"family": "gpt", "vocab_size": 64, "context_length": 16, "emb_dim": 16,
            "n_heads": 2, "n_layers": 1, "attention": {"kind": "mha", "head_dim": head_dim},
            "positional": {"kind": "rotary", "fraction": fraction, "odd_rounding": "up"}}
    if head_dim_from == "emb_dim":
        data.update(emb_dim=2 * head_dim, attention={"kind": "mha"})
    down = {**data, "positional": {**data["positional"], "odd_rounding": "down"}}
    assert vl.parse_model_spec(down, REG).positional.odd_rounding == "down"
    if not refused:
        assert vl.parse_model_spec(data, REG).positional.fraction == fraction
        return
    with pytest.raises(vl.SpecError) as info:
        vl.parse_model_spec(data, REG)
    (issue,) = info.value.issues
    assert issue.loc == ("positional", "odd_rounding")
    rot = int(head_dim * fraction)
    assert issue.message == (f"rounding int({head_dim} * {fraction}) = {rot} up rotates "
                             f"{rot + 1} dims, more than the head has ({head_dim}); use "
                             "odd_rounding: down")


@pytest.mark.parametrize("fraction", [0.0, -0.5, 1.01, 1.5])
def test_a_rotary_fraction_outside_zero_to_one_is_refused(tiny, fraction):
    with pytest.raises(vl.SpecError) as info:
        vl.parse_model_spec({**tiny, "positional": {"kind": "rotary", "fraction": fraction}}, REG)
    assert info.value.issues[0].loc == ("positional", "fraction")


def test_rotary_walk_examples_are_valid_specs():
    spec_cls = REG.get("positional", "rotary").spec_cls
    for example in spec_cls.walk_examples:
        spec = spec_cls.model_validate(example)
        assert all(getattr(spec, key) == value for key, value in example.items())


def test_alibi_is_refused_only_where_a_mixer_layer_has_no_scores(tiny):
    """A layer of a causal sequence mixer computes no scores for ALiBi to bias; rotary stays
    with the attention layers."""
    layout = {"kinds": {"lin": {"attention": "linear_attention"}}, "layers": {0: "lin"}}
    with pytest.raises(vl.SpecError) as info:
        vl.parse_model_spec({**tiny, "positional": "alibi", "layout": layout}, REG)
    assert [i.loc for i in info.value.issues] == [("layout", "kinds", "lin", "attention", "kind")]
    assert "computes no attention scores for positional 'alibi'" in str(info.value)
    spec = vl.parse_model_spec({**tiny, "positional": "rotary", "layout": layout}, REG)
    assert spec.layer_spec(0).attention.kind == "linear_attention"


def test_one_rotated_pair_when_a_single_dim_rounds_up():
    """r = int(4 * 0.25) = 1: up rotates dims (0, 1) by pos * theta^0 = pos radians; down
    rotates none (r - 1 = 0 dims) and returns its inputs."""
    q = torch.randn(1, 2, 3, 4, dtype=torch.float64)
    up, _ = RotaryPositions(10000.0, 0.25, "up").rotate(q, q)
    want = q.clone()
    for t in range(3):
        want[..., t, 0] = q[..., t, 0] * math.cos(t) - q[..., t, 1] * math.sin(t)
        want[..., t, 1] = q[..., t, 1] * math.cos(t) + q[..., t, 0] * math.sin(t)
    torch.testing.assert_close(up, want)
    down_q, down_k = RotaryPositions(10000.0, 0.25).rotate(q, q * 2)
    assert down_q is q and torch.equal(down_k, q * 2)


def test_default_angles_are_cached_per_length_and_the_cache_stays_bounded():
    rope = RotaryPositions()
    q = torch.randn(1, 1, 12, 4, dtype=torch.float64)
    for t in range(1, 10):  # nine lengths: all kept
        out, _ = rope.rotate(q[:, :, :t], q[:, :, :t])
        torch.testing.assert_close(out, rope_by_hand(q[:, :, :t], range(t), 10000.0, 4))
    assert sorted(key[1] for key in rope._cache) == list(range(1, 10))
    out, _ = rope.rotate(q[:, :, :11], q[:, :, :11])  # a tenth clears the nine first
    torch.testing.assert_close(out, rope_by_hand(q[:, :, :11], range(11), 10000.0, 4))
    assert list(rope._cache) == [(4, 11, "cpu")]
    again, _ = rope.rotate(q[:, :, :11], q[:, :, :11])  # cached: the same tensors
    torch.testing.assert_close(again, out)


def test_alibi_bias_of_fewer_queries_than_keys_ends_with_the_keys():
    """T queries are the last T of S positions (query i at position i + S - T); a lone head
    has slope 2^-8."""
    bias = ALiBiPositions().score_bias(1, 2, 5, torch.device("cpu"), torch.float64)
    distance = torch.tensor([[3, 2, 1, 0, 1], [4, 3, 2, 1, 0]], dtype=torch.float64)
    assert bias.dtype == torch.float64 and bias.shape == (1, 2, 5)
    torch.testing.assert_close(bias[0], -distance / 256)
    torch.testing.assert_close(alibi_slopes(1), torch.tensor([2.0 ** -8]))
    torch.testing.assert_close(alibi_slopes(3), torch.tensor([2.0 ** -4, 2.0 ** -8, 2.0 ** -2]))
    # 12 heads: the 8-head slopes 2^-1 .. 2^-8, then 4 of the 16-head ones 2^-0.5, 2^-1, ...
    torch.testing.assert_close(alibi_slopes(12), torch.tensor(
        [2.0 ** -i for i in range(1, 9)] + [2.0 ** -(0.5 + i) for i in range(4)]))


def test_a_nope_layer_may_drop_the_models_rotary(tiny):
    """``none`` adds nothing and does nothing in attention: a layer kind may take it in
    place of the model's rotary (SmolLM3's NoPE layers), and that layer rotates nothing."""
    data = {**tiny, "positional": "rotary",
            "layout": {"kinds": {"nope": {"positional": "none"}}, "layers": {0: "nope"}}}
    spec = vl.parse_model_spec(data, REG)
    assert spec.layer_spec(0).positional.kind == "none"
    model = vl.build_model(spec, REG)
    atts = [m for m in model.modules() if getattr(m, "variantlab_slot", "") == "attention"]
    assert [type(a.positions) for a in atts] == [Positions, RotaryPositions]
