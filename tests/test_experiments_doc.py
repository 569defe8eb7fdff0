"""docs/experiments.md and the schema agree: every documented key exists, every key of the
schema is documented, and every example in the key tables loads.

The page's tables follow one convention: a table of keys (first header cell ``key``, last
``example``) documents the node its heading names in code (`` `measure.timing` ``, or
`` `data` with `source: text` ``; a heading without code is the top level); the components
table (first header cell ``slot``) lists each kind with its parameters as `` `name` (...)``.
"""

import copy
import re
import shutil
from pathlib import Path

import jsonschema
import pytest
import yaml
from click.testing import CliRunner

from variantlab.cli.main import main
from variantlab.config.experiment import experiment_from_text
from variantlab.config.schema import experiment_schema
from variantlab.plugin.registry import SLOTS, build_registry

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "experiments.md"
SCALENORM = ROOT / "examples" / "plugin-scalenorm" / "variantlab_scalenorm.py"
BASE = {
    "name": "doc-example",
    "seeds": [0],
    "model": {"family": "gpt", "vocab_size": 256, "context_length": 256, "emb_dim": 64,
              "n_heads": 4, "n_layers": 2, "drop_rate": 0.0},
    "measure": {"params": {}},
}


def code(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", text)


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def tables(text: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """(heading, header cells, rows) of every table on the page."""
    out, heading, lines, i = [], "", text.splitlines(), 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        elif line.startswith("|") and i + 1 < len(lines) and re.fullmatch(r"\|[-| ]+\|", lines[i + 1]):
            header, rows, i = cells(line), [], i + 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(cells(lines[i]))
                i += 1
            out.append((heading, header, rows))
            continue
        i += 1
    return out


TEXT = PAGE.read_text()
TABLES = tables(TEXT)
KEY_TABLES = [(h, rows) for h, header, rows in TABLES if header[0] == "key"]
KIND_ROWS = [row for _, header, rows in TABLES if header[0] == "slot" for row in rows]
HEADINGS = [line.lstrip("#").strip() for line in TEXT.splitlines() if line.startswith("#")]


def where(heading: str) -> tuple[str, tuple[str, str] | None]:
    """A heading's node: (dotted path, (discriminator, value) or None)."""
    spans = code(heading)
    if not spans:
        return "", None
    selector = tuple(s.strip() for s in spans[1].split(":")) if len(spans) > 1 else None
    return spans[0], selector


@pytest.fixture(scope="module")
def schema():
    return experiment_schema(build_registry(entry_points=False))


def deref(schema: dict, node: dict) -> dict:
    while True:
        if "$ref" in node:
            node = schema["definitions"][node["$ref"].rsplit("/", 1)[1]]
        elif len(node.get("allOf", [])) == 1:
            node = node["allOf"][0]
        elif "anyOf" in node:
            objects = [a for a in node["anyOf"] if a.get("type") != "null"]
            assert len(objects) == 1, node
            node = objects[0]
        elif node.get("type") == "array" and "items" in node:
            node = node["items"]
        else:
            return node


def node_at(schema: dict, path: str, selector: tuple[str, str] | None) -> dict:
    node = schema
    for part in filter(None, path.split(".")):
        node = deref(schema, deref(schema, node)["properties"][part])
    if "oneOf" not in node:
        return node
    key, value = selector or ("family", "gpt")
    options = [deref(schema, o) for o in node["oneOf"]]
    return next(o for o in options if o.get("properties", {}).get(key, {}).get("const") == value)


def documented(heading_path: str, selector=None) -> set[str]:
    return {code(row[0])[0] for h, rows in KEY_TABLES if where(h) == (heading_path, selector)
            for row in rows}


def test_the_page_has_its_tables():
    assert len(KEY_TABLES) >= 12 and len(KIND_ROWS) >= 18
    assert "docs/experiments.md" in (ROOT / "README.md").read_text()


@pytest.mark.parametrize(("heading", "rows"), KEY_TABLES, ids=[h for h, _ in KEY_TABLES])
def test_every_documented_key_is_in_the_schema(schema, heading, rows):
    node = node_at(schema, *where(heading))
    for row in rows:
        key = code(row[0])[0]
        assert key in node["properties"], f"{heading}: {key!r} is not in the schema"


def test_every_key_of_the_schema_is_documented(schema):
    def props(path, selector=None):
        return set(node_at(schema, path, selector).get("properties", {}))

    assert props("") == documented("")
    assert props("variants") == documented("variants")
    assert props("model") == documented("model")  # the keys every family takes
    families = schema["properties"]["model"]["oneOf"]
    for option in families:
        family = deref(schema, option)["properties"]["family"]["const"]
        own = props("model", ("family", family)) - props("model")
        docs = documented("model", ("family", family))
        assert own <= docs <= props("model", ("family", family)), family
    for option in schema["properties"]["data"]["oneOf"]:
        source = deref(schema, option)["properties"]["source"]["const"]
        assert props("data", ("source", source)) == documented("data", ("source", source))
    for probe in props("measure"):
        assert f"`measure.{probe}`" in HEADINGS
        assert props(f"measure.{probe}") == documented(f"measure.{probe}"), probe


def test_every_kind_and_parameter_is_documented(schema):
    registry = build_registry(entry_points=False)
    listed: dict[tuple[str, str], set[str]] = {}
    for row in KIND_ROWS:
        slot, kind = code(row[0])[0], code(row[1])[0]
        assert (slot, kind) not in listed, f"{slot} {kind} documented twice"
        listed[(slot, kind)] = set(re.findall(r"`(\w+)` \(", row[2]))
    assert set(listed) == {(s, k) for s in SLOTS for k in registry.kinds(s)}
    defs = schema["definitions"]
    for slot in SLOTS:
        for option in defs[f"slot.{slot}"]["oneOf"][1:]:
            node = deref(schema, option)
            kind = node["properties"]["kind"]["const"]
            assert listed[(slot, kind)] == set(node["properties"]) - {"kind"}, (slot, kind)


def _example_docs(schema: dict) -> list[tuple[str, dict]]:
    """Each table's example placed into a small valid experiment, beside the examples of
    the keys its node requires (a text source's `path`, say)."""
    out = []
    for heading, rows in KEY_TABLES:
        path, selector = where(heading)
        required = set(node_at(schema, path, selector).get("required", [])) if path else set()
        needed = {k: v for row in rows if code(row[0])[0] in required
                  for k, v in yaml.safe_load(code(row[-1])[-1]).items()}
        for row in rows:
            key, example = code(row[0])[0], yaml.safe_load(code(row[-1])[-1])
            if not (isinstance(example, dict) and key in example):
                out.append((f"{heading}: {key}", f"the example {row[-1]} does not set {key!r}"))
                continue
            doc = copy.deepcopy(BASE)
            if path == "":
                doc.update(example)
            elif path == "variants":
                doc["variants"] = [{"name": "example", "set": {"n_layers": 3}, **example}]
            else:
                *head, last = path.split(".")
                node = doc
                for part in head:
                    node = node.setdefault(part, {})
                node[last] = {**(node.get(last) or {}), **(dict([selector]) if selector else {}),
                              **needed, **example}
            out.append((f"{heading}: {key}", doc))
    for row in KIND_ROWS:
        slot, example = code(row[0])[0], yaml.safe_load(code(row[-1])[-1])
        if not (isinstance(example, dict) and list(example) == [slot]):
            out.append((f"{slot} {code(row[1])[0]}", f"the example {row[-1]} sets more than {slot}"))
            continue
        doc = copy.deepcopy(BASE)
        doc["model"].update(example)
        out.append((f"{slot} {code(row[1])[0]}", doc))
    return out


EXAMPLES = _example_docs(experiment_schema(build_registry(entry_points=False)))


@pytest.mark.parametrize(("what", "doc"), EXAMPLES, ids=[w for w, _ in EXAMPLES])
def test_every_example_loads_and_fits_the_schema(schema, tmp_path, what, doc):
    assert not isinstance(doc, str), doc
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text((ROOT / "README.md").read_text() * 4)
    shutil.copy(SCALENORM, tmp_path / SCALENORM.name)
    assert [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(doc)] == []
    exp = experiment_from_text(yaml.safe_dump(doc, sort_keys=False), tmp_path / "exp.yaml")
    assert exp.variants


def test_validate_says_what_base_is_when_variants_add_it(tmp_path):
    doc = {**copy.deepcopy(BASE), "variants": [{"name": "rms", "set": {"norm.kind": "rms"}}]}
    path = tmp_path / "named.yaml"
    path.write_text(yaml.safe_dump(doc))
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert "2 variant(s)" in result.output
    assert "base: the model under `model:` as written" in result.output
    doc["grid"] = {"n_layers": [1, 2]}
    path.write_text(yaml.safe_dump(doc))
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert "3 variant(s)" in result.output and "base: the model" not in result.output
