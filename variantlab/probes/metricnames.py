"""The per-layer metrics the dynamics probe and the MoE routing rows record, named apart from
the probes' code (which imports torch) so the report's views read them without it."""

#: the dynamics probe's per-layer metrics (:mod:`variantlab.probes.dynamics`)
DYNAMICS_METRICS = ("grad_norm", "update_ratio", "residual_rms", "max_attn_logit",
                    "attn_entropy", "first_token_mass")
#: recorded only by the layers that have them (``sink_mass``: attention with sinks)
DYNAMICS_OPTIONAL = ("sink_mass",)
#: every per-layer metric the dynamics probe may record
DYNAMICS_RECORDED = (*DYNAMICS_METRICS, *DYNAMICS_OPTIONAL)
#: the per-layer scalar routing metrics (``expert_load`` has one row per expert besides;
#: :mod:`variantlab.probes.routing`)
ROUTING_METRICS = ("load_imbalance", "router_entropy", "dropped_fraction", "aux_loss",
                   "z_loss")

__all__ = ["DYNAMICS_METRICS", "DYNAMICS_OPTIONAL", "DYNAMICS_RECORDED", "ROUTING_METRICS"]
