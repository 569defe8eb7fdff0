"""``variantlab export`` (a variant to Hugging Face transformers) and ``variantlab
export-mlflow`` (a run's results to MLflow): thin commands over
:mod:`variantlab.export.variant` and :mod:`variantlab.export.mlflow`."""

from __future__ import annotations

import sys
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
@click.option("--overwrite", is_flag=True,
              help="Replace the files of a DIR that already holds some (else refused).")
@plugin_option
@bad_input_exits
def export_cmd(run: str, variant: str, to: str, seed: int | None, overwrite: bool,
               plugins: Sequence[str]) -> None:
    """Export variant NAME of RUN as a Hugging Face transformers model in DIR.

    DIR loads with transformers.AutoModelForCausalLM.from_pretrained(DIR) and computes the
    variant's logits. A run stores results, not weights: the weights are the variant's
    initialisation with seed S (torch.manual_seed(S), then build_model, as every probe
    builds it), so training the variant at scale starts where the run started. The class
    (GPT-2, GPT-NeoX, Llama, Qwen3, OLMo 2, Gemma 2/3) follows from the variant's
    components; one transformers has no equivalent for is named, exit 2. A DIR that
    already holds files is refused unless --overwrite is given.
    """
    from ..config.checks import SEED_MAX, SEED_MIN
    from ..errors import SpecError
    from ..export.variant import export_variant
    from ..plugin.registry import build_registry

    if seed is not None and not SEED_MIN <= seed <= SEED_MAX:
        raise SpecError.at(("--seed",), f"{seed} is outside the seeds a run takes ({SEED_MIN} "
                                        f".. {SEED_MAX}); use a smaller one")
    held = sorted(p.name for p in Path(to).iterdir()) if Path(to).is_dir() else []
    if held and not overwrite:
        shown = ", ".join(held[:4]) + (f" and {len(held) - 4} more" if len(held) > 4 else "")
        raise SpecError.at(("--to",), f"{to} already holds files ({shown}); choose an empty or "
                                      "new folder, or pass --overwrite to replace them")
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


@click.command("export-mlflow")
@click.argument("runs", nargs=-1, required=True, type=click.Path())
@click.option("--tracking-uri", required=True, metavar="URI",
              help="The MLflow tracking store, e.g. sqlite:///mlflow.db (artifacts go beside "
                   "the database, in mlartifacts/), or a tracking server's URL.")
@click.option("--experiment", default=None, metavar="NAME",
              help="MLflow experiment to log into (default: the variantlab experiment's name).")
@click.option("--no-report", is_flag=True, help="Do not log the report as artifacts.")
@plugin_option
@bad_input_exits
def export_mlflow_cmd(runs: Sequence[str], tracking_uri: str, experiment: str | None,
                      no_report: bool, plugins: Sequence[str]) -> None:
    """Log each variant x seed of RUN(s) as an MLflow run (needs the mlflow extra).

    Params: the variant's axis values, the probes' and data settings; metrics: every
    number of variantlab.results(), curves as metric histories with their steps; the
    report as artifacts of a parent run. Running it again adds nothing for results that
    did not change and replaces the MLflow runs of those that did (docs/mlflow.md).
    """
    from ..export.mlflow import export_mlflow
    from ..plugin.registry import build_registry

    stdout, _ = consoles()
    registry = build_registry(extra=plugins, base_dir=Path.cwd())
    done = export_mlflow(runs, tracking_uri, experiment, registry=registry,
                         report=not no_report)
    stdout.print(f"mlflow experiment {done.experiment_id} at {escape(tracking_uri)}: "
                 f"{done.created} run(s) created, {done.replaced} replaced (results changed), "
                 f"{done.unchanged} unchanged", soft_wrap=True)


@click.command("export-results")
@click.argument("run", type=click.Path())
@click.option("--out", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Where to write it (default: RUN/results.json.gz). Commit it beside the "
                   "report (reports/<name>/results.json.gz) to regenerate the report without "
                   "a rerun.")
@bad_input_exits
def export_results_cmd(run: str, out: str | None) -> None:
    """Write RUN's results as one compact file that `variantlab report` reads.

    RUN is a run folder or its results.sqlite. The file (gzipped JSON of the run's meta,
    variants, units and rows; docs/findings.md#results-exports) gives the same report
    as the store: `variantlab report reports/NAME --out reports/NAME`.
    """
    from ..errors import InputError
    from ..store.runs import export_run, find_runs
    from ..store.store import STORE_FILE

    stdout, err = consoles()
    refs = find_runs(run)
    if len(refs) != 1 or refs[0].store.name != STORE_FILE:
        what = (f"{len(refs)} runs" if len(refs) != 1 else "an export, not a results store")
        raise InputError([f"{run}: names {what}; give one run folder (runs/<experiment>) or "
                          f"its {STORE_FILE}"])
    try:
        path = export_run(refs[0].store, out)
    except OSError as exc:
        err.print(f"{escape(str(exc.filename or out or run))}: cannot write the export "
                  f"({escape(exc.strerror or str(exc))}); the run is unchanged", soft_wrap=True)
        sys.exit(3)
    size = path.stat().st_size
    stdout.print(f"wrote {escape(str(path))} ({size / 1024:,.1f} KiB)", soft_wrap=True)
