"""Experiment-level settings: what to measure (``measure:``) and on what data (``data:``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt

Device = Annotated[str, Field(pattern=r"^(auto|cpu|cuda(:\d+)?|mps)$")]
DType = Literal["float32", "bfloat16", "float16"]


class Strict(BaseModel):
    """No unknown keys; no coercion (``"16"``, ``true`` or ``2.0`` for an int are refused)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


# -- probes ------------------------------------------------------------------------------
class ParamsSettings(Strict):
    """Parameter counts: total, trainable, non-embedding, per slot, per layer."""


class GradientsSettings(Strict):
    """Gradients of the family's loss on real batches, averaged over ``batches``."""

    batch_size: PositiveInt = Field(8, description="rows per batch")
    seq_len: PositiveInt = Field(128, description="positions per row")
    batches: PositiveInt = Field(4, description="batches whose mean gradient is measured")
    mode: Literal["train", "eval"] = Field("train", description="train: dropout active")


class TimingSettings(Strict):
    """Forward / forward+backward / optimizer-step times (torch.utils.benchmark)."""

    batch_size: PositiveInt = Field(8, description="rows per timed batch")
    seq_len: PositiveInt = Field(256, description="positions per row")
    passes: list[Literal["forward", "backward", "step"]] = Field(
        ["forward", "backward"], description="what is timed: forward (no grad), backward "
        "(forward + backward), step (backward + AdamW step)")
    dtype: DType = Field("float32", description="autocast dtype; float32: none")
    device: Device = Field("auto", description="auto, cpu, cuda, cuda:N or mps")
    warmup: int = Field(2, ge=0, description="untimed calls before timing")
    repeats: PositiveInt = Field(10, description="timed blocks (median, IQR)")
    peak_flops: PositiveFloat | None = Field(
        None, description="device peak FLOP/s for MFU; default from the built-in table"
    )
    compile: bool = Field(
        False, description="run the model under torch.compile; compile time is timed apart")


class TrainRunSettings(Strict):
    """What every training run takes (the training and dynamics probes)."""

    steps: PositiveInt = Field(200, description="optimizer steps (one fresh batch each)")
    lr: PositiveFloat = Field(3e-4, description="AdamW learning rate")
    batch_size: PositiveInt = Field(16, description="rows per batch")
    seq_len: PositiveInt = Field(128, description="positions per row")
    warmup_steps: int = Field(0, ge=0, description="steps of linear learning-rate warm-up")
    grad_clip: PositiveFloat | None = Field(
        1.0, description="clip gradients to this global L2 norm (null: no clipping)")
    weight_decay: float = Field(0.1, ge=0, description="AdamW weight decay")
    eval_batches: int = Field(
        4, ge=0, description="fresh batches scored in eval mode after training (0: none)")
    dtype: DType = Field("float32", description="autocast dtype; float32: none")
    device: Device = Field("auto", description="auto, cpu, cuda, cuda:N or mps")


class TrainingSettings(TrainRunSettings):
    """A short AdamW run with linear warm-up and gradient clipping."""

    compile: bool = Field(False, description="run the model under torch.compile")


class DynamicsSettings(TrainRunSettings):
    """A training run (training's settings) recording per-layer dynamics every ``every`` steps."""

    every: PositiveInt = Field(10, description="record every k-th optimizer step (and step 0)")
    eval_batches: int = Field(
        0, ge=0, description="fresh batches scored in eval mode after training (0: none)")


class ProbeResources(Strict):
    """What each unit of a probe asks of an executor that places units on machines
    (``--executor ray``); the in-process and pool executors ignore it. Not part of unit
    keys: it decides where a number is computed, never the number."""

    num_cpus: PositiveFloat = Field(
        1.0, description="CPUs each unit reserves; its torch threads (at least 1)")
    num_gpus: Annotated[float, Field(ge=0)] | None = Field(
        None, description="GPUs each unit reserves (default: 1 when the unit's device is "
                          "cuda, else 0)")


#: What a probe plugin's settings subclass: strict, frozen, no unknown keys.
ProbeSettings = Strict


class MeasureSpec:
    """Which probes run, in the order the experiment file names them: probe name ->
    its validated settings (the experiment loader validates ``measure:`` against the
    registry's probes)."""

    def __init__(self, settings: Mapping[str, Any] | None = None, /, *, registry: Any = None,
                 **probes: Any) -> None:
        """``settings`` or keywords: probe name -> settings object, mapping or None (the
        probe does not run); mappings are validated by the probe registered in ``registry``
        (required then)."""
        given = {**(settings or {}), **probes}
        if any(not isinstance(v, Strict | None) for v in given.values()) and registry is None:
            raise TypeError("MeasureSpec: pass registry= to validate probe settings given as "
                            "mappings (or pass the probes' settings objects)")
        self._settings: dict[str, Strict] = {
            n: v if isinstance(v, Strict) else registry.probe(n).settings(v)
            for n, v in given.items() if v is not None}

    def probes(self) -> dict[str, Strict]:
        """Probe name -> its settings, for the probes that run."""
        return dict(self._settings)

    def __getitem__(self, name: str) -> Strict:
        return self._settings[name]

    def __contains__(self, name: object) -> bool:
        return name in self._settings

    def get(self, name: str) -> Strict | None:
        """The settings of probe ``name``, or None when it does not run."""
        return self._settings.get(name)

    def model_dump(self, mode: str = "json") -> dict[str, Any]:
        return {n: s.model_dump(mode=mode) for n, s in self._settings.items()}

    def max_seq_len(self) -> int:
        lens = [getattr(s, "seq_len", 0) for s in self.probes().values()]
        return max(lens, default=0)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MeasureSpec) and self.model_dump() == other.model_dump()

    def __hash__(self) -> int:  # immutable after construction, like the settings it holds
        return hash(tuple(self._settings.items()))

    def __repr__(self) -> str:
        return f"MeasureSpec({self._settings!r})"


# -- data --------------------------------------------------------------------------------
class SyntheticData(Strict):
    """Random tokens, or associative recall (key-value pairs, then a queried key)."""

    source: Literal["synthetic"] = "synthetic"
    task: Literal["random", "recall"] = "random"


class TextData(Strict):
    """Text files (a path or glob, relative to the experiment file), GPT-2 BPE tokens."""

    source: Literal["text"] = "text"
    path: str


class StdlibData(Strict):
    """The running Python's standard-library sources: a real corpus present everywhere."""

    source: Literal["stdlib"] = "stdlib"
    max_files: PositiveInt | None = 200


DataSpec = Annotated[SyntheticData | TextData | StdlibData, Field(discriminator="source")]
