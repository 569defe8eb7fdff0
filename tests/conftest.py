"""Shared fixtures: tiny models (emb_dim 32, 2 layers) keep the suite fast.

The suite keeps its compiled bytecode, first thing, before anything else is imported: with
``PYTHONDONTWRITEBYTECODE`` set (as some sandboxes and CI images do), every pytest worker
would otherwise rewrite and compile each test module and every variantlab module from
source, and so would every ``variantlab run`` a test starts in a subprocess (those inherit
the variable, but read what is in ``__pycache__``). Keeping it takes collection from about
15 s to 6 s per worker on two cores; the files are ignored by git and change no result.
Mutation testing (scripts/mutation) sets ``VARIANTLAB_NO_BYTECODE=1``: there a mutant's
bytecode must never be written, since a mutant of the original's size written within the
same second would pass for it later.
"""

import os
import sys

if os.environ.get("VARIANTLAB_NO_BYTECODE") != "1":
    sys.dont_write_bytecode = False

import re
import sqlite3
import textwrap
import warnings
from contextlib import closing
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from click.testing import CliRunner

from variantlab.cli.main import main

ROOT = Path(__file__).resolve().parent.parent

TINY = {
    "family": "gpt",
    "vocab_size": 64,
    "context_length": 32,
    "emb_dim": 32,
    "n_heads": 4,
    "n_layers": 2,
    "drop_rate": 0.0,
}


@pytest.fixture
def tiny() -> dict:
    """A tiny GPT spec mapping; copy and edit freely."""
    return dict(TINY)


@pytest.fixture(scope="session", autouse=True)
def _threads_per_worker():
    """Under pytest-xdist, each worker takes its share of the CPUs for torch (else N workers
    each run as many threads as there are CPUs and the heavy tests crawl side by side)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
    yield


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        yield


def store_of(run, folder: Path) -> Path:
    from variantlab.store.store import Store, UnitRecord

    """Write a RunData (see variantlab.testing.sample) into a real results store."""
    with Store(folder) as store:
        variants = run.variants[["name", "label", "spec", "overrides", "warnings"]]
        variants = variants.to_dict("records")
        plan = [(u["key"], u["variant"], int(u["seed"]), u["probe"])
                for _, u in run.units.iterrows()]
        store.write_experiment(run.meta, variants, plan)
        for _, u in run.units.iterrows():
            rows = run.rows[(run.rows["unit_key"] == u["key"]) & (run.rows["status"] == "ok")]
            records = [{k: (None if pd.isna(v) else v) if k in ("layer", "step") else v
                        for k, v in r.items()} for r in rows.to_dict("records")]
            store.save_unit(UnitRecord(key=u["key"], variant=u["variant"], seed=int(u["seed"]),
                                       probe=u["probe"], settings_json="{}", status=u["status"],
                                       error=None if pd.isna(u["error"]) else u["error"],
                                       device="cpu"), records)
    return folder


SCALENORM = ROOT / "examples" / "plugin-scalenorm" / "variantlab_scalenorm.py"


def quickstart_plugin(folder: Path) -> Path:
    """docs/plugins.md's plugin, written as ``folder/variantlab_scalenorm.py``."""
    page = (ROOT / "docs" / "plugins.md").read_text()
    code = next(b for b in re.findall(r"```python\n(.*?)```", page, re.S)
                if b.startswith("# variantlab_scalenorm.py"))
    path = folder / "variantlab_scalenorm.py"
    path.write_text(code)
    return path


def doc_plugins(text: str, folder: Path) -> list[str]:
    """Plugins a YAML block of the docs needs: the ScaleNorm example when it names a
    ``scale`` norm; docs/plugins.md's quickstart plugin and docs/probes.md's weight-norms
    probe written into ``folder`` (the block names them as files beside the experiment) when
    it names ``variantlab_scalenorm.py`` or ``weightnorms.py``."""
    plugins = [str(SCALENORM)] if "scale" in text else []
    if "variantlab_scalenorm.py" in text:
        plugins = [str(quickstart_plugin(folder))]
    if "weightnorms.py" in text:
        page = (ROOT / "docs" / "probes.md").read_text()
        code = next(b for b in re.findall(r"```python\n(.*?)```", page, re.S)
                    if "# weightnorms.py" in b)
        (folder / "weightnorms.py").write_text(code)
        plugins.append(str(folder / "weightnorms.py"))
    return plugins


# -- experiment text and the CLI ----------------------------------------------------------

#: TINY as a flow mapping for experiment YAML written by tests
TINY_MODEL = ("{family: gpt, vocab_size: 64, context_length: 32, emb_dim: 32, n_heads: 4, "
              "n_layers: 2, drop_rate: 0.0}")

#: a ``model:`` block of experiment YAML (TINY with a tanh GELU)
MODEL = """\
model:
  family: gpt
  vocab_size: 64
  context_length: 32
  emb_dim: 32
  n_heads: 4
  n_layers: 2
  drop_rate: 0.0
  activation: {kind: gelu, approximate: tanh}
"""


def exp(body: str = "", head: str = "name: demo\n") -> str:
    return head + MODEL + textwrap.dedent(body)


def invoke(*args: str):
    result = CliRunner().invoke(main, [str(a) for a in args])
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


#: a plugin file whose norm registers fine and fails in forward
BROKEN_PLUGIN = '''
from typing import Literal

import torch
from torch import nn

import variantlab


class BrokenSpec(variantlab.ComponentSpec):
    kind: Literal["broken"] = "broken"


class Broken(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        raise RuntimeError("broken norm: forward is not implemented")


@variantlab.hookimpl
def register_norms(register):
    register("broken", BrokenSpec, lambda spec, dim: Broken(dim))
'''


# -- runs through an executor compared with the in-process run ------------------------------
ALL_PROBES = """measure:
  params: {}
  gradients: {batch_size: 2, seq_len: 16, batches: 1}
  training: {steps: 3, batch_size: 2, seq_len: 16, eval_batches: 1, device: cpu}
  timing: {batch_size: 2, seq_len: 16, passes: [forward], warmup: 0, repeats: 2, device: cpu}
"""
FAST_PROBES = "measure:\n  params: {}\n  gradients: {batch_size: 2, seq_len: 16, batches: 1}\n"


def write_exp(tmp_path: Path, grid: str, seeds: str = "[0]", measure: str = FAST_PROBES,
              plugin: str | None = None) -> Path:
    """``pooltest.yaml``; ``plugin``: the text of a plugin file it loads (``bad_norm.py``)."""
    text = f"name: pooltest\nseeds: {seeds}\nmodel: {TINY_MODEL}\ngrid:\n{grid}"
    if plugin:
        (tmp_path / "bad_norm.py").write_text(plugin)
        text += "plugins: [bad_norm.py]\n"
    path = tmp_path / "pooltest.yaml"
    path.write_text(text + measure)
    return path


def stored(run_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Units and rows, sorted, without what differs between two runs (times, timings, the
    invocation id, the machine's load and threads)."""
    with closing(sqlite3.connect(run_dir / "results.sqlite")) as conn:
        units = pd.read_sql_query("SELECT * FROM units ORDER BY key", conn)
        rows = pd.read_sql_query("SELECT * FROM rows", conn)
    units = units.drop(columns=["started_at", "finished_at", "duration_s", "invocation",
                                "cpu_s", "load_start", "load_end", "torch_threads", "cores"])
    rows.loc[rows.probe == "timing", "value"] = None
    cols = ["unit_key", "probe", "metric", "scope", "name", "layer", "step", "unit"]
    return units, rows.sort_values(cols, na_position="first").reset_index(drop=True)


# -- Hugging Face conversions (tests/test_from_transformers.py, test_hf_gemma.py, ...) -----
def perturbed(model, seed: int = 1):
    """``model`` with every parameter moved by N(0, 0.2) noise (seeded), in eval mode: a
    wrong weight mapping cannot hide behind a default initialisation."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return model.eval()


def assert_native_export(data: dict, cls: str, registry, tol: float) -> None:
    """A variantlab model of spec ``data`` (perturbed, seeded) exports with
    ``to_transformers`` to ``cls`` warning of nothing (every weight has its place), with equal
    parameter counts and logits within ``tol`` on two rows of 10 tokens."""
    import variantlab as vl
    from variantlab.hf import ExportWarning

    spec = vl.parse_model_spec(data, registry)
    torch.manual_seed(0)
    model = perturbed(vl.build_model(spec, registry), seed=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ExportWarning)
        hf = vl.to_transformers(spec, model)
    assert type(hf).__name__ == cls
    assert n_params(hf) == n_params(model)
    idx = torch.randint(0, 64, (2, 10))  # longer than the windows and chunks of the tests
    with torch.no_grad():
        assert (model(idx) - hf(idx).logits).abs().max().item() < tol


def left_padded_diff(hf, model, length: int = 11) -> float:
    """Largest |logit difference| between an HF causal LM and ours (or a second HF one, an
    export) over the real positions of three rows of ``length`` tokens, the first left-padded
    by 4 and the last by 1 (HF gets the position ids a padded generate would use)."""
    idx = torch.randint(0, 64, (3, length))
    mask = torch.ones(3, length, dtype=torch.long)
    mask[0, :4] = 0
    mask[2, :1] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ref = hf(idx, attention_mask=mask, position_ids=positions).logits
        if hasattr(model, "can_generate"):  # transformers'
            ours = model(idx, attention_mask=mask, position_ids=positions).logits
        else:
            ours = model.eval()(idx, attention_mask=mask)
    return (ours - ref)[mask.bool()].abs().max().item()


def assert_yaml_round_trip(spec, model, registry) -> None:
    """An imported spec written as YAML reads back equal, and a model built from it with the
    imported weights gives bit-identical logits."""
    import variantlab as vl
    from variantlab.config.yamlio import spec_yaml

    again = vl.parse_model_spec(yaml.safe_load(spec_yaml(spec))["model"], registry)
    assert again == spec
    rebuilt = vl.build_model(again, registry)
    rebuilt.load_state_dict(model.state_dict())
    idx = torch.randint(0, 64, (1, 9))
    with torch.no_grad():
        assert torch.equal(rebuilt.eval()(idx), model.eval()(idx))


def n_params(model) -> int:
    """Parameters counted once each (tied weights once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


#: the built-in probes, in the order the built-in plugin registers them
BUILTIN_PROBES = ("params", "gradients", "timing", "training", "dynamics")


def layer_modules(model) -> list:
    """``(layer index, module)`` of each module tagged ``variantlab_layer`` (outermost per
    branch), sorted by layer index."""
    from variantlab.probes.common import layer_stacks

    return [(i, m) for i, m, _ in layer_stacks(model)]


def assert_imports_equal(hf, registry, impl: str = "naive", padded: bool = True,
                         tol: float = 1e-4):
    """``from_transformers(hf)`` with ``impl``: equal parameter counts, logits within ``tol``
    on two rows of 12 tokens and, with ``padded``, on left-padded rows; returns (spec, model)."""
    import variantlab as vl

    spec, model = vl.from_transformers(hf, registry, impl=impl)
    assert n_params(model) == n_params(hf)
    idx = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        assert (model.eval()(idx) - hf(idx).logits).abs().max().item() < tol
    if padded:
        assert left_padded_diff(hf, model) < tol
    return spec, model


def perturbed_hf(family: str, kwargs: dict, attn: str = "eager",
                 config_cls: str | None = None):
    """A perturbed (:func:`perturbed`) ``{family}ForCausalLM`` of ``{family}Config(**kwargs)``
    (or ``config_cls``'s), built after seeding 0, with the attention implementation ``attn``;
    a DeepSeek-V3-style router's choice-bias buffer is perturbed too."""
    import transformers

    torch.manual_seed(0)
    config = getattr(transformers, config_cls or f"{family}Config")(
        **kwargs, attn_implementation=attn)
    hf = perturbed(getattr(transformers, f"{family}ForCausalLM")(config))
    with torch.no_grad():
        for module in hf.modules():  # a buffer: perturbed() moves parameters only
            if hasattr(module, "e_score_correction_bias"):
                module.e_score_correction_bias.normal_(0.0, 0.1)
    return hf


@pytest.fixture
def own_token_cache(tmp_path, monkeypatch):
    """A token cache of the test's own (``VARIANTLAB_CACHE``) and no splits remembered from
    another test, before and after."""
    from variantlab.data import sources

    monkeypatch.setenv("VARIANTLAB_CACHE", str(tmp_path / "cache"))
    sources._SPLITS.clear()
    yield tmp_path / "cache"
    sources._SPLITS.clear()


def assert_close_logits(model, hf, tol: float = 1e-5, length: int = 10) -> None:
    """``model`` (in eval mode) and the HF causal LM give logits within ``tol`` on two rows
    of ``length`` tokens."""
    idx = torch.randint(0, 64, (2, length))
    with torch.no_grad():
        assert (model.eval()(idx) - hf(idx).logits).abs().max().item() < tol


def assert_causal(model, length: int = 10, cut: int = 6) -> None:
    """Changing the tokens from ``cut`` on leaves ``model``'s logits before ``cut`` exactly
    as they were, and changes those after."""
    idx = torch.randint(0, 64, (1, length))
    later = idx.clone()
    later[0, cut:] = (later[0, cut:] + 1) % 64
    with torch.no_grad():
        before, after = model.eval()(idx), model(later)
    assert torch.equal(before[:, :cut], after[:, :cut])
    assert not torch.allclose(before[:, cut:], after[:, cut:])
