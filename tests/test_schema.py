"""`variantlab schema`: the JSON Schema of the experiment file is valid, accepts every real
experiment, refuses what the loader refuses, and follows the registry."""

import copy
import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml
from click.testing import CliRunner
from conftest import SCALENORM, doc_plugins

from variantlab.cli.main import main
from variantlab.config.experiment import InputError, experiment_from_text
from variantlab.config.schema import DIALECT, experiment_schema, schema_json
from variantlab.model.specs import ModelSpec
from variantlab.plugin.registry import SLOTS, build_registry

ROOT = Path(__file__).resolve().parent.parent

EXPERIMENTS = sorted((ROOT / "experiments").glob("*.yaml")) + [ROOT / "tests/golden/tiny-norms.yaml"]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DOC_BLOCKS = [(doc, m.group(1)) for doc in DOCS
              for m in re.finditer(r"```yaml\n(.*?)```", doc.read_text(), re.S)
              if re.search(r"^name:", m.group(1), re.M) and re.search(r"^model:", m.group(1), re.M)]
TINY_EXP = {
    "name": "tiny",
    "seeds": [0, 1],
    "model": {"family": "gpt", "vocab_size": 64, "context_length": 32, "emb_dim": 32,
              "n_heads": 4, "n_layers": 2, "drop_rate": 0.0},
    "grid": {"norm.kind": ["layer", "rms"]},
    "data": {"source": "synthetic", "task": "recall"},
    "measure": {"params": {}, "gradients": {"batch_size": 2, "seq_len": 16, "batches": 1}},
}


@pytest.fixture(scope="module")
def schema():
    return experiment_schema(build_registry(entry_points=False))


@pytest.fixture(scope="module")
def validator(schema):
    return jsonschema.Draft7Validator(schema)


def errors(validator, doc) -> list[str]:
    return [e.message for e in validator.iter_errors(doc)]


def test_the_schema_is_valid_draft_07(schema):
    assert schema["$schema"] == DIALECT == "http://json-schema.org/draft-07/schema#"
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert json.loads(json.dumps(schema)) == schema  # plain JSON, nothing Python-only


def test_every_reference_resolves(schema):
    text = json.dumps(schema)
    refs = set(re.findall(r'"\$ref": "#/definitions/([^"]+)"', text))
    assert refs and refs <= set(schema["definitions"])
    assert "ComponentSpec" not in schema["definitions"]  # the generic base is pruned


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.name)
def test_every_example_experiment_validates(validator, path):
    assert errors(validator, yaml.safe_load(path.read_text())) == []


@pytest.mark.parametrize(("doc", "text"), DOC_BLOCKS,
                         ids=[f"{d.name}#{i}" for i, (d, _) in enumerate(DOC_BLOCKS)])
def test_every_experiment_in_the_docs_validates(doc, text, tmp_path):
    plugins = doc_plugins(text, tmp_path)
    registry = build_registry(extra=plugins, entry_points=False)
    assert errors(jsonschema.Draft7Validator(experiment_schema(registry)), yaml.safe_load(text)) == []


def test_the_tiny_experiment_is_valid_for_both(validator):
    assert errors(validator, TINY_EXP) == []
    assert len(experiment_from_text(yaml.safe_dump(TINY_EXP), "tiny.yaml").variants) == 2


def _set(path: str, value):
    def edit(doc):
        *head, last = path.split("/")
        node = doc
        for key in head:
            node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
        node[last] = value
    return edit


def _drop(path: str):
    def edit(doc):
        *head, last = path.split("/")
        node = doc
        for key in head:
            node = node[key]
        del node[last]
    return edit


INVALID = {
    "unknown top-level key": _set("seed", [1]),
    "missing name": _drop("name"),
    "missing model": _drop("model"),
    "name with a slash": _set("name", "a/b"),
    "seeds not a list": _set("seeds", 3),
    "seeds empty": _set("seeds", []),
    "seed a string": _set("seeds", ["one"]),
    "unknown model key": _set("model/n_layer", 2),
    "n_layers a string": _set("model/n_layers", "two"),
    "n_layers zero": _set("model/n_layers", 0),
    "drop_rate one": _set("model/drop_rate", 1.0),
    "qkv_bias a list": _set("model/qkv_bias", [True]),
    "unknown family": _set("model/family", "transformer"),
    "key of another family": _set("model/layer_sizes", [3, 1]),
    "unknown attention kind": _set("model/attention", {"kind": "flash"}),
    "unknown kind shorthand": _set("model/positional", "yarn"),
    "component without kind": _set("model/attention", {"impl": "sdpa"}),
    "parameter of another kind": _set("model/norm", {"kind": "rms", "momentum": 0.1}),
    "parameter out of range": _set("model/norm", {"kind": "layer", "eps": -1.0}),
    "component a number": _set("model/attention", 3),
    "unknown grid path": _set("grid/norm.epss", [1.0e-6]),
    "grid value not a list": _set("grid/n_layers", 2),
    "grid list empty": _set("grid/n_layers", []),
    "unknown kind in the grid": _set("grid/norm.kind", ["layer", "scael"]),
    "wrong type in the grid": _set("grid/n_layers", [2, "four"]),
    "variant without name": _set("variants", [{"set": {"n_layers": 3}}]),
    "unknown variant key": _set("variants", [{"name": "v", "sets": {"n_layers": 3}}]),
    "unknown set path": _set("variants", [{"name": "v", "set": {"nlayers": 3}}]),
    "baseline a number": _set("baseline", 3),
    "plugins a string": _set("plugins", "my_norms.py"),
    "unknown data source": _set("data", {"source": "txt"}),
    "data without source": _set("data", {"task": "recall"}),
    "unknown recall task": _set("data", {"source": "synthetic", "task": "copy"}),
    "text without path": _set("data", {"source": "text"}),
    "key of another source": _set("data", {"source": "stdlib", "path": "x.txt"}),
    "max_files zero": _set("data", {"source": "stdlib", "max_files": 0}),
    "unknown probe": _set("measure/loss", {}),
    "unknown probe setting": _set("measure/gradients/batchsize", 4),
    "batch_size a list": _set("measure/gradients/batch_size", [4]),
    "gradients mode": _set("measure/gradients/mode", "test"),
    "timing pass": _set("measure/timing", {"passes": ["forward", "sideways"]}),
    "timing device": _set("measure/timing", {"device": "gpu"}),
    "training dtype": _set("measure/training", {"dtype": "float64"}),
    "training lr zero": _set("measure/training", {"lr": 0}),
    "params with a setting": _set("measure/params", {"layers": True}),
}


@pytest.mark.parametrize("edit", list(INVALID.values()), ids=list(INVALID))
def test_invalid_documents_are_refused_by_schema_and_loader(validator, edit):
    doc = copy.deepcopy(TINY_EXP)
    edit(doc)
    assert errors(validator, doc), "the schema accepted it"
    with pytest.raises(InputError):
        experiment_from_text(yaml.safe_dump(doc), "bad.yaml")


#: Refused by the schema: values of the wrong type that lax pydantic would coerce, and a
#: repeated seed (the loader refuses these too once its specs are strict, issue 10 item 5).
COERCIBLE = {
    "repeated seed": _set("seeds", [0, 0]),
    "n_layers true": _set("model/n_layers", True),
    "n_layers a numeric string": _set("model/n_layers", "16"),
    "qkv_bias a string": _set("model/qkv_bias", "yes"),
    "lr a string": _set("measure/training", {"lr": "1e-3"}),
    "batch_size a float": _set("measure/gradients/batch_size", 4.5),
    "seed a numeric string": _set("seeds", ["1"]),
}


@pytest.mark.parametrize("edit", list(COERCIBLE.values()), ids=list(COERCIBLE))
def test_values_of_the_wrong_type_are_refused_by_the_schema(validator, edit):
    doc = copy.deepcopy(TINY_EXP)
    edit(doc)
    assert errors(validator, doc)


VALID = {
    "string shorthand": _set("model/norm", "rms"),
    "kind and parameters": _set("model/norm", {"kind": "batch", "eps": 1.0e-6, "momentum": 0.2}),
    "family mlp with its keys": _set("model", {"family": "mlp", "layer_sizes": [3, 3, 1],
                                               "inputs": [[1, 0, -1]], "norm": "none"}),
    "family encoder": _set("model/mask_prob", 0.2),
    "whole slot in the grid": _set("grid", {"norm": ["layer", {"kind": "rms", "eps": 1.0e-6}]}),
    "sizes in the grid": _set("grid", {"n_layers": [1, 2], "attention.impl": ["naive", "sdpa"]}),
    "named variants": _set("variants", [{"name": "v", "set": {"residual.shortcut": False}}]),
    "text data": _set("data", {"source": "text", "path": "corpus/*.txt"}),
    "stdlib data, all files": _set("data", {"source": "stdlib", "max_files": None}),
    "probe with defaults": _set("measure/timing", {}),
    "probe set to null": _set("measure/training", None),
    "timing settings": _set("measure/timing", {"passes": ["step"], "dtype": "bfloat16",
                                               "device": "cuda:1", "peak_flops": None}),
}


@pytest.mark.parametrize("edit", list(VALID.values()), ids=list(VALID))
def test_valid_variations_are_accepted(validator, edit):
    doc = copy.deepcopy(TINY_EXP)
    if edit is VALID["family encoder"]:
        doc["model"]["family"] = "encoder"
    edit(doc)
    assert errors(validator, doc) == []


def test_slots_list_the_registered_kinds(schema):
    registry = build_registry(entry_points=False)
    defs = schema["definitions"]
    for slot in SLOTS:
        options = defs[f"slot.{slot}"]["oneOf"]
        assert options[0]["enum"] == registry.kinds(slot)  # the shorthand
        kinds = [defs[o["$ref"].rsplit("/", 1)[1]]["properties"]["kind"]["const"]
                 for o in options[1:]]
        assert sorted(kinds) == registry.kinds(slot)
        assert schema["properties"]["grid"]["properties"][f"{slot}.kind"]["items"]["enum"] == \
            registry.kinds(slot)


def test_families_are_discriminated_by_family(schema):
    defs = schema["definitions"]
    families = {defs[o["$ref"].rsplit("/", 1)[1]]["properties"]["family"]["const"]:
                defs[o["$ref"].rsplit("/", 1)[1]] for o in schema["properties"]["model"]["oneOf"]}
    assert set(families) == {"gpt", "encoder", "decoder", "encoder_decoder", "block", "mlp"}
    for name, node in families.items():  # only the default family may leave `family` out
        assert ("family" in node.get("required", [])) == (name != "gpt")
        assert not set(SLOTS) & set(node.get("required", []))
    assert "layer_sizes" in families["mlp"]["properties"]
    assert "layer_sizes" not in families["gpt"]["properties"]


def test_descriptions_come_from_the_specs(schema):
    defs = schema["definitions"]
    gpt = next(defs[o["$ref"].rsplit("/", 1)[1]] for o in schema["properties"]["model"]["oneOf"]
               if "family" not in defs[o["$ref"].rsplit("/", 1)[1]].get("required", []))
    assert gpt["properties"]["n_heads"]["description"] == \
        ModelSpec.model_fields["n_heads"].description
    assert defs["LayerNormSpec"]["properties"]["eps"]["description"] == \
        "added to the variance before the square root"
    assert defs["TimingSettings"]["properties"]["peak_flops"]["description"].startswith(
        "device peak FLOP/s")
    for key, prop in schema["properties"].items():
        assert prop.get("description"), f"top-level {key!r} has no description"
    grid = schema["properties"]["grid"]["properties"]
    assert "added to the variance before the square root" in grid["norm.eps"]["description"]


def test_plugin_kinds_and_families_appear(tmp_path):
    (tmp_path / "wide.py").write_text(
        "from typing import Literal\n"
        "from pydantic import Field\n"
        "from variantlab import ModelSpec, hookimpl\n"
        "from variantlab.model.tasks import NEXT_TOKEN\n"
        "from variantlab_plugins.models import GPTModel\n"
        "class WideSpec(ModelSpec):\n"
        "    '''A GPT with a width knob.'''\n"
        "    family: Literal['wide'] = 'wide'\n"
        "    width_mult: int = Field(2, ge=1, description='how much wider')\n"
        "@hookimpl\n"
        "def register_families(register):\n"
        "    register('wide', WideSpec, GPTModel, task=NEXT_TOKEN)\n")
    plain = jsonschema.Draft7Validator(experiment_schema(build_registry(entry_points=False)))
    registry = build_registry(extra=[str(SCALENORM), str(tmp_path / "wide.py")],
                              entry_points=False)
    schema = experiment_schema(registry)
    jsonschema.Draft7Validator.check_schema(schema)
    extended = jsonschema.Draft7Validator(schema)
    doc = copy.deepcopy(TINY_EXP)
    doc["model"].update(family="wide", width_mult=3, norm={"kind": "scale", "eps": 1.0e-6})
    doc["grid"] = {"norm.kind": ["layer", "scale"], "width_mult": [1, 2]}
    assert errors(extended, doc) == []
    assert errors(plain, doc)
    doc["model"]["width_mult"] = 0
    assert errors(extended, doc)
    assert "how much wider" in schema["properties"]["grid"]["properties"]["width_mult"]["description"]


def test_the_cli_prints_the_schema(tmp_path):
    runner = CliRunner()
    result = runner.invoke(main, ["schema"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == json.loads(schema_json(build_registry()))
    out = tmp_path / "experiment.schema.json"
    result = runner.invoke(main, ["schema", "--plugin", str(SCALENORM), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert str(out) in result.output
    written = json.loads(out.read_text())
    assert "scale" in written["definitions"]["slot.norm"]["oneOf"][0]["enum"]


def test_the_cli_refuses_bad_input(tmp_path):
    runner = CliRunner()
    result = runner.invoke(main, ["schema", "--plugin", "no_such_plugin_module"])
    assert result.exit_code == 2
    assert "no_such_plugin_module" in result.output and "Traceback" not in result.output
    target = tmp_path / "missing" / "schema.json"
    result = runner.invoke(main, ["schema", "--out", str(target)])
    assert result.exit_code == 2
    assert str(target) in result.output and "Traceback" not in result.output
    assert not target.exists()


def test_layout_and_data_paths_pass_the_schema_and_misspellings_do_not(validator):
    doc = copy.deepcopy(TINY_EXP)
    doc["model"]["layout"] = {"kinds": {"a": {}, "b": {"activation": "relu"}}, "pattern": ["a"]}
    doc["data"] = {"source": "synthetic", "task": "recall"}
    doc["grid"] = {"layout.pattern": [["a"], ["a", "b"]], "data.n_pairs": [2, 4]}
    assert errors(validator, doc) == []
    assert len(experiment_from_text(yaml.safe_dump(doc), "t.yaml").variants) == 4
    for bad in ("layout.patern", "data.", "layouts.pattern"):
        wrong = {**doc, "grid": {bad: [1, 2]}}
        assert any("unexpected" in e or "does not match any of the regexes" in e
                   for e in errors(validator, wrong)), bad
