"""Checks of an experiment made before a run (``variantlab validate`` and ``variantlab run``
call :func:`preflight`), after the file has been read (:mod:`variantlab.config.checks`):
devices this machine lacks, the data (a text path that matches nothing, a folder, too few
tokens for a batch; recall needs vocab_size >= 4) and the size guard
(:mod:`variantlab.sweep.sizeguard`). Every message reads ``FILE:LINE:COL: key.path: message``.
"""

from __future__ import annotations

import codecs
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..config.yamlio import YamlDoc


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


def data_problems(exp: Any, doc: YamlDoc) -> tuple[list[str], list[str]]:
    """(errors, warnings) about ``data:`` for the probes that read it."""
    from ..data.sources import DataError, SyntheticData, TextData, text_files, token_stream
    from ..model.tasks import task_for

    data = exp.data
    errors: list[str] = []
    warns: list[str] = []
    readers = {n: s for n, s in exp.measure.probes().items() if getattr(s, "seq_len", None)}
    token_variants = [v for v in exp.variants
                      if task_for(v.spec, exp.registry).inputs != "floats"]
    if not readers or not token_variants:
        return errors, warns
    if isinstance(data, SyntheticData) and data.task == "recall":
        small = [v.name for v in token_variants if v.spec.vocab_size < 4]
        if small:
            errors.append(doc.message(("data", "task"), "the recall task needs vocab_size >= 4 "
                                      f"(key and value halves); too small in {small}"))
    if not isinstance(data, TextData):
        return errors, warns
    full = Path(os.path.expanduser(data.path))
    full = full if full.is_absolute() else exp.base_dir / full
    if full.is_dir():
        errors.append(doc.message(("data", "path"), f"{data.path!r} is a folder ({full}); give "
                                  f"files or a glob, e.g. '{data.path.rstrip('/')}/*.txt'"))
        return errors, warns
    try:
        files = text_files(data.path, exp.base_dir)
    except DataError as exc:
        return errors + [doc.message(("data", "path"), str(exc).removeprefix("data.path "))], warns
    warns += [w for w in map(_file_warning, files) if w]
    n_tokens = token_stream(tuple(str(f) for f in files)).numel()
    probe, settings = max(readers.items(), key=lambda kv: kv[1].seq_len)
    if n_tokens < settings.seq_len + 2:
        errors.append(doc.message(("data", "path"), f"{len(files)} file(s) give {n_tokens} "
                                  f"tokens, fewer than one batch of measure.{probe} needs "
                                  f"(seq_len + 2 = {settings.seq_len + 2}); use more text or "
                                  "a shorter seq_len"))
    return errors, warns


def size_problems(exp: Any, doc: YamlDoc, device: str | None,
                  available: Callable[[str], int | None] | None = None,
                  only: set[str] | None = None) -> list[str]:
    """The size guard for every variant (those in ``only`` when given) and probe on the
    device it runs on."""
    from .sizeguard import available_bytes, refusal
    from .units import resolve_device

    out = []
    for probe, base in exp.measure.probes().items():
        for v in exp.variants:
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
            out.append(doc.message(loc, f"variant {v.name!r}: {message}"))
    return out


def override_loc(exp: Any, variant: Any, field: str) -> tuple:
    """Where ``field`` of ``variant`` is written: its grid value, its named ``set:`` entry,
    else ``model.FIELD`` (or ``model``)."""
    spec = exp.spec
    if field in variant.overrides:
        if field in spec.grid:
            return ("grid", field, spec.grid[field].index(variant.overrides[field]))
        for i, named in enumerate(spec.variants):
            if named.name == variant.name:
                return ("variants", i, "set", field)
    return ("model", field) if field in spec.model else ("model",)


def preflight(exp: Any, doc: YamlDoc, device: str | None = None,
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
    data_errors, warns = data_problems(exp, doc)
    errors = data_errors + size_problems(exp, doc, device, available, only)
    if errors:
        raise InputError(errors)
    return warns
