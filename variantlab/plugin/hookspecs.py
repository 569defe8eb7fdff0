"""The hooks a variantlab plugin implements: one ``register_<slot>s(register)`` per slot.

Every hook receives ``register(kind, spec_cls, build)``: ``kind`` is the name used in YAML,
``spec_cls`` a :class:`variantlab.ComponentSpec` subclass (``extra="forbid"``, a ``kind``
literal), ``build`` a callable returning a fresh ``nn.Module`` from a validated spec and the
explicit sizes listed per slot below. Builds never see the whole model config.
"""

import pluggy

hookspec = pluggy.HookspecMarker("variantlab")
hookimpl = pluggy.HookimplMarker("variantlab")


@hookspec
def register_norms(register):
    """``build(spec, dim) -> nn.Module`` mapping (..., dim) to (..., dim). Optional keyword
    ``bias`` (the model's ``norm_bias``), passed only to builds that name it: False drops the
    learned shift."""


@hookspec
def register_activations(register):
    """``build(spec) -> nn.Module`` applied elementwise, shape preserved."""


@hookspec
def register_feedforwards(register):
    """``build(spec, emb_dim, make_activation) -> nn.Module``: (B, T, emb_dim) -> (B, T, emb_dim);
    ``make_activation()`` returns a fresh module of the model's activation slot. Optional keyword
    ``bias`` (the model's ``ffn_bias``), passed only to builds that name it. Declare the Linears'
    roles with ``variantlab.model.roles.declare_role`` (``ffn_in``, ``ffn_gate``, ``ffn_out``)."""


@hookspec
def register_attentions(register):
    """``build(spec, emb_dim, n_heads, context_length, drop_rate, qkv_bias, causal)``, plus
    the optional keywords ``positions``, ``make_norm`` and ``out_bias``, each passed only if
    the build's signature takes it:

    - ``positions``: the model's :class:`variantlab.model.positions.Positions` module (shared, not
      a submodule). In self-attention, apply ``positions.rotate(q, k, position_ids)`` to the
      per-head queries (B, H, T, hd) and keys (B, H_kv, T, hd) and add
      ``positions.score_bias(n_heads, T, S, device, dtype)`` (H, T, S) or None to the scaled
      scores; cross-attention applies neither. A build that takes ``positions`` must accept
      ``position_ids`` (B, T) in forward. Rotary/ALiBi with a build that does not take
      ``positions`` fail validation.
    - ``make_norm(dim, spec=None)``: a norm of width dim (model's norm slot or ``spec``).
    - ``out_bias``: bias in the output projection (default True).

    Declare the Linears' roles (``query``, ``key``, ``value``, ``attn_out``) with
    ``variantlab.model.roles.declare_role``; the ``normal`` init scales the ``attn_out`` one.

    ``forward(x, memory=None, key_padding_mask=None)`` maps x (B, T, D) to (B, T, D);
    keys and values come from ``memory`` (B, S, D) when given (cross-attention), else from x;
    ``key_padding_mask`` (B, S) is True at padded keys, which receive no attention. A query
    with no visible key gets a finite output and finite gradients (the built-in: zero)."""


@hookspec
def register_residuals(register):
    """Residual wiring. The spec class's ``scope`` class variable picks the build signature.

    ``scope = "sublayer"`` (the default; every residual written before scopes existed):
    ``build(spec, sublayer, make_norm, in_dim, out_dim, drop_rate) -> nn.Module`` wrapping one
    sublayer and the norm(s) it owns (``make_norm(dim)`` builds one); ``forward(x, *args, **kw)``
    passes extra arguments to the sublayer. A transformer block wraps its attention and its
    feed-forward each in one.

    ``scope = "block"``: ``build(spec, attention, feedforward, make_norm, dim, drop_rate)``
    wraps a whole block (e.g. the parallel block); ``forward(x, *args, **kw)`` passes the extras
    to the attention. Families whose layers are not attention + feed-forward refuse it.

    Optional keyword, passed only to builds whose signature names it (or takes ``**kwargs``):
    ``n_layers``, the model's number of blocks (DeepNorm's constants depend on it)."""


@hookspec
def register_positionals(register):
    """``build(spec, emb_dim, context_length) -> nn.Module``: token embeddings (B, T, D) in,
    the same with position information added out. A :class:`variantlab.model.positions.Positions`
    subclass can also rotate queries and keys (``rotate``) or bias the attention scores
    (``score_bias``) in every self-attention; its ``forward`` takes ``position_ids`` (B, T)."""


@hookspec
def register_inits(register):
    """Weight initialisation schemes. ``build(spec) -> apply``; ``apply(model)`` runs once on the
    assembled model and re-initialises its parameters in place (modules carry a
    ``variantlab_slot`` tag naming their slot). It must not add, remove or reshape parameters."""


@hookspec
def register_families(register):
    """Model families: ``register(family, spec_cls, build, *, task)``. ``spec_cls`` subclasses
    :class:`variantlab.ModelSpec` with a ``family`` literal; ``build(spec, parts) -> nn.Module``
    assembles the model from ``parts`` (a :class:`variantlab.model.build.Parts`), whose methods build
    each slot's component; ``task``, a :class:`variantlab.model.tasks.Task`, makes the batches its
    forward takes (``forward(**batch.inputs)``) and scores the output."""


@hookspec
def register_probes(register):
    """Measurements. ``register(name, settings_cls, run, *, views=(), serial=False,
    device_free=False, trains=False, passes=(), metrics=None)``; ``name`` is the key under ``measure:``.

    - ``settings_cls``: a :class:`variantlab.ProbeSettings` subclass (strict, frozen, unknown
      keys refused), the keys the probe takes: ``measure: {name: {key: value}}``; it and
      ``run`` may also be references ``"package.module:attr"``, imported when a command
      first needs them (``variantlab report`` needs neither);
    - ``run(spec, settings, *, seed, data, base_dir, device, registry) -> list[Row]``
      measures one variant: build the model with ``torch.manual_seed(seed)`` and
      ``variantlab.build_model(spec, registry)`` (or ``variantlab.model.build.make_model``),
      read batches with ``variantlab.data.sources.batches(data, spec, ..., registry=registry)``
      (made by the family's task), return rows made by
      ``variantlab.plugin.rows.row(name, metric, value, scope=..., name=..., layer=..., step=...)``;
      ``device`` is the unit's device (None for a ``device_free`` probe); raise to fail the
      unit (never return partial rows);
    - ``views``: functions ``view(data) -> list[Table | Plot]`` of the report's
      :class:`variantlab.report.ReportData`, each returning the probe's tables
      (:class:`variantlab.report.frame.Table`) and plots (:class:`variantlab.report.plots.Plot`);
      a probe without views gets one generic table of its model-scope rows; or a reference
      ``"package.module:attr"`` to them, imported when a report first asks (commands that
      write no report never import them);
    - ``serial``: its units run last, one at a time, never beside other work (like timing);
    - ``device_free``: its numbers do not depend on the device (like params);
    - ``trains``: it takes optimizer steps (the size guard counts the optimizer's state);
    - ``passes``: what a unit runs per batch, for the size guard: some of ``forward``,
      ``backward``, ``step``, or a function of the settings giving them (default: all
      three for a probe that trains, else forward);
    - ``metrics``: ``{metric: "lower" | "higher"}``, which way each of its metrics is
      better; a metric ``M`` declared here may be an experiment's ``compare_on`` when the
      probe records ``val_M`` (chooses) and ``test_M`` (reports).
    """


@hookspec
def register_executors(register):
    """What computes a run's units (``variantlab run --executor NAME``).
    ``register(name, options_cls, factory)``:

    - ``name``: the value of ``--executor`` (the built-ins: ``inprocess``, ``pool``, ``ray``);
    - ``options_cls``: a strict pydantic model (:class:`variantlab.ProbeSettings` works) of
      the options the executor takes; its fields are filled from the command line
      (``--workers``, ``--address``, ``--retries`` and ``--executor-option KEY=VALUE``),
      and a flag the class lacks is refused before anything runs;
    - ``factory(options) -> executor``: a
      :class:`variantlab.executors.base.Executor` (``prepare``, ``run``, ``close``,
      ``describe``), made once per run.
    """
