"""Checks of an experiment made before a run (``variantlab validate`` and ``variantlab run``
call :func:`preflight`), after the file has been read (:mod:`variantlab.config.checks`):
devices this machine lacks, the data (a text path that matches nothing, a folder, too few
tokens for a batch; recall needs vocab_size >= 4) and the size guard
(:mod:`variantlab.sweep.sizeguard`). Every message reads ``FILE:LINE:COL: key.path: message``.
"""

from __future__ import annotations

import codecs
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..config.yamlio import YamlDoc

if TYPE_CHECKING:
    from ..config.experiment import Experiment, Variant


def _unknown(device: str) -> int | None:
    return None


def device_problem(device: str) -> str | None:
    """Why this machine cannot run on ``device`` (None: it can). ``auto`` is always fine."""
    if device in ("auto", "cpu"):
        return None
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            return (f"device {device!r}: torch {torch.__version__} sees no CUDA device on this "
                    "machine; use cpu or auto")
        index = int(device.split(":")[1]) if ":" in device else 0
        count = torch.cuda.device_count()
        if index >= count:
            return (f"device {device!r}: this machine has {count} CUDA device(s), "
                    f"cuda:0..cuda:{count - 1}; pick one of them")
        return None
    if device == "mps" and not torch.backends.mps.is_available():
        return "device 'mps': MPS is not available on this machine; use cpu or auto"
    return None


def _file_warning(path: Path) -> str | None:
    with open(path, "rb") as f:
        head = f.read(1 << 20)
    if b"\0" in head[:8192]:
        return f"{path} looks binary (NUL bytes); it is read as text all the same"
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=len(head) < 1 << 20)
    except UnicodeDecodeError as exc:
        return (f"{path} is not UTF-8 (byte {exc.start}: {exc.reason}); undecodable bytes "
                "are read as U+FFFD")
    return None


def recall_fit_problems(exp: Any, doc: YamlDoc, readers: dict, variants: list) -> list[str]:
    """Recall pairs (``data.n_pairs``) that leave no query in a row of the length a probe
    reads (``data.seq_len`` or the probe's ``seq_len``), once per variant."""
    from ..data.sources import DataError, SyntheticData, recall_pairs

    grid = getattr(exp.spec, "grid", {}) or {}
    loc = ("grid", "data.n_pairs") if "data.n_pairs" in grid else ("data", "n_pairs")
    out = []
    for v in variants:
        data = v.data_or(exp.data) if hasattr(v, "data_or") else exp.data
        if not isinstance(data, SyntheticData) or data.task != "recall" or not data.n_pairs:
            continue
        for probe, settings in readers.items():
            try:
                recall_pairs((data.seq_len or settings.seq_len) + 1, v.spec.vocab_size,
                             data.n_pairs)
            except DataError as exc:
                out.append(doc.message(loc, f"{exc} (variant {v.name!r}, measure.{probe})"))
                break
    return out


def bytes_problems(exp: Experiment, doc: YamlDoc, variants: list) -> list[str]:
    """The ``bytes`` tokenizer (ids 0-255, never folded) for a variant whose vocab_size is
    below 256, whether ``data:`` or a variant's data axis (``data.tokenizer``) asks for it."""
    grid = getattr(exp.spec, "grid", {}) or {}
    small = [v.name for v in variants if v.spec.vocab_size < 256
             and getattr(v.data_or(exp.data), "tokenizer", None) == "bytes"]
    if not small:
        return []
    axis = grid.get("data.tokenizer") or []
    loc = (("grid", "data.tokenizer", axis.index("bytes")) if "bytes" in axis
           else ("data", "tokenizer"))
    return [doc.message(loc, "bytes gives ids 0-255 and is never folded: vocab_size must be "
                             f">= 256; too small in {small}; raise vocab_size or use gpt2")]


def data_problems(exp: Experiment, doc: YamlDoc) -> tuple[list[str], list[str]]:
    """(errors, warnings) about ``data:`` for the probes that read it."""
    from ..data.cache import CacheWarning
    from ..data.sources import SPLIT_NAMES, DataError, SyntheticData, TextData, corpus_splits, text_files
    from ..data.splits import SPLITS, shortfalls
    from ..model.tasks import task_for
    from ..probes.heldout import scores_held_out

    data = exp.data
    errors: list[str] = []
    warns: list[str] = []
    readers: dict[str, Any] = {n: s for n, s in exp.measure.probes().items()
                               if getattr(s, "seq_len", None)}  # settings that read tokens
    token_variants = [v for v in exp.variants
                      if task_for(v.spec, exp.registry).inputs != "floats"]
    if not readers or not token_variants:
        return errors, warns
    errors += recall_fit_problems(exp, doc, readers, token_variants)
    errors += bytes_problems(exp, doc, token_variants)
    if isinstance(data, SyntheticData):
        small = [v.name for v in token_variants if v.spec.vocab_size < 4]
        if data.task == "recall" and small:
            errors.append(doc.message(("data", "task"), "the recall task needs vocab_size >= 4 "
                                      f"(key and value halves); too small in {small}"))
        return errors, warns
    if isinstance(data, TextData):
        full = Path(os.path.expanduser(data.path))
        full = full if full.is_absolute() else exp.base_dir / full
        if full.is_dir():
            errors.append(doc.message(("data", "path"), f"{data.path!r} is a folder ({full}); "
                                      f"give files or a glob, e.g. "
                                      f"'{data.path.rstrip('/')}/*.txt'"))
            return errors, warns
        try:
            files = text_files(data.path, exp.base_dir)
        except DataError as exc:
            return errors + [doc.message(("data", "path"),
                                         str(exc).removeprefix("data.path "))], warns
        warns += [w for w in map(_file_warning, files) if w]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", CacheWarning)
            parts, where = corpus_splits(data, exp.base_dir)
        for w in caught:
            if issubclass(w.category, CacheWarning):
                warns.append(str(w.message))
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    except DataError as exc:
        key = "path" if hasattr(data, "path") else "source"
        return errors + [doc.message(("data", key), str(exc).removeprefix("data.path "))], warns
    probe, settings = max(readers.items(), key=lambda kv: kv[1].seq_len)
    held = any(scores_held_out(s) for s in readers.values() if hasattr(s, "eval_batches"))
    if held:
        warns += shortfalls(parts, where)
    for split in SPLITS:
        n_tokens, name = len(parts.of(split)), SPLIT_NAMES[split]
        if (split == "train" or held) and n_tokens < settings.seq_len + 2:
            errors.append(doc.message(
                ("data", "path" if hasattr(data, "path") else "source"),
                f"the {name} split of {where} has {n_tokens} tokens, fewer than one batch of "
                f"measure.{probe} needs (seq_len + 2 = {settings.seq_len + 2}); use more text, "
                "a shorter seq_len or other val_fraction / test_fraction"))
    return errors, warns


def size_problems(exp: Experiment, doc: YamlDoc, device: str | None,
                  available: Callable[[str], int | None] | None = None,
                  only: set[str] | None = None) -> list[str]:
    """The size guard for every variant (those in ``only`` when given) and probe on the
    device it runs on."""
    from .sizeguard import available_bytes, refusal
    from .units import resolve_device

    out: list[tuple[int, int, str]] = []  # (probe, variant, message): in reading order
    probes = list(exp.measure.probes().items())
    # the probes with a batch first: their builds give the model's counts to those without
    # one (sizeguard.layer_costs), which then build nothing
    for p_at in sorted(range(len(probes)), key=lambda i: not _has_batch(probes[i][1])):
        probe, base = probes[p_at]
        for v_at, v in enumerate(exp.variants):
            if only is not None and v.name not in only:
                continue
            settings = exp.probes_of(v)[probe] if v.settings else base
            dev = resolve_device(probe, settings, device) or "cpu"
            found = refusal(v.spec, exp.registry, probe, settings, dev,
                            available or available_bytes)
            if found is None:
                continue
            field, message = found
            loc = (("measure", probe, "batch_size") if field == "batch_size"
                   else override_loc(exp, v, field))
            if field == "batch_size" and "batch_size" in v.settings.get(probe, {}):
                from ..config.axes import setting_loc  # a batch_size setting axis

                loc = setting_loc(exp.spec, v.name, f"measure.{probe}.batch_size",
                                  v.settings[probe]["batch_size"])
            out.append((p_at, v_at, doc.message(loc, f"variant {v.name!r}: {message}")))
    return [message for *_, message in sorted(out)]


def _has_batch(settings: Any) -> bool:
    return bool(getattr(settings, "batch_size", 0) and getattr(settings, "seq_len", 0))


def budget_problems(exp: Experiment, doc: YamlDoc, only: set[str] | None = None) -> list[str]:
    """Training budgets (``steps``, ``tokens``, ``tokens_per_param``) that work out to more
    than :data:`variantlab.probes.recipe.MAX_STEPS` steps, or to fewer than ``warmup_steps``,
    once per variant and probe."""
    from ..config.axes import setting_loc
    from ..probes.recipe import BUDGET_KEYS, RecipeSettings, steps_problem, worked_out_steps
    from .sizeguard import EstimateError, model_cost, settings_tokens

    out = []
    for probe, base in exp.measure.probes().items():
        for v in exp.variants:
            settings = exp.probes_of(v)[probe] if v.settings else base
            if (only is not None and v.name not in only) or not isinstance(settings,
                                                                           RecipeSettings):
                continue
            non_embedding = 0
            if settings.tokens_per_param is not None:
                try:
                    non_embedding = model_cost(v.spec, exp.registry).non_embedding
                except EstimateError:
                    continue
            per_step = settings_tokens(settings)
            found = steps_problem(settings, per_step, non_embedding)
            steps = worked_out_steps(settings, per_step, non_embedding)
            if found is None and settings.warmup_steps > steps:
                found = ("warmup_steps", f"warmup_steps={settings.warmup_steps} is above the "
                         f"{steps:,} steps of the run: the learning rate would never reach lr; "
                         "use warmup_steps <= steps or a longer budget")
            if found is None:
                continue
            key, message = found
            change = v.settings.get(probe, {})
            if key == "warmup_steps" and key not in change:  # the variant's budget is short
                key = next((k for k in BUDGET_KEYS if k in change), key)
            loc: tuple = (setting_loc(exp.spec, v.name, f"measure.{probe}.{key}", change[key])
                          if key in change else ("measure", probe, key))
            out.append(doc.message(loc, f"variant {v.name!r}: {message}"))
    return out


#: a model whose meta build failed is built again on the CPU (is it the meta device?) only
#: when it has about this many parameters or fewer
CPU_RETRY_PARAMS = 20_000_000


def build_problems(exp: Experiment, doc: YamlDoc, only: set[str] | None = None) -> list[str]:
    """Variants whose model cannot be built (a plugin's build function with the wrong
    signature, one that raises), named by the component whose build failed, its kind and
    its plugin. The builds are the size guard's (:func:`variantlab.sweep.sizeguard.model_cost`:
    on the meta device, no memory or compute, 1 and 2 layers of each layer kind, cached for
    the size guard after it). A build that fails only on the meta device (the plugin reads a
    tensor's values) is tried again on the CPU when the model is small, and passes if it
    builds there."""
    from ..model.build import build_model
    from .sizeguard import EstimateError, model_cost

    out, seen = [], set()
    for v in exp.variants:
        text = repr(v.spec.to_data())
        if (only is not None and v.name not in only) or text in seen:
            continue
        seen.add(text)
        try:
            model_cost(v.spec, exp.registry)
        except EstimateError as exc:
            if _small(v.spec) and _builds_on_cpu(build_model, v.spec, exp.registry):
                continue
            cause = exc.__cause__ or exc
            slot, what = failed_component(cause)
            written = [k for k in (slot, f"{slot}.kind") if slot and k in v.overrides] + \
                sorted(k for k in v.overrides if slot and k.startswith(f"{slot}."))
            loc = override_loc(exp, v, (written or [slot])[0]) if slot else ("model",)
            message = " ".join(f"{type(cause).__name__}: {cause}".split())[:300]
            out.append(doc.message(loc, f"variant {v.name!r}: {what} cannot be built: "
                                        f"{message}; fix the plugin's build (see "
                                        "docs/plugins-reference.md) or use another kind"))
    return out


def _small(spec: Any) -> bool:
    width, layers = getattr(spec, "emb_dim", 0) or 0, getattr(spec, "n_layers", 0) or 0
    vocab = getattr(spec, "vocab_size", 0) or 0
    return 12 * width * width * layers + 2 * vocab * width <= CPU_RETRY_PARAMS


def _builds_on_cpu(build_model: Callable[..., Any], spec: Any, registry: Any) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.device("cpu"):
                build_model(spec, registry)
    except KeyboardInterrupt:
        raise
    except BaseException:
        return False
    return True


def failed_component(exc: BaseException) -> tuple[str | None, str]:
    """(slot, description) of the innermost component whose build raised ``exc`` (from
    the frames of :meth:`variantlab.model.build.Parts.component`); (None, "the model")
    when none did (the family's own build)."""
    from ..model.build import Parts

    code = Parts.component.__code__
    found: dict[str, Any] | None = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is code:
            found = tb.tb_frame.f_locals
        tb = tb.tb_next
    if not found or "comp" not in found:
        return None, "the model"
    comp = found["comp"]
    return str(found["slot"]), (f"{found['slot']} {comp.kind!r} (registered by "
                                f"{comp.plugin})")


def override_loc(exp: Experiment, variant: Variant, field: str) -> tuple:
    """Where ``field`` of ``variant`` is written: its grid value, its named ``set:`` entry,
    else ``model.FIELD`` (or ``model``)."""
    spec = exp.spec
    if field in variant.overrides:
        if field in spec.grid:
            return ("grid", field, spec.grid[field].index(variant.overrides[field]))
        for i, named in enumerate(spec.variants):
            if named.name == variant.name:
                return ("variants", i, "set", field)
    parts = tuple(field.split("."))  # a component's field: feedforward.n_experts
    node: Any = spec.model
    for depth, part in enumerate(parts):
        if not isinstance(node, dict) or part not in node:
            return ("model", *parts[:depth]) if depth else ("model",)
        node = node[part]
    return ("model", *parts)


def preflight(exp: Experiment, doc: YamlDoc, device: str | None = None,
              available: Callable[[str], int | None] | None = None,
              only: set[str] | None = None, here: bool = True) -> list[str]:
    """Devices, data and sizes (of the variants in ``only`` when given); raises
    ``InputError`` listing every problem, returns the warnings (e.g. a non-UTF-8 corpus).
    ``here`` false: the units run on other machines, so this one's devices and memory are
    not checked (the data still is: it is read here too)."""
    from ..errors import InputError

    errors = []
    if not here:
        available = _unknown
    for probe, settings in exp.measure.probes().items() if here else ():
        asked = getattr(settings, "device", None)
        problem = device_problem(asked) if asked and device is None else None
        if problem:
            errors.append(doc.message(("measure", probe, "device"), problem))
    if errors:
        raise InputError(errors)
    errors = build_problems(exp, doc, only)
    if errors:
        raise InputError(errors)
    data_errors, warns = data_problems(exp, doc)
    errors = data_errors + budget_problems(exp, doc, only)
    errors += size_problems(exp, doc, device, available, only)
    if errors:
        raise InputError(errors)
    return warns
