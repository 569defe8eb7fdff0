"""The strict pydantic base of every settings class: probe settings (built-in and plugin),
data sources and executor resources. Lowest in the stack, so every stage can subclass it."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

Device = Annotated[str, Field(pattern=r"^(auto|cpu|cuda(:\d+)?|mps)$")]
DType = Literal["float32", "bfloat16", "float16"]


class Strict(BaseModel):
    """No unknown keys; no coercion (``"16"``, ``true`` or ``2.0`` for an int are refused)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


#: What a probe plugin's settings subclass: strict, frozen, no unknown keys.
ProbeSettings = Strict
