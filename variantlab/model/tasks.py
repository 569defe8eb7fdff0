"""What a family's models are fed and scored by: the data side of a family plugin.

A model spec is data (sizes and components); how a batch is made for it and how its output
is scored belong to its family, which registers a :class:`Task` with its spec class and
build (``register(family, spec_cls, build, task=...)``). The probes ask the registry for the
task of a spec (:func:`task_for`) and never call methods on the spec.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.nn.functional as F

from .sparse import aux_loss

if TYPE_CHECKING:  # annotations only: the registry imports nothing from here
    from ..plugin.registry import Registry
    from .specs import ModelSpec


@dataclass
class Batch:
    """Keyword inputs of a model's forward and the target of its loss."""

    inputs: dict[str, torch.Tensor]
    target: torch.Tensor
    n_tokens: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def to(self, device: torch.device | str) -> Batch:
        moved = {k: v.to(device) for k, v in self.inputs.items()}
        return Batch(moved, self.target.to(device), self.n_tokens, self.extra)


class Task:
    """Next-token prediction over token ids (GPT-2's objective): the base every task extends.

    ``inputs`` says what :meth:`batch` is built from: ``"tokens"``, rows of token ids that the
    data source gives (synthetic, text or stdlib); ``"floats"``, inputs the task makes itself
    (the data source is ignored). Subclasses override :meth:`batch` and/or :meth:`loss`.
    """

    inputs: ClassVar[str] = "tokens"

    def batch(
        self,
        spec: ModelSpec,
        batch_size: int,
        seq_len: int,
        *,
        tokens: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> Batch:
        """A batch from ``tokens`` (B, seq_len + 1), or from random tokens when not given."""
        if tokens is None:
            tokens = torch.randint(0, spec.vocab_size, (batch_size, seq_len + 1),
                                   generator=generator)
        idx, target = tokens[:, :-1], tokens[:, 1:]  # (B, T) each
        return Batch({"idx": idx}, target, n_tokens=idx.numel())

    def loss(self, spec: ModelSpec, output: torch.Tensor, batch: Batch) -> torch.Tensor:
        """Cross-entropy of (B, T, vocab_size) logits against the (B, T) target; positions
        whose target is -100 are not scored."""
        return F.cross_entropy(output.flatten(0, 1), batch.target.flatten())

    def aux_loss(self, spec: ModelSpec, model: torch.nn.Module) -> torch.Tensor | None:
        """The auxiliary loss that training adds to :meth:`loss`, from the model's last
        forward: the weighted balancing terms of its routed (mixture-of-experts) modules
        (:func:`variantlab.model.sparse.aux_loss`); None for a dense model, whose objective
        is :meth:`loss` alone. Probes report it apart from the task's loss."""
        return aux_loss(model)

    def output_shape(self, spec: ModelSpec, batch: Batch) -> tuple[int, ...]:
        """The shape the model's forward returns for ``batch`` (logits per target position)."""
        return (*batch.target.shape, spec.vocab_size)


NEXT_TOKEN = Task()


def task_for(spec: ModelSpec, registry: Registry | None = None) -> Task:
    """The task registered with ``spec``'s family in ``registry`` (``None``: the default
    registry, :func:`variantlab.get_registry`)."""
    if registry is None:
        from ..plugin.registry import get_registry

        registry = get_registry()
    return registry.get("family", spec.family, ("family",)).task  # set for every family
