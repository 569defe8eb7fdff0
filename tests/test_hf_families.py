"""`variantlab families` (issue 41.4-5): every causal-LM class of the installed transformers
listed once, as both ways / import only / refused with a one-line reason, from the one
registry of family modules; the table in docs/transformers.md equal to the command's; and
refusals that name the config option instead of failing on a missing weight."""

import json
import re
import sys
from pathlib import Path

import pytest
import torch
from conftest import invoke

transformers = pytest.importorskip("transformers")
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES  # noqa: E402

import variantlab as vl  # noqa: E402
from variantlab import hf  # noqa: E402
from variantlab.hf import ConversionError, from_transformers  # noqa: E402
from variantlab.hf.families import (  # noqa: E402
    BOTH,
    IMPORT,
    NO_FAMILY,
    REFUSED,
    families,
    family,
    markdown,
)

REG = vl.get_registry()
DOC = Path(__file__).resolve().parent.parent / "docs" / "transformers.md"


def test_every_installed_class_is_listed_once_with_its_status():
    rows = families()
    names = [r.cls for r in rows]
    assert len(names) == len(set(names))
    assert set(names) == set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()) | set(hf.CONVERTERS)
    for r in rows:
        assert r.status in (BOTH, IMPORT, REFUSED)
        assert (r.status != REFUSED) == (r.cls in hf.CONVERTERS)
        assert (r.status == BOTH) == (r.cls in hf.CONVERTERS and r.cls in hf.SUPPORTED)
        assert bool(r.reason) == (r.status == REFUSED) and "\n" not in r.reason
    statuses = {r.cls: r.status for r in rows}
    assert statuses["Qwen2ForCausalLM"] == statuses["Phi3ForCausalLM"] == BOTH
    assert statuses["MixtralForCausalLM"] == IMPORT
    assert sum(s != REFUSED for s in statuses.values()) == len(hf.CONVERTERS) >= 23


def test_a_new_class_is_refused_not_a_crash_and_registering_one_converts_it(monkeypatch):
    assert family("BrandNewForCausalLM").status == REFUSED
    assert families(["BrandNewForCausalLM"])[0].reason == NO_FAMILY
    monkeypatch.setitem(hf.CONVERTERS, "BrandNewForCausalLM", hf.CONVERTERS["LlamaForCausalLM"])
    assert family("BrandNewForCausalLM").status == IMPORT
    monkeypatch.setattr(hf, "SUPPORTED", (*hf.SUPPORTED, "BrandNewForCausalLM"))
    from variantlab.hf import families as listing

    monkeypatch.setattr(listing, "SUPPORTED", hf.SUPPORTED)
    assert family("BrandNewForCausalLM").status == BOTH


def test_from_transformers_of_a_refused_class_gives_its_reason():
    config = transformers.BertConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=1,
                                     intermediate_size=48, vocab_size=64, is_decoder=True)
    with pytest.raises(ConversionError, match="BertLMHeadModel is not supported: an encoder "
                       r"\(BERT-style.*`variantlab families` lists what converts") as info:
        from_transformers(transformers.BertLMHeadModel(config), REG)
    assert "\n" not in str(info.value)


def test_the_command_and_the_docs_table():
    rows = families()
    shown = invoke("families", "--markdown")
    assert shown.exit_code == 0 and shown.output == markdown(rows)
    page = DOC.read_text()
    found = re.search(r"<!-- families: generated[^\n]*-->\n(.*?)<!-- end families -->", page,
                      re.S)
    assert found is not None and found.group(1) == shown.output, \
        "regenerate docs/transformers.md's table with `variantlab families --markdown`"
    listed = json.loads(invoke("families", "--json").output)
    assert [(d["class"], d["converts"], d["reason"]) for d in listed] == \
        [(r.cls, r.status, r.reason) for r in rows]
    plain = invoke("families").output
    assert "Qwen2ForCausalLM" in plain and markdown(rows).splitlines()[0] in plain


def test_a_transformers_older_than_the_checked_one_converts_nothing(monkeypatch):
    """On transformers 5.17 Mamba-2's and Bamba's logits differed from ours without an
    error; conversions refuse any release older than the one the equality tests ran on,
    in both directions, and `families` says so under its listing."""
    from variantlab.hf.common import TESTED_TRANSFORMERS, check_transformers

    config = transformers.LlamaConfig(**BASE, intermediate_size=48)
    model = transformers.LlamaForCausalLM(config)
    spec, ours = from_transformers(model, REG)  # the installed release is checked
    # the module `import transformers` gives now (its lazy stand-in, not importorskip's)
    installed = sys.modules["transformers"]
    monkeypatch.setattr(installed, "__version__", "5.17.0")
    for convert in (lambda: from_transformers(model, REG), lambda: hf.to_transformers(spec, ours)):
        with pytest.raises(ConversionError, match=re.escape(
                f"transformers 5.17.0 is installed; variantlab's conversions are checked against "
                f"transformers >= {TESTED_TRANSFORMERS} only")) as info:
            convert()
        assert f"pip install 'transformers>={TESTED_TRANSFORMERS}'" in str(info.value)
    plain = invoke("families")
    assert plain.exit_code == 0 and "LlamaForCausalLM" in plain.output
    assert "No class converts here" in plain.output and "5.17.0" in plain.output
    for newer in (TESTED_TRANSFORMERS, "5.25.0.dev0", "6.0.0"):
        monkeypatch.setattr(installed, "__version__", newer)
        check_transformers()
    monkeypatch.setattr(installed, "__version__", "not-a-version")
    with pytest.raises(ConversionError, match="transformers not-a-version is installed"):
        check_transformers()


def test_the_package_asks_for_the_transformers_it_is_checked_against():
    from packaging.version import Version

    from variantlab.hf.common import TESTED_TRANSFORMERS

    pyproject = (DOC.parent.parent / "pyproject.toml").read_text()
    floors = re.findall(r'"transformers>=([0-9.]+)"', pyproject)
    assert len(floors) == 2 and {Version(f) for f in floors} == {Version(TESTED_TRANSFORMERS)}
    assert Version(transformers.__version__) >= Version(TESTED_TRANSFORMERS)


BASE = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
            vocab_size=64, max_position_embeddings=64)


def built_then_changed(family, change, **kwargs):
    """A model built from one config whose config is then changed (a config from another
    checkpoint, or an older transformers that did not check it)."""
    config_cls = transformers.Gemma3TextConfig if family == "Gemma3" else getattr(
        transformers, f"{family}Config")
    config = config_cls(**BASE, **kwargs)
    model = getattr(transformers, f"{family}ForCausalLM")(config)
    for key, value in change.items():
        setattr(model.config, key, value)
    return model


@pytest.mark.parametrize("family, change, kwargs, match", [
    ("Gemma3", {"layer_types": ["sliding_attention"] * 5 + ["full_attention"]},
     dict(head_dim=8, intermediate_size=48),
     r"layer_types=\['sliding_attention'.*6 entries for num_hidden_layers=2; give one per"),
    ("Lfm2", {"layer_types": ["conv", "full_attention", "conv"]}, {},
     "layer_types=.*3 entries for num_hidden_layers=2"),
    ("Qwen3Next", {"layer_types": ["linear_attention", "full_attention", "linear_attention"]},
     dict(intermediate_size=48), "layer_types=.*3 entries for num_hidden_layers=2"),
    ("Lfm2", {"layer_types": ["full_attention", "conv"]}, dict(layer_types=["conv", "conv"]),
     "Lfm2ForCausalLM has no weight 'model.layers.0.self_attn.q_proj.weight' that its config "
     "implies"),
    ("Phi3", {"intermediate_size": 40}, dict(intermediate_size=48, pad_token_id=0,
                                             bos_token_id=1, eos_token_id=2),
     "Phi3ForCausalLM's weights do not have the shapes its config implies .*split_sizes"),
    ("Qwen2", {"vocab_size": 65}, dict(intermediate_size=48),
     "Qwen2ForCausalLM's weights do not have the shapes .*size mismatch for out_head"),
    ("SmolLM3", {"no_rope_layers": [1, 0, 1]}, dict(intermediate_size=48, pad_token_id=0,
                                                      bos_token_id=1, eos_token_id=2),
     r"no_rope_layers=\[1, 0, 1\]: 3 entries"),
])
def test_refusals_name_the_option_in_one_line(family, change, kwargs, match):
    torch.manual_seed(0)
    model = built_then_changed(family, change, **kwargs)
    with pytest.raises(ConversionError, match=match) as info:
        from_transformers(model, REG)
    assert "\n" not in str(info.value)


def test_a_config_transformers_rejects_is_one_line(monkeypatch):
    """transformers' own validation of an exported config (a ValueError with its traceback
    otherwise) becomes a ConversionError naming the class."""
    spec = vl.parse_model_spec({**BASE_SPEC}, REG)
    model = vl.build_model(spec, REG)

    def rejected(spec, cls):
        raise ValueError("Class validation error for validator 'validate_rope':\n"
                         "    ValueError: `rope_parameters`'s factor is wrong")

    monkeypatch.setattr(hf, "hf_config", rejected)
    with pytest.raises(ConversionError, match="LlamaForCausalLM refuses the exported config: "
                       "ValueError: `rope_parameters`'s factor is wrong") as info:
        vl.to_transformers(spec, model)
    assert "\n" not in str(info.value)


BASE_SPEC = {"family": "gpt", "vocab_size": 64, "context_length": 16, "emb_dim": 32,
             "n_heads": 4, "n_layers": 1, "drop_rate": 0.0, "norm": "rms",
             "feedforward": {"kind": "glu", "hidden_dim": 48}, "activation": "silu",
             "qkv_bias": False, "attn_out_bias": False, "positional": "rotary"}
