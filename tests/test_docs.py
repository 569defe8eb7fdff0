"""The experiment YAML shown in README.md and the docs validates as printed, the plugin
quickstart's code works, every relative link in the docs reaches a file (and heading), the
README stays short, and the docs site's navigation holds every page of docs/."""

import re
from pathlib import Path

import pytest
import torch
from conftest import doc_plugins, quickstart_plugin

import variantlab as vl
from variantlab.config.experiment import experiment_from_text
from variantlab.testing import component_problems

ROOT = Path(__file__).resolve().parent.parent

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
        *sorted((ROOT / "examples").rglob("README.md"))]
BLOCKS = [(doc, i, m.group(1)) for doc in DOCS
          for i, m in enumerate(re.finditer(r"```yaml\n(.*?)```", doc.read_text(), re.S))
          if re.search(r"^name:", m.group(1), re.M) and re.search(r"^model:", m.group(1), re.M)]


def test_the_docs_show_experiments():
    assert {doc.name for doc, _, _ in BLOCKS} >= {"README.md", "plugins.md"}


@pytest.mark.parametrize(("doc", "index", "text"), BLOCKS,
                         ids=[f"{d.relative_to(ROOT)}#{i}" for d, i, _ in BLOCKS])
def test_experiment_in_the_docs_validates(doc, index, text, tmp_path):
    # the YAML names the files written beside it under plugins: itself
    plugins = [p for p in doc_plugins(text, tmp_path) if Path(p).parent != tmp_path]
    exp = experiment_from_text(text, f"{doc.name}#{index}", extra_plugins=plugins,
                               base_dir=tmp_path)
    assert len(exp.variants) >= 2
    assert exp.baseline in {v.name for v in exp.variants}


def test_the_plugin_quickstart_is_one_screen_and_its_plugin_works(tmp_path):
    page = (ROOT / "docs" / "plugins.md").read_text()
    assert len(page.splitlines()) <= 70
    path = quickstart_plugin(tmp_path)
    registry = vl.build_registry(extra=[str(path)], entry_points=False)
    assert component_problems("norm", {"kind": "scale"}, plugins=[str(path)],
                              families=["gpt"]) == []
    torch.manual_seed(0)
    model = vl.build_model({"family": "gpt", "vocab_size": 64, "context_length": 16,
                            "emb_dim": 32, "n_heads": 4, "n_layers": 2,
                            "norm": {"kind": "scale"}}, registry)
    g = [p for n, p in model.named_parameters() if n.endswith("norm.g")]
    assert len(g) == 2 * 2 + 1  # two per block, one final
    assert all(torch.allclose(v, torch.tensor(32.0).sqrt()) for v in g)  # g = sqrt(dim)
    x = torch.randn(2, 5, 32)  # (B, T, D)
    norm = registry.get("norm", "scale", ()).build(vl.parse_model_spec(
        {"family": "gpt", "norm": {"kind": "scale"}}, registry).norm, 32)
    y = norm(x)  # (B, T, D)
    assert torch.allclose(y.norm(dim=-1), torch.full((2, 5), 32.0).sqrt(), atol=1e-5)


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {re.sub(r"[^a-z0-9 _-]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.*)$", text, re.M)}


LINKS = [(doc, target) for doc in DOCS
         for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text())
         if not re.match(r"[a-z]+:", target)]


@pytest.mark.parametrize(("doc", "target"), LINKS,
                         ids=[f"{d.relative_to(ROOT)}->{t}" for d, t in LINKS])
def test_relative_links_resolve(doc, target):
    file, _, anchor = target.partition("#")
    dest = (doc.parent / file).resolve() if file else doc
    assert dest.exists(), f"{doc.relative_to(ROOT)}: {target}: no such file"
    if anchor and dest.suffix == ".md":
        assert anchor in _anchors(dest), f"{doc.relative_to(ROOT)}: {target}: no such heading"


def test_the_architecture_page_names_every_folder_of_the_core_once():
    page = (ROOT / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| `(\w+)/` \|", page, re.M)
    folders = sorted(p.name for p in (ROOT / "variantlab").iterdir()
                     if (p / "__init__.py").exists())
    assert sorted(rows) == folders
    assert len(rows) == len(set(rows))


def test_the_python_page_example_runs_without_a_registry():
    page = (ROOT / "docs" / "python.md").read_text()
    code = next(b for b in re.findall(r"```python\n(.*?)```", page, re.S) if "vl.build_model(" in b)
    code = code.replace('"n_layers": 12', '"n_layers": 1').replace("50257", "64")
    code = code.split("\ndf = vl.results")[0]  # no run folder here
    scope: dict = {}
    exec(code, scope)
    assert scope["model"].variantlab_spec.attention.impl == "sdpa"


def test_the_transformers_page_examples_run_with_the_default_registry(tmp_path, monkeypatch):
    """docs/transformers.md's import and export examples, as printed (no registry passed),
    on a tiny GPT-2: the import's logits equal Hugging Face's, the export loads back."""
    transformers = pytest.importorskip("transformers")
    page = (ROOT / "docs" / "transformers.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, re.S)
    imported = next(b for b in blocks if "vl.from_transformers(" in b)
    exported = next(b for b in blocks if "vl.to_transformers(" in b)
    assert "get_registry" not in imported + exported
    config = transformers.GPT2Config(n_embd=32, n_head=4, n_layer=2, vocab_size=64,
                                     n_positions=16)
    torch.manual_seed(0)
    hf_model = transformers.GPT2LMHeadModel(config).eval()
    scope: dict = {"hf_model": hf_model}
    exec(compile(imported, "transformers.md#import", "exec"), scope)
    idx = torch.randint(0, 64, (1, 6))  # (B, T)
    with torch.no_grad():
        diff = (scope["model"].eval()(idx) - hf_model(idx).logits).abs().max().item()
    assert diff < 1e-4
    monkeypatch.chdir(tmp_path)
    tiny = repr(scope["spec"].to_data())
    exec(compile(exported.replace("{...}", tiny), "transformers.md#export", "exec"), scope)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    with torch.no_grad():
        diff = (back(idx).logits - scope["model"].eval()(idx)).abs().max().item()
    assert diff < 1e-4


def test_the_readme_is_two_screens_that_lead_into_the_docs():
    """Issue 40.4: at most 150 lines, the two quick-start commands with what to expect, the
    findings between their markers, and a link to every page of the docs site."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    assert "./scripts/setup && .venv/bin/variantlab run experiments/pre-vs-post-norm.yaml" in text
    assert '.venv/bin/python -m pytest -q -n 2 -m "not slow"' in text
    # the fast suite's test count and a time measured for it
    assert re.search(r"about [\d,]+ tests\. .{0,80}?took (about )?\d+ (s|min)", text, re.S)
    assert text.index("<!-- findings:start -->") < text.index("<!-- findings:end -->")
    linked = {Path(t.partition("#")[0]).name for d, t in LINKS if d.name == "README.md"}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages - linked == set(), "pages the README does not link"


def _nav_pages(node) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [p for v in node.values() for p in _nav_pages(v)]
    return [p for v in node for p in _nav_pages(v)]


def test_the_site_navigation_lists_every_docs_page_once():
    """mkdocs.yml's nav: each docs/*.md once, nothing else (mkdocs build --strict in .ci/run
    checks the links and the API reference)."""
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = _nav_pages(config["nav"])
    assert sorted(nav) == sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert len(nav) == len(set(nav))
    assert config["strict"] is True and config["theme"]["name"] == "material"
