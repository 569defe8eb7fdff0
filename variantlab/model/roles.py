"""Tags a component puts on its modules, so that inits and probes find what they need by
declaration, never by position (registration order) or by name.

- ``variantlab_role`` on a Linear: what it computes. ``query``, ``key``, ``value``,
  ``attn_gate`` (a mixer's or attention's output gate, W_g x), ``attn_out``, ``ffn_in``,
  ``ffn_gate``, ``ffn_out``. A Linear whose role is in
  :data:`OUTPUT_ROLES` writes to the residual stream (GPT-2's ``normal`` init scales those);
  DeepNet's init reads the others.
- ``variantlab_stacked`` on a module holding several Linears' weights stacked in one
  parameter (the ``moe`` experts' ``W_up`` (n_experts, out, in) ...): a list of
  ``(parameter name, role)``; the inits treat each slice along the first dim as one Linear
  of that role, its bias the parameter named ``b_...`` for ``W_...``.
- ``variantlab_slot`` / ``variantlab_kind`` on a built component (set by the build).
- ``variantlab_layer`` on a block: its index in the stack.
"""

from __future__ import annotations

from typing import TypeVar

from torch import nn

M = TypeVar("M", bound=nn.Module)

#: roles of the Linears that write a sublayer's output into the residual stream
OUTPUT_ROLES = frozenset({"attn_out", "ffn_out"})
ROLES = frozenset({"query", "key", "value", "attn_gate", "ffn_in", "ffn_gate"}) | OUTPUT_ROLES


def declare_role(linear: M, role: str) -> M:
    """Mark ``linear`` with ``role`` (one of :data:`ROLES`) and return it, so a component
    declares where it creates: ``self.W_gate = declare_role(nn.Linear(d, d), "attn_gate")``.
    ValueError for a role not in :data:`ROLES`."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; expected one of {sorted(ROLES)}")
    setattr(linear, "variantlab_role", role)  # noqa: B010 (nn.Module's __setattr__ is typed for tensors)
    return linear


def mark(module: M, **tags: object) -> M:
    """Set ``variantlab_<name>`` = value on ``module`` for each keyword; returns it."""
    for name, value in tags.items():
        setattr(module, f"variantlab_{name}", value)
    return module


def role_of(module: nn.Module) -> str | None:
    """The declared role of ``module``, or None."""
    return getattr(module, "variantlab_role", None)
