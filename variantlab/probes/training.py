"""A short training run: loss per step, final and best loss, held-out losses, a divergence flag.

By default AdamW with a constant learning rate after ``warmup_steps`` of linear warm-up; the
schedule, optimizer, weight-decay groups and a token budget in place of ``steps`` are options
(:mod:`variantlab.probes.recipe`). Gradients are clipped to a global L2 norm of
``grad_clip``. The run stops at the first non-finite loss.

- ``final_loss``: mean training loss over the last tenth of the steps (at least one), so one
  noisy batch does not decide it; ``best_loss``: the lowest step loss;
- ``val_loss`` / ``test_loss``: after training, the mean loss in eval mode (dropout off,
  BatchNorm on its running statistics) over one fixed set of windows of the validation /
  test split (:mod:`variantlab.data.heldout`: the whole split up to ``eval_tokens`` targets,
  65,536 by default,
  the same for every seed and variant; synthetic data: sets drawn with their own fixed
  seeds); ``val_tokens`` / ``test_tokens``: the targets scored; ``eval_loss`` is
  ``val_loss`` under its older name; with ``eval_every``, validation curves; on recall data
  recall accuracy and ``steps_to_solve`` (:mod:`variantlab.probes.heldout`);
- with ``eval_lengths``: ``test_loss_at_N`` and ``test_tokens_at_N`` for each length N, the
  test split's fixed windows of N tokens (the same rule as ``test_loss``, N in place of
  ``seq_len``) scored after training; on recall data ``test_recall_accuracy_at_N`` too
  (rows of N tokens: with ``n_pairs`` unset, a quarter of the row as pairs);
- ``still_improving``: 1 when the training loss was still falling over the last fifth of
  the run by more than its own noise (:func:`variantlab.probes.heldout.still_improving`);
- ``lr`` per step: the learning rate the step used; ``tokens``: the tokens trained on;
  ``flops``: training FLOPs, ``tokens`` x :func:`variantlab.probes.flops.model_flops_per_token`;
- ``diverged``: 1 when a loss was NaN/inf or the loss really rose (:func:`diverged`): the
  final loss is above the first step's by more than the run's own step-to-step noise can
  explain (3 standard deviations of the difference, at least 5% of the first loss), or it is
  more than twice the first loss. A short run on data that cannot be learned (random
  tokens) wanders around its first loss and is not flagged;
- a model with routed (mixture-of-experts) layers trains on the task's loss plus the
  weighted balancing losses (:meth:`variantlab.model.tasks.Task.aux_loss`); ``loss`` and
  every loss row above stay the task's loss alone, and the routing rows of
  :mod:`variantlab.probes.routing` come besides (``aux_loss``, ``z_loss``,
  ``load_imbalance``, ``router_entropy`` per step; ``expert_load`` per layer);
- ``init_loss``, ``loss_noise``, ``chance_loss`` / ``chance_recall_accuracy`` and
  ``recall_noise``: the run's starting point and noise (:mod:`variantlab.probes.start`), which
  the report's "learned nothing" is judged against;
- ``compiled``: 1 when the run was compiled (the model runs under ``torch.compile``,
  :mod:`variantlab.probes.compiled`): ``compile: true``, or ``auto`` (the default) for a run
  of at least :data:`~variantlab.probes.compiled.AUTO_STEPS` steps; else 0;
  ``compile_fallback`` (``auto`` only, scope ``info``, the compiler's error in ``name``):
  compiling failed, so the unit ran again eager from the start (its rows are eager's).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
from pydantic import (
    Field,
    PositiveFloat,
    PositiveInt,
    ValidationInfo,
    field_validator,
    model_serializer,
)
from pydantic.json_schema import SkipJsonSchema

from ..data import sources as datalib
from ..model.build import make_model
from ..model.sparse import after_step, fixed_structure
from ..model.specs import ModelSpec, omit_added_defaults
from ..model.tasks import Batch, Task, task_for
from ..plugin.registry import Registry
from ..plugin.rows import Row, row
from ..plugin.settings import Device, DType
from . import checkpoint
from .common import autocast, resolve_device
from .compiled import CompileError, compile_errors, compile_model, use_compile
from .flops import model_flops_per_token
from .heldout import (
    Curve,
    HeldOut,
    final_rows,
    length_rows,
    scores_held_out,
    still_improving,
    test_split_rows,
)
from .noise import step_noise
from .params import non_embedding_params
from .recipe import RECIPE_OPTIONS, RecipeSettings, lr_at, make_optimizer, planned_steps
from .routing import Record, routed_layers, snapshot, training_rows
from .start import start_rows


class TrainRunSettings(RecipeSettings):
    """What every training run takes (the training and dynamics probes)."""

    #: recipe and held-out options are left out of the serialised settings while at their
    #: defaults
    added_options: ClassVar[tuple[str, ...]] = (*RECIPE_OPTIONS, "eval_tokens")
    batch_size: PositiveInt = Field(16, description="rows per batch")
    seq_len: PositiveInt = Field(128, description="positions per row")
    grad_clip: PositiveFloat | None = Field(
        1.0, description="clip gradients to this global L2 norm (null: no clipping)")
    eval_tokens: PositiveInt | None = Field(
        None, description="targets scored in eval mode for each of val_loss and test_loss: "
        "windows of the split's fixed set spread evenly over it, all when it has fewer (unset: 65,536 "
        "of a corpus, 8,192 of synthetic data)")
    eval_batches: int | None = Field(
        None, ge=0, description="0: no held-out scoring; N: at most N batches of batch_size "
                                "windows (an older cap beside eval_tokens); unset: eval_tokens")
    dtype: DType = Field("float32", description="autocast dtype; float32: none")
    device: Device = Field("auto", description="auto, cpu, cuda, cuda:N or mps")

    @model_serializer(mode="wrap")
    def _omit_added_defaults(self, handler: Any) -> Any:
        return omit_added_defaults(self, handler(self))


class TrainingSettings(TrainRunSettings):
    """A short AdamW run with linear warm-up and gradient clipping."""

    added_options: ClassVar[tuple[str, ...]] = (*TrainRunSettings.added_options, "eval_every",
                                                "eval_lengths", "test_split", "trained")
    compile: bool | Literal["auto"] = Field(
        "auto", description="run the model under torch.compile: true, false, or auto (compile "
        "a run of at least 1,000 steps, where it pays back; eager again when compiling fails)")
    eval_every: PositiveInt | None = Field(
        None, description="score the validation set every N steps during training "
                          "(val_loss_curve; unset: after training only)")
    eval_lengths: list[PositiveInt] | None = Field(
        None, description="after training, also score the test split's fixed windows of each "
        "of these lengths (test_loss_at_N, test_tokens_at_N; recall data: "
        "test_recall_accuracy_at_N): length generalisation beyond seq_len; each at most "
        "the model's context_length")

    # set by the run (plan_units), never by the YAML: left out of the JSON schema
    test_split: SkipJsonSchema[Literal["scored", "deferred", "only"]] = Field(
        "scored", description="set by variantlab run, not in YAML: scored (the test split "
        "after training), deferred (a tuned sweep's unit: its test split is scored later, "
        "by a unit of its own, only at its group's chosen setting) or only (that unit)")
    trained: SkipJsonSchema[str | None] = Field(
        None, description="set by variantlab run, not in YAML: with test_split: only, the "
        "key of the training unit whose model it scores")

    @field_validator("test_split", "trained")
    @classmethod
    def _set_by_the_run(cls, value: Any, info: ValidationInfo) -> Any:
        """``test_split`` and ``trained`` are the run's to set (it plans the test units at
        the chosen settings, :mod:`variantlab.sweep.units`), never the YAML's."""
        if value not in (None, "scored"):
            raise ValueError(f"{info.field_name} is set by variantlab run itself (a tuned "
                             "sweep scores the test split at each group's chosen setting); "
                             f"remove {info.field_name}")
        return value

    @model_serializer(mode="wrap")
    def _omit_added_defaults(self, handler: Any) -> Any:
        """``compile: auto`` is written as ``false`` when the run's ``steps`` leave it eager
        (the key of an eager run whichever way it was asked for); a run that may compile,
        or whose steps follow from a token budget, keeps ``auto``."""
        data = omit_added_defaults(self, handler(self))
        if isinstance(data, dict) and data.get("compile") == "auto" and self.tokens is None \
                and self.tokens_per_param is None and not use_compile("auto", self.steps):
            data["compile"] = False
        return data

    @field_validator("eval_lengths")
    @classmethod
    def _distinct_lengths(cls, value: list[int] | None) -> list[int] | None:
        return None if value is None else sorted(set(value))

    @field_validator("eval_every", "eval_lengths")
    @classmethod
    def _scored_at_all(cls, value: Any, info: ValidationInfo) -> Any:
        """``eval_every`` and ``eval_lengths`` ask for held-out scores that
        ``eval_batches: 0`` turns off: refused rather than silently recording nothing."""
        if value is not None and info.data.get("eval_batches") == 0:
            asks = "validation curves" if info.field_name == "eval_every" else \
                "test scores at other lengths"
            raise ValueError(f"{info.field_name} asks for {asks}, but eval_batches: 0 turns "
                             f"held-out scoring off, so nothing would be recorded; remove "
                             f"{info.field_name} or eval_batches: 0")
        return value


@dataclass(frozen=True)
class Objective:
    """What a training run minimises: the family task's loss of the output (``__call__``,
    what every loss row reports) plus the task's auxiliary loss of the model's last forward
    (:meth:`total`; nothing for a dense model)."""

    task: Task
    spec: ModelSpec

    def __call__(self, output: Any, batch: Batch) -> torch.Tensor:
        return self.task.loss(self.spec, output, batch)

    def total(self, loss: torch.Tensor, model: torch.nn.Module) -> torch.Tensor:
        """``loss`` plus the auxiliary loss, when the model has one."""
        aux = self.task.aux_loss(self.spec, model)
        return loss if aux is None else loss + aux

#: A rise counts when it exceeds this many standard deviations of (final - first) ...
RISE_SIGMAS = 3.0
#: ... and this fraction of the first loss; a final loss over BLOWUP_FACTOR x the first
#: counts whatever the noise.
RISE_FLOOR = 0.05
BLOWUP_FACTOR = 2.0


def tail_size(n: int) -> int:
    """Steps averaged into ``final_loss``: the last tenth, at least one."""
    return max(1, n // 10)


def diverged(losses: list[float]) -> bool:
    """Whether a training curve diverged: a non-finite loss, or a real rise of the final
    loss (mean of the last tenth of the steps) over the first step's loss.

    A rise is real when it is larger than both ``RISE_SIGMAS`` standard deviations of
    (final - first), with the noise measured in this run (:func:`step_noise`; the final
    loss averages ``k`` steps, so the difference has sqrt(1 + 1/k) x one step's noise), and
    ``RISE_FLOOR`` x |first loss|; or when the final loss is over ``BLOWUP_FACTOR`` x the
    first (a blow-up whose own wild steps would otherwise hide it).
    """
    if not losses or not all(math.isfinite(v) for v in losses):
        return bool(losses)
    k = tail_size(len(losses))
    final = sum(losses[-k:]) / k
    first = losses[0]
    rise = final - first
    if first > 0 and final > BLOWUP_FACTOR * first:
        return True
    margin = max(RISE_SIGMAS * step_noise(losses) * math.sqrt(1 + 1 / k),
                 RISE_FLOOR * abs(first))
    return rise > margin


def setup(spec: ModelSpec, settings: TrainRunSettings, seed: int, data: Any,
          base_dir: Path | str, device: str | None, registry: Registry,
          ) -> tuple[torch.device, torch.nn.Module, Any, datalib.BatchStream, Objective]:
    """``(device, model in train mode, optimizer, batches, loss)`` of a training run (training
    and dynamics probes alike): one batch per step (``steps``, or the token budget), drawn
    when the step needs it (:class:`variantlab.data.sources.BatchStream`, so memory does not
    grow with the steps); ``loss(output, batch)`` is the family task's,
    ``loss.total(value, model)`` adds the auxiliary loss."""
    dev = resolve_device(device or settings.device)
    model = make_model(spec, seed, registry, dev)
    model.train()
    opt = make_optimizer(model, settings)
    n = planned_steps(settings, settings.batch_size * settings.seq_len,
                      non_embedding_params(model))
    batches = datalib.BatchStream(data, spec, settings.batch_size, settings.seq_len, n,
                                  seed=seed, registry=registry, base_dir=base_dir)
    return dev, model, opt, batches, Objective(task_for(spec, registry), spec)


def run(
    spec: ModelSpec, settings: TrainingSettings, *, seed: int, data: Any = None,
    base_dir: Path | str = ".", device: str | None = None, registry: Registry,
) -> list[Row]:
    ctx = getattr(spec, "context_length", None)
    too_long = [n for n in settings.eval_lengths or () if ctx is not None and n > ctx]
    if too_long:  # before any training (validate says so first, at the YAML line)
        raise ValueError(f"eval_lengths: {too_long[0]} is above context_length={ctx}; score "
                         f"at most {ctx} tokens or raise context_length")
    args = (spec, seed, data, base_dir, device, registry)
    if settings.compile != "auto":
        return trained(settings, *args)
    try:
        return trained(settings, *args)
    except CompileError as exc:  # auto: the unit runs eager instead, and says so
        rows = trained(settings.model_copy(update={"compile": False}), *args)
        return [*rows, row("training", "compile_fallback", 1.0, scope="info", name=str(exc))]


def trained(settings: TrainingSettings, spec: ModelSpec, seed: int, data: Any,
            base_dir: Path | str, device: str | None, registry: Registry) -> list[Row]:
    """The rows of one training run, compiled or eager as ``settings.compile`` and its
    steps say (:func:`variantlab.probes.compiled.use_compile`). ``test_split: deferred``
    scores no test split and keeps the final weights
    (:func:`variantlab.probes.checkpoint.keep_weights`); ``only`` scores the test split of
    the model the training unit ``trained`` kept (:func:`tested`)."""
    if settings.test_split == "only":
        return tested(settings, spec, seed, data, base_dir, device, registry)
    return _trained(settings, spec, seed, data, base_dir, device, registry)[0]


def tested(settings: TrainingSettings, spec: ModelSpec, seed: int, data: Any,
           base_dir: Path | str, device: str | None, registry: Registry) -> list[Row]:
    """The test rows of a deferred training unit (``test_loss``, ``test_tokens``, recall,
    ``eval_lengths``): its kept final model, scored as the run would have scored it in
    place (compiled when it trained compiled); when the weights are missing or unusable,
    the model trained again from the same settings (training is deterministic, so the
    model is the same). Nothing when the run ended in a non-finite loss (nor does a run
    scored in place score one)."""
    deferred = settings.model_copy(update={"test_split": "deferred", "trained": None})
    dev, model, _, batches, loss = setup(spec, deferred, seed, data, base_dir, device, registry)
    on = use_compile(deferred.compile, len(batches))
    if settings.trained is None or not checkpoint.kept_weights(settings.trained, model):
        rows, model = _trained(deferred, spec, seed, data, base_dir, device, registry,
                               keep=False)
        finals = [r["value"] for r in rows if r["metric"] == "final_loss"]
        if not finals or not math.isfinite(finals[0]):
            return []
    compiled = compile_model(model, on)
    held = HeldOut(data, spec, settings, base_dir, registry)
    with compile_errors(on):
        return test_rows(held, compiled, loss, dev, settings)


def test_rows(held: HeldOut, model: torch.nn.Module, loss: Objective, dev: torch.device,
              settings: TrainingSettings) -> list[Row]:
    """The test split's rows of a trained ``model``: at ``seq_len`` and at each of
    ``eval_lengths``."""
    rows = test_split_rows("training", held.score("test", model, loss, dev))
    for length in settings.eval_lengths or ():
        rows += length_rows("training", length, held.score("test", model, loss, dev, length))
    return rows


def _trained(settings: TrainingSettings, spec: ModelSpec, seed: int, data: Any,
             base_dir: Path | str, device: str | None, registry: Registry, keep: bool = True,
             ) -> tuple[list[Row], torch.nn.Module]:
    """The rows of a training run and its trained model (``keep``: a deferred run keeps
    its final weights for its test unit)."""
    dev, model, opt, batches, loss = setup(spec, settings, seed, data, base_dir, device, registry)
    on = use_compile(settings.compile, len(batches))
    compiled = compile_model(model, on)
    log: list[Record] = []
    held = HeldOut(data, spec, settings, base_dir, registry)
    curve = Curve(held, compiled, loss, dev, settings.eval_every if scores_held_out(settings)
                  else None)
    with compile_errors(on):
        losses = train(model, compiled, opt, loss, batches, dev, settings, log,
                       on_step=curve.after_step, kept={"curve": curve.raw})

    rows = [row("training", "loss", v, step=i) for i, v in enumerate(losses)]
    rows += [row("training", "lr", lr_at(i, settings, len(batches)), step=i)
             for i in range(len(losses))]
    finite = [v for v in losses if math.isfinite(v)]
    tail = losses[-tail_size(len(losses)):]
    final = sum(tail) / len(tail)
    tokens = batches.tokens  # of the batches drawn: one per step taken
    rows += [
        row("training", "final_loss", final),
        row("training", "best_loss", min(finite) if finite else math.nan),
        row("training", "diverged", float(diverged(losses))),
        row("training", "still_improving", float(still_improving(losses))),
        row("training", "compiled", float(on)),
        row("training", "tokens", float(tokens), unit="count"),
        row("training", "flops", tokens * model_flops_per_token(model, spec, settings.seq_len),
            unit="FLOP"),
    ]
    rows += training_rows(log)
    if scores_held_out(settings) and math.isfinite(final):
        with compile_errors(on):
            val = held.score("val", compiled, loss, dev)
            rows += final_rows("training", val, curve.points, len(losses))
            if settings.test_split == "scored":
                rows += test_rows(held, compiled, loss, dev, settings)
        if settings.test_split == "deferred" and keep:
            checkpoint.keep_weights(model)
    test_set = held.batches("test") if scores_held_out(settings) and math.isfinite(final) else None
    rows += start_rows("training", spec, data, losses, step_noise(finite), test_set)
    return rows, model


def train(model: torch.nn.Module, compiled: torch.nn.Module, opt: Any,
          loss_fn: Objective, batches: datalib.BatchStream | list[Batch], dev: torch.device,
          settings: TrainingSettings, log: list[Record] | None = None,
          on_step: Callable[[int], None] | None = None,
          kept: dict[str, list] | None = None) -> list[float]:
    """The training loop: the task's loss per step, stopping at the first non-finite one.
    ``compiled`` runs the forward (``model`` itself, or it under torch.compile); ``model``
    owns the parameters that are clipped. The step minimises ``loss_fn.total`` (the task's
    loss plus any auxiliary loss); ``log`` receives each step's routing snapshot (routed
    models only); ``on_step(step)`` runs after each optimizer step (held-out curves). A unit
    with checkpoints (:mod:`variantlab.probes.checkpoint`) resumes from its last one and
    writes them as it goes, with the lists of ``kept`` (what ``on_step`` has recorded)."""
    losses: list[float] = []
    routed = routed_layers(model)
    total = len(batches)
    stream = batches if isinstance(batches, datalib.BatchStream) else None
    saver = checkpoint.current() if stream is not None else None
    records: dict[str, list | None] = {"losses": losses, "log": log, **(kept or {})}
    start = checkpoint.resume_unit(saver, model, opt, stream, dev, records)
    params = list(model.parameters())  # clipped each step: listed once
    with fixed_structure(model):  # the model keeps its modules while it trains
        for step in range(start, total):
            batch = (batches.next() if isinstance(batches, datalib.BatchStream)
                     else batches[step]).to(dev)
            for group in opt.param_groups:
                group["lr"] = lr_at(step, settings, total)
            opt.zero_grad(set_to_none=True)
            with autocast(settings.dtype, dev):
                loss = loss_fn(compiled(**batch.inputs), batch)
                objective = loss_fn.total(loss, model)
            value = float(loss.detach())
            losses.append(value)
            if routed and log is not None:
                log.append(snapshot(routed))
            if not math.isfinite(value):
                break
            objective.backward()
            if settings.grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(params, settings.grad_clip)
            opt.step()
            after_step(model)
            if on_step is not None:
                on_step(step)
            if saver is not None and step + 1 < total and saver.due(step + 1):
                checkpoint.save_unit(saver, step + 1, model, opt, stream, dev, records)
    return losses
