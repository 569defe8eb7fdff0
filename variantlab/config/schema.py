"""JSON Schema of the experiment file, for editors (yaml-language-server) and checks.

The schema is generated, never written by hand: the top level and ``data`` come from their
pydantic models, ``measure`` from the registered probes' settings models; ``model`` is a
``oneOf`` over the registered families (discriminated by ``family``), each component slot
a ``oneOf`` over the registered kinds' own spec schemas (discriminated by ``kind``, or the
string shorthand ``norm: layer``);
``grid`` and ``variants[].set`` list every dotted path a model of some registered family
can take, each with the schema of its value. Plugins loaded into the registry (``--plugin``)
appear like the built-ins. A new field in any of these models appears without a change here.

The schema checks the file as written, with what a schema can say: types, ranges, choices,
unknown keys. What needs the whole experiment (``n_heads`` dividing ``emb_dim``, ``seq_len``
within ``context_length``, a ``baseline`` that names a variant, a data path that exists) is
left to ``variantlab validate``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from ..plugin.registry import SLOTS, Registry, build_registry
from .catalog import plugin_rows

DIALECT = "http://json-schema.org/draft-07/schema#"  # yaml-language-server: draft 7
TITLE = "variantlab experiment"
DEFS = "definitions"
REF = "#/definitions/{model}"

#: Descriptions for keys whose pydantic field has none (a Field description always wins).
FALLBACK: dict[str, dict[str, str]] = {
    "ExperimentSpec": {
        "name": "names the run folder (OUT/<name>/): letters, digits, '.', '_' and '-'",
        "description": "free text shown at the top of the report",
        "seeds": "one unit per variant, seed and probe; each seed initialises the model "
                 "(torch.manual_seed) and draws the data",
        "model": "the base model: a family, its sizes and one component per slot",
        "grid": "dotted paths into model, each with a list of values: one variant per "
                "combination (cartesian product)",
        "variants": "named variants, each a set of dotted-path overrides of the base model",
        "baseline": "the variant the report compares against (default: the first variant)",
        "plugins": "extra plugin modules or .py files (relative to the experiment file)",
        "data": "what the token models read: {source: synthetic | text | stdlib | hf_disk, "
                "...}",
        "measure": "the probes to run, each with its settings; an absent probe is skipped",
    },
    "NamedVariant": {
        "name": "the variant's name in tables and the report",
        "set": "dotted path -> value, applied to the base model",
    },
    "SyntheticData": {
        "source": "synthetic", "task": "random: uniform tokens; recall: associative recall",
    },
    "TextData": {
        "source": "text", "path": "a file or glob (** allowed), relative to the experiment file",
        "tokenizer": "gpt2: GPT-2 BPE, ids folded into vocab_size; bytes: UTF-8 bytes, "
                     "256 ids, never folded",
        "val_fraction": "share of the documents held out for validation (val_loss; unset: "
                        "sized for held-out scoring)",
        "test_fraction": "share of the documents held out for testing (test_loss; unset: "
                         "sized for held-out scoring)",
    },
    "StdlibData": {
        "source": "stdlib",
        "max_files": "read the first N .py files of the standard library (null: all)",
        "tokenizer": "gpt2: GPT-2 BPE, ids folded into vocab_size; bytes: UTF-8 bytes, "
                     "256 ids, never folded",
        "val_fraction": "share of the documents held out for validation (val_loss; unset: "
                        "sized for held-out scoring)",
        "test_fraction": "share of the documents held out for testing (test_loss; unset: "
                         "sized for held-out scoring)",
    },
    "HFDiskData": {
        "source": "hf_disk",
        "path": "a save_to_disk folder, or parquet/jsonl/json/csv files (a path or glob)",
        "column": "the column whose rows are the documents",
        "tokenizer": "gpt2: GPT-2 BPE, ids folded into vocab_size; bytes: UTF-8 bytes, "
                     "256 ids, never folded",
        "val_fraction": "share of the documents held out for validation (val_loss; unset: "
                        "sized for held-out scoring)",
        "test_fraction": "share of the documents held out for testing (test_loss; unset: "
                         "sized for held-out scoring)",
    },
}



def experiment_schema(registry: Registry | None = None) -> dict[str, Any]:
    """The JSON Schema of an experiment file for the kinds in ``registry`` (default: the
    built-ins and installed plugins)."""
    from .experiment import ExperimentSpec

    registry = registry or build_registry()
    families = registry.components("family")
    parts = [(c.slot, c.kind, c.spec_cls) for s in SLOTS for c in registry.components(s)]
    probes = registry.probes()
    classes: list[type[BaseModel]] = [
        ExperimentSpec, *(c.spec_cls for c in families), *(cls for _, _, cls in parts),
        *(p.settings_cls for p in probes)]
    refs, top = models_json_schema([(cls, "validation") for cls in dict.fromkeys(classes)],
                                   ref_template=REF)
    defs = top.get("$defs", {})
    name_of = {cls: ref["$ref"].rsplit("/", 1)[1] for (cls, _), ref in refs.items()}
    for def_name, fields in FALLBACK.items():
        if def_name in defs:
            _fill_descriptions(defs[def_name], fields)
    docs = {(r["slot"], r["kind"]): r["doc"] for r in plugin_rows(registry)}
    _component_defs(defs, registry, parts, name_of, docs)
    _nested_slots(defs)
    family_refs = _family_defs(defs, families, name_of, docs)
    paths = _override_paths(defs, families, name_of, parts)
    for probe in probes:  # setting axes: measure.<probe>.<setting> (config/axes.py)
        for key, prop in defs[name_of[probe.settings_cls]].get("properties", {}).items():
            paths[f"measure.{probe.name}.{key}"] = {
                **{k: v for k, v in prop.items() if k not in ("title", "default")},
                "description": f"probe {probe.name}'s setting (a setting axis; the probe must "
                               f"run): {prop.get('description', key)}"}
    root = _root(defs, defs.pop(name_of[ExperimentSpec]), family_refs, paths)
    root["properties"]["measure"] = _measure_schema(
        root["properties"]["measure"].get("description", ""),
        {p.name: name_of[p.settings_cls] for p in probes})
    return _prune({"$schema": DIALECT, "title": TITLE, **root, DEFS: defs})


def schema_json(registry: Registry | None = None) -> str:
    """:func:`experiment_schema` as indented JSON text."""
    return json.dumps(experiment_schema(registry), indent=2, sort_keys=False) + "\n"


def write_schema(path: str | Path, registry: Registry | None = None) -> Path:
    """Write :func:`schema_json` to ``path``; raises ``OSError`` when it cannot."""
    path = Path(path)
    path.write_text(schema_json(registry), encoding="utf-8")
    return path


# -- pieces ------------------------------------------------------------------------------
def _default_family() -> str:
    from ..model.specs import ModelSpec

    return ModelSpec.model_fields["family"].default


def _fill_descriptions(node: dict[str, Any], fields: dict[str, str]) -> None:
    for key, text in fields.items():
        prop = node.get("properties", {}).get(key)
        if prop is not None and not prop.get("description"):
            prop["description"] = text


def _claim(defs: dict, name: str, key: str, value: str, what: str, doc: str,
           required: bool = True) -> str:
    """Pin ``key`` to ``value`` in the def ``name`` (a copy if another kind took it); the
    kind's one-line doc becomes its description (hover text in editors)."""
    node = defs[name]
    if node.get("x-variantlab") not in (None, what):
        name = f"{name}.{value}"
        node = defs[name] = copy.deepcopy(node)
    node["x-variantlab"] = what
    node["title"] = what
    node["description"] = doc or node.get("description", "")
    prop = node.setdefault("properties", {}).setdefault(key, {})
    default = prop.get("default")
    prop.clear()
    prop.update({"const": value, "description": f"{what}: {doc}" if doc else what})
    if default is not None and not required:
        prop["default"] = default
    node["required"] = [k for k in node.get("required", []) if k != key]
    if required:
        node["required"].insert(0, key)
    return name


def _ref(name: str) -> str:
    return REF.format(model=name)


def _component_defs(defs: dict, registry: Registry, parts: list[tuple[str, str, type]],
                    name_of: dict, docs: dict) -> None:
    """Each kind's def pinned to its ``kind``; one ``slot.<slot>`` def per slot choosing among
    them (or the kind's name alone)."""
    slot_refs: dict[str, list[str]] = {s: [] for s in SLOTS}
    for slot, kind, cls in parts:
        slot_refs[slot].append(_claim(defs, name_of[cls], "kind", kind, f"{slot} {kind!r}",
                                      docs.get((slot, kind), "")))
    for slot in SLOTS:
        defs[f"slot.{slot}"] = _slot_schema(slot, registry.kinds(slot), slot_refs[slot])


def _family_defs(defs: dict, families: list, name_of: dict, docs: dict) -> list[dict]:
    """Each family's def pinned to its ``family`` (required but for the default family), its
    slots pointing at the slot defs; the refs of the families."""
    default_family = _default_family()
    family_refs = []
    for comp in families:
        name = _claim(defs, name_of[comp.spec_cls], "family", comp.kind, f"family {comp.kind!r}",
                      docs.get(("family", comp.kind), ""), required=comp.kind != default_family)
        props = defs[name].setdefault("properties", {})
        for slot in SLOTS:
            if slot in props:
                desc = props[slot].get("description", f"the {slot} component")
                props[slot] = {"allOf": [{"$ref": _ref(f"slot.{slot}")}], "description": desc}
        defs[name]["required"] = [k for k in defs[name].get("required", []) if k not in SLOTS]
        family_refs.append({"$ref": _ref(name)})
    return family_refs


def _root(defs: dict, root: dict, family_refs: list[dict], paths: dict) -> dict[str, Any]:
    """The top level: ``model`` a choice of families, ``grid`` and ``variants[].set`` over
    the dotted paths, each data source with its ``source`` required."""
    from .experiment import SAFE_NAME

    root = copy.deepcopy(root)
    root.pop("title", None)
    props = root["properties"]
    props["name"]["pattern"] = SAFE_NAME
    props["seeds"]["uniqueItems"] = True  # a repeated seed would measure the same unit twice
    props["model"] = {"description": props["model"].get("description", ""),
                      "oneOf": family_refs or [{"type": "object"}]}
    props["grid"] = _grid_schema(props["grid"].get("description", ""), paths)
    named = defs[props["variants"]["items"]["$ref"].rsplit("/", 1)[1]]
    named["properties"]["set"] = _set_schema(named["properties"]["set"].get("description", ""),
                                             paths)
    for source in _data_defs(defs):
        source["required"] = ["source", *[r for r in source.get("required", []) if r != "source"]]
    return root


def _measure_schema(description: str, settings_defs: dict[str, str]) -> dict[str, Any]:
    """``measure``: one optional key per registered probe (plugin probes included), each
    its settings' def or null (not run); any other key is refused."""
    return {
        "type": "object", "description": description, "additionalProperties": False,
        "default": {"params": {}},
        "properties": {name: {"anyOf": [{"$ref": _ref(ref)}, {"type": "null"}]}
                       for name, ref in settings_defs.items()},
    }


def _slot_schema(slot: str, kinds: list[str], refs: list[str]) -> dict[str, Any]:
    shorthand = {"type": "string", "enum": kinds,
                 "description": "shorthand for {kind: NAME} with the kind's defaults"}
    return {
        "description": f"the {slot} component: {{kind: NAME, ...parameters}}",
        "oneOf": [shorthand, *({"$ref": _ref(r)} for r in refs)],
    }


def _data_defs(defs: dict) -> Iterator[dict]:
    from ..data.sources import HFDiskData, StdlibData, SyntheticData, TextData

    for cls in (SyntheticData, TextData, StdlibData, HFDiskData):
        if cls.__name__ in defs:
            yield defs[cls.__name__]


def _override_paths(defs: dict, families: list, name_of: dict,
                    parts: list[tuple[str, str, type]]) -> dict[str, dict[str, Any]]:
    """Dotted path -> schema of one value, over every family and every kind."""
    seen: dict[str, list[tuple[str, dict]]] = {}
    for comp in families:
        for key, prop in defs[name_of[comp.spec_cls]].get("properties", {}).items():
            if key == "family":
                continue
            seen.setdefault(key, []).append((f"family {comp.kind}", prop))
    for slot, kind, cls in parts:
        for key, prop in defs[name_of[cls]].get("properties", {}).items():
            if key != "kind":
                seen.setdefault(f"{slot}.{key}", []).append((f"{slot} {kind}", prop))
    paths: dict[str, dict[str, Any]] = {}
    if families:
        paths["family"] = {"enum": [c.kind for c in families], "description": "the model family"}
    for path, options in seen.items():
        paths[path] = _union(path, options)
    for slot in SLOTS:
        kinds = sorted({k for s, k, _ in parts if s == slot})
        paths[f"{slot}.kind"] = {"enum": kinds, "description": f"the {slot} kind"}
    return dict(sorted(paths.items()))


def _union(path: str, options: list[tuple[str, dict]]) -> dict[str, Any]:
    """One schema for a path that several families or kinds define, maybe differently."""
    where = ", ".join(w for w, _ in options)
    unique: dict[str, dict] = {}
    for _, prop in options:
        bare = {k: v for k, v in prop.items() if k not in ("description", "title", "default")}
        unique.setdefault(json.dumps(bare, sort_keys=True), bare)
    desc = next((p["description"] for _, p in options if p.get("description")), "")
    text = f"{desc} ({where})" if desc else f"({where})"
    if len(unique) == 1:
        return {**next(iter(unique.values())), "description": text}
    return {"anyOf": list(unique.values()), "description": text}


#: paths whose values are checked when the experiment loads, not by this schema: a layout's
#: pattern, layers and kinds (``layout.pattern``, ``layout.layers.N``, ``layout.kinds.NAME...``;
#: docs/experiments.md#layouts) and a data setting (``data.n_pairs``; #grid)
OPEN_PATHS = {
    r"^layout\.(pattern|layers\.[0-9]+|kinds\.[^.]+(\..+)?)$":
        "a layout path (layer kinds, pattern or one layer), checked when the file loads",
    r"^data\.[A-Za-z_][A-Za-z0-9_]*$":
        "a data setting of this variant (data.n_pairs, data.seq_len, ...), checked when the "
        "file loads",
}


def _axis(values: dict[str, Any], description: str) -> dict[str, Any]:
    """A grid axis: a list of values, ``{values: [...], extend: true | N}`` (a tuned axis
    extended beyond an edge where a best sits; docs/fair-comparisons.md), or named values
    ``{name: value, ...}`` (:mod:`variantlab.config.named`). One node of both types:
    ``items`` applies to the list, the ``anyOf`` to the mapping."""
    extend = {"anyOf": [{"type": "boolean"}, {"type": "integer", "minimum": 1, "maximum": 20}],
              "description": "extensions per edge (true: 3)"}
    item = values.get("items", {})
    return {**values, "type": ["array", "object"],
            "anyOf": [{"type": "array"},
                      {"type": "object", "required": ["values"],
                       "properties": {"values": dict(values), "extend": extend},
                       "additionalProperties": False},
                      {"type": "object", "minProperties": 1, "additionalProperties": item,
                       "not": {"anyOf": [{"required": ["values"]}, {"required": ["extend"]}]}}],
            "description": description}


def _grid_schema(description: str, paths: dict[str, dict]) -> dict[str, Any]:
    props = {p: _axis({"type": "array", "minItems": 1,
                       "items": {k: v for k, v in s.items() if k != "description"}},
                      "a list of values, or a mapping from a name to each value; "
                      + s["description"]) for p, s in paths.items()}
    open_paths = {pattern: _axis({"type": "array", "minItems": 1}, "a list of values; " + text)
                  for pattern, text in OPEN_PATHS.items()}
    return {"type": "object", "description": description, "properties": props,
            "patternProperties": open_paths, "additionalProperties": False}


def _set_schema(description: str, paths: dict[str, dict]) -> dict[str, Any]:
    open_paths = {pattern: {"description": text} for pattern, text in OPEN_PATHS.items()}
    return {"type": "object", "description": description, "properties": dict(paths),
            "patternProperties": open_paths, "additionalProperties": False}


def _nested_slots(node: Any) -> None:
    """A component field inside another component (``qk_norm`` of ``mha``) names its slot with
    ``json_schema_extra={"variantlab_slot": SLOT}``: it takes that slot's kinds, ``none`` or
    null, instead of the generic ComponentSpec."""
    if isinstance(node, list):
        for value in node:
            _nested_slots(value)
        return
    if not isinstance(node, dict):
        return
    for key, value in list(node.items()):
        if isinstance(value, dict) and isinstance(value.get("variantlab_slot"), str):
            slot = value["variantlab_slot"]
            node[key] = {"anyOf": [{"$ref": _ref(f"slot.{slot}")}, {"const": "none"},
                                   {"type": "null"}],
                         **{k: value[k] for k in ("description", "default", "title")
                            if k in value}}
        else:
            _nested_slots(value)


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(_ref("")):
            yield ref[len(_ref("")):]
        for key, value in node.items():
            if key != DEFS:
                yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def _prune(schema: dict[str, Any]) -> dict[str, Any]:
    """Drop the defs nothing refers to (the generic ComponentSpec, say)."""
    defs, keep, todo = schema[DEFS], set(), list(_refs(schema))
    while todo:
        name = todo.pop()
        if name not in keep and name in defs:
            keep.add(name)
            todo += list(_refs(defs[name]))
    schema[DEFS] = {k: v for k, v in defs.items() if k in keep}
    for node in schema[DEFS].values():
        node.pop("x-variantlab", None)
    return _wrap_refs(schema)


def _wrap_refs(node: Any) -> Any:
    """``{"$ref": R, "description": D}`` -> ``{"allOf": [{"$ref": R}], "description": D}``:
    draft 7 ignores the siblings of ``$ref``, editors would lose the description."""
    if isinstance(node, list):
        return [_wrap_refs(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _wrap_refs(v) for k, v in node.items()}
    if "$ref" in out and len(out) > 1:
        out = {"allOf": [{"$ref": out.pop("$ref")}], **out}
    return out
