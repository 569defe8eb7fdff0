"""What the report shows of the ``training`` probe: final, best and eval loss and how many
seeds diverged (a warning each), whether it ran compiled, the loss curves, and how the
best and worst variant compare with the baseline on the headline metric, within each
condition, by the paired interval over seeds (:mod:`..fair.gaps`)."""

from __future__ import annotations

import warnings as warnings_module
from collections.abc import Mapping
from typing import Any

import pandas as pd

from ...plugin.probe import ProbeView
from ..fair.compare import fair_piece
from ..frame import ReportData
from ..panels import curve_panels
from ..plots import Plot
from ..tables import MetricRows, Table, select, summary_section

PROBE = "training"
NOTE = ("final training loss (mean of the last tenth of the steps), best step loss, eval "
        "loss (eval mode, the fixed validation windows) and test loss; recall accuracy (recall "
        "task) on the validation and the test split; mean ± std over seeds")
#: recall accuracy on the validation and the test split (``recall_accuracy`` is the test
#: split's, under the name it had before the validation split was scored)
RECALL = (("val_recall_accuracy", "val recall accuracy"),
          ("test_recall_accuracy", "test recall accuracy"),
          ("recall_accuracy", "test recall accuracy"))
LM_FAMILIES = {"gpt", "decoder", "encoder_decoder", "encoder"}


def metrics(data: ReportData) -> pd.DataFrame:
    """Whether it ran compiled (once any run was), then the losses and divergence."""
    rows, out = data.rows, MetricRows()
    compiled = select(rows, PROBE, "compiled")  # 1: under torch.compile
    if (compiled["value"] == 1).any():
        out.add(compiled, PROBE, f"{PROBE}.compiled", "compiled (torch.compile)", "",
                ratio=False)
    for metric, label in (("final_loss", "final loss"), ("best_loss", "best loss"),
                          ("eval_loss", "eval loss"), ("test_loss", "test loss")):
        out.add(select(rows, PROBE, metric), PROBE, metric, label, "")
    newer = len(select(rows, PROBE, "test_recall_accuracy"))
    for metric, label in RECALL:  # the recall task only
        if metric == "recall_accuracy" and newer:  # the same number under its older name
            continue
        out.add(select(rows, PROBE, metric), PROBE, metric, label, "fraction", ratio=False)
    out.add(select(rows, PROBE, "diverged"), PROBE, "diverged", "diverged", "", ratio=False)
    for metric, label in (("final_load_imbalance", "final load imbalance"),  # mixtures of
                          ("final_aux_loss", "final load-balancing loss"),  # experts only
                          ("final_dropped_fraction", "final dropped share")):  # (docs/moe.md)
        out.add(select(rows, PROBE, metric), PROBE, metric, label, "")
    return out.frame()


def section(data: ReportData, summary: pd.DataFrame) -> Table | None:
    note = NOTE + ("; test loss only at each group's chosen setting (a tuned sweep scores "
                   "the test split there alone; —: not scored)" if partly_tested(data) else "")
    return summary_section(data, summary, PROBE, "Training", note)


def partly_tested(data: ReportData) -> bool:
    """Whether some variants have a validation loss and no test loss while others have
    both: a tuned sweep whose test split was scored at the chosen settings only
    (:func:`variantlab.sweep.units.plan_units`)."""
    rows = data.rows
    mine = rows[rows["probe"] == PROBE]
    val = set(mine.loc[mine["metric"] == "val_loss", "variant"])
    test = set(mine.loc[mine["metric"] == "test_loss", "variant"])
    return bool(test) and bool(val - test)


def loss_plot(data: ReportData) -> Plot:
    title = "Training loss"
    caption = "Training loss per step (mean over seeds) of the short AdamW run."
    rows = data.rows
    part = rows[(rows["probe"] == PROBE) & (rows["metric"] == "loss") & rows["step"].notna()]
    if not len(part):
        return Plot("training", title, caption, skipped="no training curves (the training "
                    "probe did not run)")
    fig, said = curve_panels(data, part, "step", title, "training step",
                             "loss (nats per token)" if _is_lm(data) else "loss")
    return Plot("training", title, caption + said, fig)


def val_curve_plot(data: ReportData) -> Plot | None:
    """Validation loss at each ``eval_every`` evaluation (mean over seeds); None when no run
    recorded one."""
    title = "Validation loss during training"
    rows = data.rows
    part = rows[(rows["probe"] == PROBE) & (rows["metric"] == "val_loss_curve")
                & rows["step"].notna()]
    if not len(part):
        return None
    fig, said = curve_panels(data, part, "step", title, "optimizer steps done",
                             "validation loss (nats per token)" if _is_lm(data)
                             else "validation loss")
    return Plot("training-val", title, "Loss over the fixed validation windows every eval_every "
                "steps and at the end (mean over seeds)." + said, fig)


def _is_lm(data: ReportData) -> bool:
    families = {s.get("family") for s in data.variants["spec"] if isinstance(s, dict)}
    return bool(families) and families <= LM_FAMILIES


def plots(data: ReportData) -> list[Plot]:
    curve = val_curve_plot(data)
    return [loss_plot(data)] + ([curve] if curve is not None else [])


def warnings(data: ReportData) -> list[list[str]]:
    """A line per diverged run."""
    rows = data.rows
    div = rows[(rows["probe"] == PROBE) & (rows["metric"] == "diverged") & (rows["value"] > 0)]
    return [[rec["variant"], PROBE, f"seed {int(rec['seed'])}: training diverged"]
            for _, rec in div.iterrows()]


def views() -> tuple[ProbeView, ...]:
    """The training probe's pieces, after the timing probe's; its fair comparisons read the
    params probe's non-embedding counts for the sizes."""
    return (ProbeView(metrics=metrics, section=section, plots=plots,
                      warnings=warnings, fair=fair_piece(PROBE, "params", spec_non_embedding),
                      rank=30),)


def spec_non_embedding(spec: Mapping[str, Any]) -> int:
    """Non-embedding parameters of the model a stored (resolved) spec builds, counted on
    the meta device with the report's registry: the size of a variant in a run without
    the params probe (the same count as its ``non_embedding`` row)."""
    import torch

    from ...model.build import build_model
    from ...model.specs import parse_model_spec
    from ...probes.params import non_embedding_params
    from ...sweep.metarun import meta_run
    from ..parts import registry_or_default

    registry = registry_or_default(None)
    model_spec = parse_model_spec(dict(spec), registry)

    def count() -> int:
        with torch.device("meta"), warnings_module.catch_warnings():
            warnings_module.simplefilter("ignore")
            return non_embedding_params(build_model(model_spec, registry))

    return meta_run(count)
