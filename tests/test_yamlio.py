"""The strict YAML loader: plain data, positions, and file:line:col on every refusal."""

import datetime

import pytest
import yaml

from variantlab.config.yamlio import Position, StrictLoader, YamlError, load_yaml, read_text

TEXT = """\
name: demo
model:
  emb_dim: 32
  norm: {kind: layer, eps: 1.0e-5}
grid:
  residual.kind: [pre_norm, post_norm]
"""


def refused(text: str) -> list[str]:
    with pytest.raises(YamlError) as info:
        load_yaml(text, "exp.yaml")
    return info.value.messages


def test_plain_data_and_positions():
    doc = load_yaml(TEXT, "exp.yaml")
    assert doc.data == {
        "name": "demo",
        "model": {"emb_dim": 32, "norm": {"kind": "layer", "eps": 1e-5}},
        "grid": {"residual.kind": ["pre_norm", "post_norm"]},
    }
    assert doc.keys[("model", "emb_dim")] == Position(3, 3)
    assert doc.values[("model", "emb_dim")] == Position(3, 12)
    assert doc.keys[("model", "norm", "eps")] == Position(4, 23)
    assert doc.values[("grid", "residual.kind", 1)] == Position(6, 29)


def test_message_points_at_value_key_or_nearest_ancestor():
    doc = load_yaml(TEXT, "exp.yaml")
    assert doc.message(("model", "norm", "kind"), "bad") == "exp.yaml:4:16: model.norm.kind: bad"
    # a mapping value: its key
    assert doc.message(("model", "norm"), "bad") == "exp.yaml:4:3: model.norm: bad"
    # a missing field: the nearest written ancestor
    assert doc.message(("model", "n_heads"), "missing").startswith("exp.yaml:2:1: model.n_heads:")
    assert doc.message(("model", "emb_dim"), "x", at="key").startswith("exp.yaml:3:3:")


def test_clean_drops_validator_only_parts():
    doc = load_yaml("data: {source: text}\n")
    assert doc.clean(("data", "text", "path")) == ("data", "path")
    assert doc.clean(("data", "source")) == ("data", "source")


def test_duplicate_key_is_an_error_at_the_duplicate():
    (msg,) = refused("name: a\nmodel:\n  emb_dim: 32\n  emb_dim: 64\n")
    assert msg.startswith("exp.yaml:4:3: model.emb_dim: duplicate key 'emb_dim'")
    assert "first at line 3, column 3" in msg


def test_all_duplicates_reported():
    msgs = refused("a: 1\na: 2\nb: {c: 1, c: 2}\n")
    assert [m.split(": ")[0] for m in msgs] == ["exp.yaml:2:1", "exp.yaml:3:11"]


def test_syntax_error_has_line_and_col():
    (msg,) = refused("name: a\nmodel:\n  emb_dim: 32\n   n_heads: 4\n")
    assert msg.startswith("exp.yaml:4:")
    assert "YAML syntax error" in msg
    (msg,) = refused("grid: {norm.kind: [layer, batch}\n")
    assert msg.startswith("exp.yaml:1:") and "YAML syntax error" in msg


def test_python_tag_is_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / "pwned"
    text = f"name: x\nmodel: !!python/object/apply:os.system ['touch {marker}']\n"
    (msg,) = refused(text)
    assert msg.startswith("exp.yaml:2:8: model: tag !!python/object/apply:os.system is not allowed")
    assert not marker.exists()
    # nested, and python/name and custom tags too
    msgs = refused("a:\n  b: [1, !!python/name:os.system '']\nc: !custom 3\n")
    assert msgs[0].startswith("exp.yaml:2:10: a.b[1]: tag !!python/name:os.system")
    assert msgs[1].startswith("exp.yaml:3:4: c: tag !custom")
    assert not marker.exists()


def test_loader_is_a_safe_loader():
    assert issubclass(StrictLoader, yaml.SafeLoader)


def test_scalars_and_exponent_floats():
    doc = load_yaml("a: 1e-5\nb: 3.0e-4\nc: 12\nd: '1e-5'\ne: true\nf: null\ng: 2024-01-02\n")
    assert doc.data == {
        "a": 1e-5, "b": 3e-4, "c": 12, "d": "1e-5", "e": True, "f": None,
        "g": datetime.date(2024, 1, 2),
    }
    assert isinstance(doc.data["a"], float)
    assert yaml.safe_load("a: 1e-5") == {"a": "1e-5"}  # the global SafeLoader is untouched


def test_anchors_and_merge_keys():
    doc = load_yaml("base: &b {kind: layer, eps: 1.0}\nnorm: {<<: *b, eps: 2.0}\n")
    assert doc.data["norm"] == {"kind": "layer", "eps": 2.0}


def test_alias_bomb_is_refused():
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 7)]
    with pytest.raises(YamlError, match="more than"):
        load_yaml("\n".join(lines) + "\n")


def test_non_scalar_key_refused():
    (msg,) = refused("? [a, b]\n: 1\n")
    assert msg.startswith("exp.yaml:1:3:") and "keys must be plain" in msg


def test_empty_document_and_missing_file(tmp_path):
    assert load_yaml("").data is None
    with pytest.raises(YamlError, match="no such file"):
        read_text(tmp_path / "nope.yaml")
