"""Every built-in kind says what it is and what each of its parameters means, and
`variantlab plugins` shows it (table and --json)."""

import json
import textwrap

import pytest
from click.testing import CliRunner

import variantlab
from variantlab.cli.main import main
from variantlab.config.catalog import plugin_rows
from variantlab.plugin.registry import ALL_SLOTS


@pytest.fixture(scope="module")
def builtin_rows():
    registry = variantlab.build_registry(entry_points=False)
    return plugin_rows(registry)


def test_every_builtin_kind_and_parameter_is_described(builtin_rows):
    assert {r["slot"] for r in builtin_rows} == set(ALL_SLOTS) | {"probe", "executor"}
    undocumented = [f"{r['slot']}.{r['kind']}" for r in builtin_rows if not r["doc"].strip()]
    assert not undocumented, f"kinds without a docstring: {undocumented}"
    missing = [f"{r['slot']}.{r['kind']}.{p['name']}" for r in builtin_rows
               for p in r["params"] if not p["description"].strip()]
    assert not missing, f"parameters without a description: {missing}"


def test_doc_is_one_line_and_families_describe_their_own_fields(builtin_rows):
    rows = {(r["slot"], r["kind"]): r for r in builtin_rows}
    assert all("\n" not in r["doc"] for r in builtin_rows)
    assert rows[("norm", "rms")]["doc"].startswith("RMSNorm (Zhang & Sennrich 2019)")
    mlp = {p["name"]: p for p in rows[("family", "mlp")]["params"]}
    assert "widths" in mlp["layer_sizes"]["description"]
    assert "input rows" in mlp["inputs"]["description"]
    gpt = {p["name"]: p for p in rows[("family", "gpt")]["params"]}
    assert "output projection" in gpt["tie_weights"]["description"]


def test_doc_falls_back_to_the_build_docstring(tmp_path):
    (tmp_path / "undocumented_spec.py").write_text(textwrap.dedent('''\
        from typing import Literal

        from torch import nn

        from variantlab import ComponentSpec, hookimpl


        class BareSpec(ComponentSpec):
            kind: Literal["bare"] = "bare"


        def build(spec, dim):
            """Identity norm, documented on its build.

            Details that stay out of the summary.
            """
            return nn.Identity()


        @hookimpl
        def register_norms(register):
            register("bare", BareSpec, build)
        '''))
    registry = variantlab.build_registry(extra=["undocumented_spec.py"], base_dir=tmp_path,
                                         entry_points=False)
    rows = {r["kind"]: r for r in plugin_rows(registry, "norm")}
    assert rows["bare"]["doc"] == "Identity norm, documented on its build."


def test_plugins_command_shows_descriptions():
    rows = {r["kind"]: r for r in plugin_rows(variantlab.build_registry(entry_points=False),
                                              "norm")}
    eps = next(p for p in rows["rms"]["params"] if p["name"] == "eps")
    runner = CliRunner()
    result = runner.invoke(main, ["plugins", "--slot", "norm"])
    assert result.exit_code == 0, result.output
    assert "description" in result.output and "parameters" in result.output
    assert rows["rms"]["doc"][:30] in result.output
    assert eps["description"] in result.output

    result = runner.invoke(main, ["plugins", "--slot", "norm", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert set(data) == {"components", "failures"}
    rms = next(r for r in data["components"] if r["kind"] == "rms")
    assert set(rms) == {"slot", "kind", "plugin", "source", "doc", "params"}
    assert rms["doc"] == rows["rms"]["doc"]
    assert {"name": "eps", "type": "float (> 0)", "default": 1e-05,
            "description": eps["description"]} in rms["params"]
