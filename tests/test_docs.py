"""The experiment YAML shown in README.md and the docs validates as printed."""

import re
from pathlib import Path

import pytest
from conftest import doc_plugins

from variantlab.config.experiment import experiment_from_text

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
