"""The report views of the built-in probes (params, gradients, timing, training, dynamics
and the routing rows the dynamics probe records for mixture-of-experts layers), one module
each: their summary metrics, section, plots, reading and warnings as
:class:`variantlab.plugin.probe.ProbeView` pieces. ``variantlab_plugins.probes`` passes them
with ``views=`` when it registers the probes, as a plugin passes its own; the report core
(:mod:`variantlab.report.parts`) asks the registry, never these modules."""
