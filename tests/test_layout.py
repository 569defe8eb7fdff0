"""Per-layer layouts: names, validation with locations, equality with hand-assembled models,
the uniform case unchanged, per-layer rows, the size guard, grids over a layout."""

import json
import textwrap

import pytest
import torch
from click.testing import CliRunner
from conftest import TINY

import variantlab as vl
from variantlab.cli.main import main
from variantlab.model.layout import layer_rows
from variantlab.probes.params import count_rows
from variantlab.sweep.sizeguard import model_cost
from variantlab_plugins.rotary import RotaryPositions

REG = vl.get_registry()
BASE = {**TINY, "n_layers": 4, "drop_rate": 0.0}


def spec(**layout):
    return vl.parse_model_spec({**BASE, "layout": layout} if layout else BASE, REG)


def built(s, seed=0):
    torch.manual_seed(seed)
    return vl.build_model(s, REG)


def test_a_model_without_layout_serialises_as_before():
    data = spec().to_data()
    assert "layout" not in data
    assert vl.parse_model_spec(data, REG) == spec()


def test_pattern_repeats_and_layers_win():
    s = spec(kinds={"a": {"activation": "relu"}, "b": {}}, pattern=["a", "b", "b"], layers={3: "a"})
    assert [s.layout.kind_at(i) for i in range(4)] == ["a", "b", "b", "a"]
    assert [r["activation"] for r in layer_rows(s)] == ["relu", "gelu", "gelu", "relu"]
    assert [r["kind"] for r in layer_rows(s)] == ["a", "b", "b", "a"]


def test_json_round_trip_with_string_layer_indices():
    s = spec(kinds={"a": {"activation": "relu"}}, layers={2: "a"})
    data = json.loads(json.dumps(s.to_data()))
    assert data["layout"]["layers"] == {"2": "a"}
    assert vl.parse_model_spec(data, REG) == s


def test_a_layout_of_the_models_own_components_equals_the_uniform_model():
    x = torch.randint(0, BASE["vocab_size"], (2, 8))
    same = built(spec(kinds={"own": {}}, pattern=["own"]))
    uniform = built(spec())
    assert torch.equal(same(x), uniform(x))


def test_alternating_activations_equal_the_uniform_model_with_one_activation_swapped():
    """relu and gelu have no parameters, so both models draw the same weights from the seed;
    swapping layer 1's and 3's activation module by hand must give the layout's logits."""
    layout = built(spec(kinds={"r": {"activation": "relu"}, "g": {}}, pattern=["g", "r"]))
    hand = built(spec())
    for i in (1, 3):
        hand.trf_blocks[i].ff.sublayer.layers[1] = torch.nn.ReLU()
    x = torch.randint(0, BASE["vocab_size"], (2, 8))
    assert torch.equal(layout(x), hand(x))
    assert not torch.equal(layout(x), built(spec())(x))


def test_a_layer_kind_with_its_own_rotary_base():
    base = {**BASE, "positional": {"kind": "rotary", "theta": 1_000_000.0}}
    s = vl.parse_model_spec({**base, "layout": {
        "kinds": {"local": {"positional": {"kind": "rotary", "theta": 10_000.0}}, "global": {}},
        "pattern": ["local", "global"]}}, REG)
    model = built(s)
    assert [layer_rows(s)[i]["kind"] for i in range(4)] == ["local", "global"] * 2
    uniform = built(vl.parse_model_spec(base, REG))
    x = torch.randint(0, BASE["vocab_size"], (1, 8))
    assert not torch.allclose(model(x), uniform(x))  # layers 0 and 2 rotate differently
    for i in (0, 2):  # rotary has no parameters: the same weights, other angles by hand
        uniform.trf_blocks[i].att.sublayer.__dict__["positions"] = RotaryPositions(10_000.0)
    assert torch.equal(model(x), uniform(x))
    # padding still honoured: a left-padded row gives the unpadded row's last logits
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), x], dim=1)
    mask = torch.cat([torch.zeros(1, 3), torch.ones(1, 8)], dim=1)
    assert torch.allclose(model(padded, attention_mask=mask)[:, 3:], model(x), atol=1e-5)


def test_parameter_rows_stay_per_layer_and_the_size_guard_adds_layers_up():
    s = spec(kinds={"wide": {"feedforward": {"kind": "mlp", "hidden_mult": 8}}, "n": {}},
             pattern=["wide", "n"])
    model = built(s)
    per_layer = {r["layer"]: r["value"] for r in count_rows(model)
                 if r["scope"] == "layer" and r["metric"] == "params" and not r["name"]}
    emb = BASE["emb_dim"]
    extra = 2 * emb * 4 * emb + 4 * emb  # hidden 8x instead of 4x: two weights and a bias
    assert per_layer[0] - per_layer[1] == extra and per_layer[2] == per_layer[0]
    total = sum(p.numel() for p in model.parameters())
    assert model_cost(s, REG).params == total


@pytest.mark.parametrize(("layout", "where", "says"), [
    ({"kinds": {"a": {}}, "pattern": ["a"] * 5}, "model.layout.pattern:",
     "5 entries but the model has n_layers=4"),
    ({"kinds": {"local": {}}, "pattern": ["lcoal"]}, "model.layout.pattern[0]:", "did you mean 'local'?"),
    ({"kinds": {"a": {}}, "layers": {7: "a"}}, "model.layout.layers[7]:", "outside the stack (0 .. 3)"),
    ({"kinds": {"a": {"init": {"kind": "xavier"}}}}, "model.layout.kinds.a.init:", "cannot vary per layer"),
    ({"kinds": {"a": {"positional": "rotary"}}}, "model.layout.kinds.a.positional.kind:",
     "acts inside attention"),
    ({"kinds": {"a": {"positional": "none"}}}, "model.layout.kinds.a.positional.kind:",
     "drop it (none: a NoPE layer)"),
    ({"kinds": {"a": {"attention": {"kind": "mha", "n_kv_heads": 3}}}}, "model.layout.kinds.a.attention",
     "n_kv_heads"),
])
def test_bad_layouts_are_refused_with_their_location(tmp_path, layout, where, says):
    exp = tmp_path / "exp.yaml"
    exp.write_text(textwrap.dedent(f"""\
        name: lay
        model: {json.dumps({**BASE, "layout": layout})}
        measure: {{params: {{}}}}
        """))
    result = CliRunner().invoke(main, ["run", str(exp), "--out", str(tmp_path / "runs")])
    assert result.exit_code == 2, result.output
    assert f"{exp}:2:" in result.output and where in result.output and says in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "runs").exists()


def test_a_family_without_a_stack_refuses_a_layout():
    with pytest.raises(vl.SpecError, match="builds no stack of layers"):
        vl.parse_model_spec({"family": "mlp", "layout": {"kinds": {"a": {}}}}, REG)


def test_a_grid_sweeps_the_pattern_and_describe_shows_the_layer_table(tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_text(textwrap.dedent(f"""\
        name: ratio
        model: {json.dumps({**BASE, "layout": {"kinds": {"l": {"activation": "relu"}, "g": {}}}})}
        grid:
          layout.pattern: [[l, g], [l, l, l, g]]
        measure: {{params: {{}}}}
        """))
    runner = CliRunner()
    result = runner.invoke(main, ["run", str(exp), "--out", str(tmp_path / "runs"), "--no-report"])
    assert result.exit_code == 0, result.output
    rows = vl.results(tmp_path / "runs" / "ratio")
    assert rows["variant"].nunique() == 2
    described = runner.invoke(main, ["describe", str(exp)])
    assert described.exit_code == 0, described.output
    assert "│     3 │ g" in described.output and "│     2 │ l" in described.output


def test_layer_indices_inside_the_stack_exactly():
    from variantlab.model.layout import LayoutSpec

    layout = LayoutSpec(kinds={"a": {}}, layers={0: "a", 3: "a"})
    assert layout.problems(4) == []  # the first and the last layer
    for index in (-1, 4):
        (issue,) = LayoutSpec(kinds={"a": {}}, layers={index: "a"}).problems(4)
        assert issue.loc == ("layout", "layers", index)
        assert issue.message == f"layer {index} is outside the stack (0 .. 3)"


def test_an_unknown_name_lists_the_kinds_or_says_there_are_none():
    from variantlab.model.layout import LayoutSpec

    (issue,) = LayoutSpec(kinds={"local": {}, "global": {}}, pattern=["lcoal"]).problems(4)
    assert issue.message == "'lcoal' is not a layer kind; did you mean 'local'? kinds: local, global"
    (issue,) = LayoutSpec(pattern=["x"]).problems(4)
    assert issue.message == ("'x' is not a layer kind; kinds: none (define them under "
                             "layout.kinds)")


def test_a_layout_is_frozen_strict_and_its_pattern_not_empty():
    from pydantic import ValidationError

    from variantlab.model.layout import LayoutSpec

    layout = spec(kinds={"a": {}}, pattern=["a"]).layout
    with pytest.raises(ValidationError, match="frozen"):
        layout.pattern = ["a", "a"]
    for layers in ({1.0: "a"}, {True: "a"}):  # no silent coercion to an index
        with pytest.raises(ValidationError, match="valid integer"):
            LayoutSpec(kinds={"a": {}}, layers=layers)
    with pytest.raises(ValidationError, match="at least 1 item"):
        LayoutSpec(kinds={"a": {}}, pattern=[])


def test_a_mixer_layer_kind_and_a_layer_positional_are_checked_in_their_layer():
    """A causal mixer as a layer kind's attention: fine beside the model's learned or rotary
    positional (the mixer layers leave rotary to the attention layers), refused under ALiBi
    (no scores to bias). A layer may swap rotary for rotary or none, not for an embedding
    positional; overriding another slot (the residual) is no positional issue."""
    def issues(positional, kinds):
        data = {**BASE, "positional": positional, "layout": {"kinds": kinds}}
        try:
            vl.parse_model_spec(data, REG)
        except vl.SpecError as err:
            return [(i.loc, i.message) for i in err.issues]
        return []

    mixer = {"m": {"attention": "linear_attention"}, "a": {}}
    assert issues("learned", mixer) == issues("rotary", mixer) == []
    assert issues("alibi", mixer) == [(
        ("layout", "kinds", "m", "attention", "kind"),
        "attention 'linear_attention' is a causal sequence mixer and computes no attention "
        "scores for positional 'alibi' to bias; use rotary, learned or none, or attention mha "
        "in this layer")]
    assert issues("rotary", {"r": {"residual": "post_norm"}, "n": {"positional": "none"}}) == []
    (only,) = issues("rotary", {"l": {"positional": "learned"}})
    assert only[0] == ("layout", "kinds", "l", "positional", "kind")
    assert only[1].startswith("a layer may change only a positional that acts inside attention")
