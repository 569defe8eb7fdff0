"""``variantlab export`` (a variant to Hugging Face transformers) and ``variantlab
export-mlflow`` (a run's results to MLflow): thin commands over
:mod:`variantlab.hfexport.variant` and :mod:`variantlab.report.mlflow_export`."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path

import click
from rich.markup import escape

from .base import bad_input_exits, plugin_option
from .fmt import consoles


@click.command("export")
@click.argument("run", type=click.Path())
@click.option("--variant", required=True, metavar="NAME", help="The variant to export.")
@click.option("--to", "to", required=True, type=click.Path(file_okay=False), metavar="DIR",
              help="Folder for the save_pretrained output (config.json, model.safetensors).")
@click.option("--seed", type=int, default=None, metavar="S",
              help="Initialise with this seed (default: the run's first seed).")
@plugin_option
@bad_input_exits
def export_cmd(run: str, variant: str, to: str, seed: int | None,
               plugins: Sequence[str]) -> None:
    """Export variant NAME of RUN as a Hugging Face transformers model in DIR.

    DIR loads with transformers.AutoModelForCausalLM.from_pretrained(DIR) and computes the
    variant's logits. A run stores results, not weights: the weights are the variant's
    initialisation with seed S (torch.manual_seed(S), then build_model, as every probe
    builds it), so training the variant at scale starts where the run started. The class
    (GPT-2, GPT-NeoX, Llama, Qwen3, OLMo 2, Gemma 2/3) follows from the variant's
    components; one transformers has no equivalent for is named, exit 2.
    """
    from ..hfexport.variant import export_variant
    from ..plugin.registry import build_registry

    stdout, err = consoles()
    registry = build_registry(extra=plugins, base_dir=Path.cwd())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        done = export_variant(run, variant, to, seed=seed, registry=registry)
    for w in caught:
        if w.category.__name__ == "ExportWarning":
            err.print(f"warning: {escape(str(w.message))}", soft_wrap=True)
    stdout.print(f"exported {escape(variant)} as {done.cls} to {escape(str(done.folder))} "
                 f"(initial weights, seed {done.seed})", soft_wrap=True)
