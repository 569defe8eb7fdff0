"""The public entry points in ``import variantlab as vl`` work without a registry: ``None``
means the default one (built-ins plus installed plugins), and the result equals the one an
explicit ``vl.get_registry()`` gives."""

import pytest
import torch

import variantlab as vl

TINY = {"family": "gpt", "vocab_size": 64, "context_length": 16, "emb_dim": 32, "n_heads": 4,
        "n_layers": 2, "drop_rate": 0.0}


def test_build_model_from_a_dict_without_registry():
    torch.manual_seed(0)
    model = vl.build_model(TINY)
    torch.manual_seed(0)
    explicit = vl.build_model(TINY, vl.get_registry())
    idx = torch.randint(0, 64, (2, 8))  # (B, T)
    logits = model(idx)  # (B, T, vocab)
    assert logits.shape == (2, 8, 64)
    assert torch.equal(logits, explicit(idx))
    assert model.variantlab_spec.emb_dim == 32


def test_parse_model_spec_without_registry():
    spec = vl.parse_model_spec(TINY)
    assert isinstance(spec, vl.ModelSpec)
    assert spec == vl.parse_model_spec(TINY, vl.get_registry())
    with pytest.raises(vl.SpecError, match="family"):
        vl.parse_model_spec({**TINY, "family": "no-such-family"})


def test_task_for_without_registry():
    spec = vl.parse_model_spec(TINY)
    task = vl.task_for(spec)
    assert task is vl.task_for(spec, vl.get_registry())
    batch = task.batch(spec, 2, 8, generator=torch.Generator().manual_seed(0))
    assert batch.target.shape == (2, 8)


def test_from_transformers_without_registry():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_embd=32, n_head=4, n_layer=2, vocab_size=64, n_positions=16)
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(config).eval()
    spec, model = vl.from_transformers(hf)
    model.eval()
    idx = torch.randint(0, 64, (1, 6))  # (B, T)
    with torch.no_grad():
        diff = (model(idx) - hf(idx).logits).abs().max().item()
    assert diff < 1e-4
    assert spec.family == "gpt"


def test_run_probe_without_registry():
    from variantlab.probes import run_probe

    rows = run_probe("params", TINY, seed=0)
    explicit = run_probe("params", TINY, seed=0, registry=vl.get_registry())
    total = [r["value"] for r in rows if r["metric"] == "total" and r["scope"] == "model"]
    assert total == [r["value"] for r in explicit if r["metric"] == "total" and r["scope"] == "model"]
    model = vl.build_model(TINY)
    assert total == [sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())]


def test_write_report_without_registry(tmp_path):
    from variantlab.report import write_report
    from variantlab.testing.sample import sample_run

    write_report([sample_run()], tmp_path / "a")
    write_report([sample_run()], tmp_path / "b", registry=vl.get_registry())
    for name in ("report.md", "summary.csv"):
        assert (tmp_path / "a" / name).read_text() == (tmp_path / "b" / name).read_text()
