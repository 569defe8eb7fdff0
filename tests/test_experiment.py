"""Experiment files: expansion, labels, and every bad input as FILE:LINE:COL: key.path."""

import textwrap
from pathlib import Path

import pytest
from conftest import exp

from variantlab.config.experiment import (
    Experiment,
    InputError,
    experiment_from_text,
    load_experiment,
    load_model_file,
)
from variantlab.config.overrides import apply_overrides
from variantlab.plugin.registry import build_registry


def errors(text: str, **kw) -> list[str]:
    with pytest.raises(InputError) as info:
        experiment_from_text(text, "exp.yaml", **kw)
    return info.value.messages


def only(text: str, **kw) -> str:
    msgs = errors(text, **kw)
    assert len(msgs) == 1, msgs
    return msgs[0]


# -- expansion and labels ----------------------------------------------------------------
def test_grid_is_a_cartesian_product_in_key_order():
    e = experiment_from_text(exp("""\
        grid:
          residual.kind: [pre_norm, post_norm]
          norm.kind: [layer, batch]
        variants:
          - {name: relu, set: {activation.kind: relu}}
        """))
    assert isinstance(e, Experiment)
    assert [v.label for v in e.variants] == [
        "base", "norm.kind=batch", "residual.kind=post_norm",
        "residual.kind=post_norm,norm.kind=batch", "relu",
    ]
    assert [v.name for v in e.variants] == [v.label for v in e.variants]
    last = e.variants[3]
    assert last.overrides == {"residual.kind": "post_norm", "norm.kind": "batch"}
    assert (last.spec.residual.kind, last.spec.norm.kind) == ("post_norm", "batch")
    assert last.warnings and "future positions" in last.warnings[0]
    assert e.variants[0].warnings == []
    assert e.baseline == "base" and e.seeds == [0] and e.name == "demo"
    assert list(e.measure.probes()) == ["params"]
    assert e.data.source == "synthetic"


def test_kind_change_drops_the_old_kinds_params():
    e = experiment_from_text(exp("""\
        variants:
          - {name: relu, set: {activation.kind: relu}}
          - {name: exact, set: {activation.approximate: none}}
          - {name: glu, set: {feedforward.kind: glu, activation.kind: silu, feedforward.hidden_dim: 40}}
        """))
    by = {v.name: v.spec for v in e.variants}
    assert by["relu"].activation.kind == "relu"
    assert by["exact"].activation.approximate == "none"
    assert by["glu"].feedforward.kind == "glu" and by["glu"].feedforward.hidden_dim == 40
    assert by["glu"].activation.kind == "silu"
    assert [v.name for v in e.variants] == ["base", "relu", "exact", "glu"]


def test_same_kind_keeps_params_and_sizes_override():
    reg = build_registry()
    base = {"norm": {"kind": "layer", "eps": 1e-3}, "n_layers": 2}
    model, bad = apply_overrides(base, {"norm.kind": "layer", "n_layers": 4}, reg)
    assert bad == {} and model["norm"] == {"kind": "layer", "eps": 1e-3} and model["n_layers"] == 4
    model, _ = apply_overrides(base, {"norm.kind": "rms"}, reg)
    assert model["norm"] == {"kind": "rms"}
    assert base["norm"] == {"kind": "layer", "eps": 1e-3}  # base untouched


def test_label_leaves_out_axes_equal_to_base_and_baseline():
    e = experiment_from_text(exp("""\
        seeds: [1, 2]
        grid:
          n_layers: [2, 3]
          residual.shortcut: [true, false]
        baseline: n_layers=3
        """))
    assert [v.name for v in e.variants] == [
        "base", "residual.shortcut=false", "n_layers=3", "n_layers=3,residual.shortcut=false",
    ]
    assert e.baseline == "n_layers=3" and e.seeds == [1, 2]
    assert e.variants[3].spec.n_layers == 3 and e.variants[3].spec.residual.shortcut is False


def test_load_experiment_from_file_and_plugin_beside_it(tmp_path):
    (tmp_path / "mynorm.py").write_text(textwrap.dedent("""\
        from typing import Literal
        from torch import nn
        from variantlab import ComponentSpec, hookimpl

        class ScaleSpec(ComponentSpec):
            kind: Literal["scale"] = "scale"

        @hookimpl
        def register_norms(register):
            register("scale", ScaleSpec, lambda spec, dim: nn.Identity())
        """))
    path = tmp_path / "e.yaml"
    path.write_text(exp("plugins: [mynorm.py]\ngrid:\n  norm.kind: [layer, scale]\n"))
    e = load_experiment(path)
    assert e.path == path and e.base_dir == tmp_path
    assert e.variants[1].spec.norm.kind == "scale"
    assert "scale" in e.registry.kinds("norm")
    assert e.source_text == path.read_text()


def test_load_model_file_bare_model_and_experiment(tmp_path):
    bare = tmp_path / "m.yaml"
    bare.write_text("family: gpt\nvocab_size: 64\ncontext_length: 16\nemb_dim: 32\nn_heads: 4\n")
    (v,) = load_model_file(bare)
    assert v.name == "base" and v.spec.emb_dim == 32
    bare.write_text("family: gpt\nemb_dim: 30\nn_heads: 4\n")
    with pytest.raises(InputError) as info:
        load_model_file(bare)
    assert info.value.messages[0].startswith(f"{bare}:3:10: n_heads: n_heads=4 does not divide")
    full = tmp_path / "e.yaml"
    full.write_text(exp("grid: {n_layers: [1, 2]}\n"))
    assert [v.name for v in load_model_file(full)] == ["n_layers=1", "base"]


# -- bad input: issue 3, "What it must show" 3 -------------------------------------------
def test_yaml_syntax_error():
    msg = only("name: demo\nmodel: {family: gpt\n")
    assert msg.startswith("exp.yaml:3:1: YAML syntax error")


def test_duplicate_key():
    msg = only(exp("measure:\n  params: {}\n  params: {}\n"))
    assert msg.startswith("exp.yaml:13:3: measure.params: duplicate key 'params'")


def test_wrong_type():
    msg = only(exp().replace("n_layers: 2", "n_layers: two"))
    assert msg.startswith("exp.yaml:8:13: model.n_layers: Input should be a valid integer")
    msg = only(exp("seeds: 0\n"))
    assert msg.startswith("exp.yaml:11:8: seeds: Input should be a valid list")


def test_unknown_key_top_level_model_and_measure():
    msg = only(exp("measur: {params: {}}\n"))
    assert msg.startswith("exp.yaml:11:1: measur: unknown key 'measur'; did you mean 'measure'?")
    msg = only(exp().replace("n_heads: 4", "n_head: 4"))
    assert msg.startswith("exp.yaml:7:3: model.n_head: unknown key 'n_head'; did you mean 'n_heads'?")
    msg = only(exp("measure:\n  gradients: {batch_size: 2, seqlen: 8}\n"))
    assert msg.startswith("exp.yaml:12:30: measure.gradients.seqlen: unknown key")


def test_unknown_kind_with_suggestion_in_model_and_in_grid():
    msg = only(exp().replace("kind: gelu", "kind: gelu2"))
    assert msg.startswith("exp.yaml:10:22: model.activation.kind: unknown activation 'gelu2'; "
                          "did you mean 'gelu'? Registered: gelu, relu, relu2, silu")
    msg = only(exp("grid:\n  norm.kind: [layer, batchnorm]\n"))
    assert msg.startswith("exp.yaml:12:22: grid.norm.kind[1]: unknown norm 'batchnorm'; "
                          "did you mean 'batch'?")


def test_python_object_tag_is_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / "touched"
    text = exp(f"description: !!python/object/apply:os.system ['touch {marker}']\n")
    msg = only(text)
    assert msg.startswith("exp.yaml:11:14: description: tag !!python/object/apply:os.system")
    assert not marker.exists()


def test_grid_path_naming_no_field_suggests_the_closest():
    msg = only(exp("grid:\n  nrom.kind: [layer, rms]\n"))
    assert msg.startswith("exp.yaml:12:3: grid.nrom.kind: 'nrom.kind' names no field")
    assert "did you mean 'norm.kind'?" in msg
    msg = only(exp("variants:\n  - {name: a, set: {norm.epsilon: 0.1}}\n"))
    assert msg.startswith("exp.yaml:12:21: variants[0].set.norm.epsilon: ")
    assert "did you mean 'norm.eps'?" in msg


def test_seq_len_above_context_length_every_variant():
    msg = only(exp("grid:\n  context_length: [64, 32]\nmeasure:\n  gradients: {seq_len: 48}\n"))
    assert msg.startswith("exp.yaml:14:24: measure.gradients.seq_len: seq_len is above "
                          "context_length=32 of variant(s) 'base'")
    msg = only(exp("measure:\n  timing: {batch_size: 1}\n"))  # the default seq_len, 256
    assert msg.startswith("exp.yaml:12:3: measure.timing.seq_len: seq_len (default 256)")


def test_all_errors_of_all_variants_are_collected():
    msgs = errors(exp("""\
        grid:
          residual.kind: [pre_norm, postnorm]
          emb_dim: [32, 30]
        variants:
          - {name: sdpa, set: {attention.impl: flash}}
          - {name: sdpa, set: {n_layers: 3}}
        baseline: sdp
        measure:
          gradients: {seq_len: 64}
        """))
    joined = "\n".join(msgs)
    assert "exp.yaml:15:40: variants[0].set.attention.impl: Input should be 'naive' or 'sdpa'" in joined
    assert "exp.yaml:16:12: variants[1].name: variant name 'sdpa' is used twice" in joined
    assert "exp.yaml:7:12: model.n_heads: n_heads=4 does not divide emb_dim=30" in joined
    assert "(in variants 'emb_dim=30', 'residual.kind=postnorm,emb_dim=30')" in joined
    assert "exp.yaml:17:11: baseline: 'sdp' names no variant; did you mean 'sdpa'?" in joined
    assert ("exp.yaml:19:24: measure.gradients.seq_len: seq_len is above context_length=32 "
            "of every variant") in joined
    assert "exp.yaml:12:29: grid.residual.kind[1]: unknown residual 'postnorm'" in joined
    assert len(msgs) == 6


def test_bad_name_missing_model_and_empty_grid():
    msg = only(exp(head="name: ../escape\n"))
    assert msg.startswith("exp.yaml:1:7: name: '../escape' cannot name a results folder")
    msg = only("name: demo\nseeds: [0]\n")
    assert msg.startswith("exp.yaml:1:1: model: Field required")
    msg = only(exp("grid: {n_layers: []}\n"))
    assert msg.startswith("exp.yaml:11:8: grid.n_layers: List should have at least 1 item")
    assert only("- a\n- b\n").startswith("exp.yaml:1:1: (top level): expected a mapping")


def test_plugin_that_fails_points_at_its_entry(tmp_path):
    msg = only(exp("plugins:\n  - no_such_module_xyz\n"), base_dir=tmp_path)
    assert msg.startswith("exp.yaml:12:5: plugins[0]: plugin 'no_such_module_xyz' could not be loaded")
    assert "ModuleNotFoundError" in msg
    msgs = errors(exp(), extra_plugins=[str(tmp_path / "missing.py")])
    assert msgs[0].startswith(f"--plugin {tmp_path / 'missing.py'}: plugin")


def test_missing_file():
    with pytest.raises(InputError, match="no such file"):
        load_experiment(Path("/nonexistent/exp.yaml"))
