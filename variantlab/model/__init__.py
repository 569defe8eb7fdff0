"""Model specs and their assembly: the spec classes, ``build_model``, tasks (batch and loss per
family), declared roles and positions (stage 2)."""
