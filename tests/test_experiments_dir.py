"""Every shipped experiment validates, and each seed lesson is written as the seed has it."""

from pathlib import Path

import pytest

from variantlab.config.experiment import load_experiment
from variantlab.model.layout import layer_rows

EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments"
FILES = sorted(EXPERIMENTS.glob("*.yaml"))
LESSONS = {
    "layernorm-vs-batchnorm", "gelu-vs-relu", "pre-vs-post-norm", "naive-vs-sdpa",
    "seed-shortcut", "gpt2-124m", "xiong-fig3",
    "qk-norm-logits", "peri-ln", "llama-vs-gpt2", "dyt-vs-layernorm",
}
# the findings redone the fair way (issue 23): each architecture at its own best learning
# rate (>= 4 rates), >= 3 seeds, text with a held-out split, a cosine schedule, and (name ->
# the sizes) the widths the effect is judged at
TUNED = {"gelu-vs-relu": [32, 64], "dyt-vs-layernorm": [32, 64], "qk-norm-lr-sensitivity": [64],
         "mla-vs-gqa": [64], "attention-sinks": [32, 64], "nope-interleave": [32, 64]}


def test_every_lesson_has_a_file():
    assert LESSONS <= {p.stem for p in FILES}


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_experiment_validates(path):
    exp = load_experiment(path)
    assert exp.name == path.stem
    assert len(exp.description) > 40, "say what the experiment shows"
    assert len(exp.variants) >= 2
    assert exp.baseline in {v.name for v in exp.variants}
    for v in exp.variants:
        for settings in exp.measure.probes().values():
            assert getattr(settings, "seq_len", 0) <= v.spec.context_length


def test_shortcut_experiment_is_the_seeds():
    exp = load_experiment(EXPERIMENTS / "seed-shortcut.yaml")
    assert exp.seeds == [123]
    assert [v.spec.residual.shortcut for v in exp.variants] == [False, True]
    spec = exp.variants[0].spec
    assert (spec.family, spec.layer_sizes, spec.inputs) == ("mlp", [3, 3, 3, 3, 3, 1], [[1, 0, -1]])
    assert (spec.norm.kind, spec.activation.kind, spec.activation.approximate) == ("none", "gelu", "tanh")
    assert exp.measure["gradients"].batches == 1


def test_gpt2_experiment_is_the_seed_config():
    exp = load_experiment(EXPERIMENTS / "gpt2-124m.yaml")
    spec = exp.variants[0].spec
    assert (spec.vocab_size, spec.context_length, spec.emb_dim) == (50257, 1024, 768)
    assert (spec.n_heads, spec.n_layers, spec.drop_rate, spec.qkv_bias) == (12, 12, 0.1, False)
    assert spec.tie_weights is False and exp.variants[1].spec.tie_weights is True
    assert exp.measure["timing"].passes == ["forward"] and exp.measure["timing"].batch_size <= 2


def test_xiong_compares_post_and_pre_norm_at_initialisation():
    exp = load_experiment(EXPERIMENTS / "xiong-fig3.yaml")
    kinds = sorted(v.spec.residual.kind for v in exp.variants)
    assert kinds == ["post_norm", "pre_norm"]
    assert all(v.spec.n_layers >= 6 and v.spec.drop_rate == 0 for v in exp.variants)
    assert exp.measure["gradients"].batches >= 4 and "training" not in exp.measure


def test_axes_of_the_comparisons():
    def values(name, path):
        exp = load_experiment(EXPERIMENTS / f"{name}.yaml")
        out = []
        for v in exp.variants:
            node = v.spec
            for part in path.split("."):
                node = getattr(node, part)
            out.append(node)
        return out

    norms = values("layernorm-vs-batchnorm", "norm.kind")
    assert list(dict.fromkeys(norms)) == ["layer", "batch", "rms"]
    pairs = set(zip(values("gelu-vs-relu", "activation.kind"),
                    values("gelu-vs-relu", "feedforward.kind")))
    assert pairs == {("gelu", "mlp"), ("relu", "mlp"), ("relu2", "mlp"), ("silu", "glu")}
    assert values("naive-vs-sdpa", "attention.impl") == ["naive", "sdpa"]
    pre_post = list(zip(values("pre-vs-post-norm", "residual.kind"),
                        values("pre-vs-post-norm", "residual.shortcut")))
    assert sorted(pre_post) == sorted(
        [(k, s) for k in ("pre_norm", "post_norm") for s in (True, False)]
    )


@pytest.mark.parametrize("name", sorted(TUNED))
def test_tuned_findings_sweep_the_rate_per_architecture(name):
    exp = load_experiment(EXPERIMENTS / f"{name}.yaml")
    assert len(exp.seeds) >= 3
    assert exp.data.source == "stdlib" and exp.data.tokenizer == "bytes"
    assert exp.measure["training"].schedule == "cosine"
    rates: dict[tuple, set[float]] = {}
    for v in exp.variants:
        arch = tuple(sorted((k, str(x)) for k, x in v.overrides.items()
                            if not k.startswith("measure.")))
        rates.setdefault(arch, set()).add(
            v.settings.get("training", {}).get("lr", exp.measure["training"].lr))
    # four rates, or three with an edge extension (a fourth beyond the edge where the
    # best sits there)
    extend = exp.extensions().get("measure.training.lr", 0)
    assert all(len(r) + min(extend, 1) >= 4 for r in rates.values()), rates
    assert sorted({v.spec.emb_dim for v in exp.variants}) == TUNED[name]


def _counts(spec):
    from variantlab import build_model
    from variantlab.probes.params import active_non_embedding_params, non_embedding_params
    model = build_model(spec)
    return non_embedding_params(model), active_non_embedding_params(model)


def test_moe_vs_dense_matches_active_and_total_parameters():
    # the MoE's active feed-forward equals the small dense GLU's, its total the large one's
    # (up to the router's emb_dim x 8 weights per layer), at each width
    exp = load_experiment(EXPERIMENTS / "moe-vs-dense.yaml")
    by_width: dict[int, dict[str, tuple[int, int]]] = {}
    for v in exp.variants:
        kind = v.spec.feedforward.kind
        name = "moe" if kind == "moe" else ("dense" if v.spec.feedforward.hidden_mult < 4
                                            else "dense-total")
        by_width.setdefault(v.spec.emb_dim, {})[name] = _counts(v.spec)
    assert sorted(by_width) == [32, 64]
    for width, c in by_width.items():
        router = 8 * width * exp.variants[0].spec.n_layers
        assert abs(c["moe"][1] - router - c["dense"][0]) <= 0.02 * c["dense"][0], (width, c)
        assert abs(c["moe"][0] - router - c["dense-total"][0]) <= 0.02 * c["dense-total"][0]


def test_local_global_sweeps_the_ratio_at_fixed_depth():
    exp = load_experiment(EXPERIMENTS / "local-global.yaml")
    patterns = {tuple(v.spec.layout.pattern) for v in exp.variants}
    ratios = sorted(p.count("local") / p.count("global") for p in patterns)
    assert ratios == [0.0, 1.0, 3.0, 5.0]
    assert {v.spec.n_layers for v in exp.variants} == {12}  # 12: 1:1, 3:1 and 5:1 all exact
    assert {"timing", "training", "params"} <= set(exp.measure.probes())


def test_moe_balancing_compares_three_ways_of_balancing():
    exp = load_experiment(EXPERIMENTS / "moe-balancing.yaml")
    ways = {(v.spec.feedforward.aux_loss_coef > 0, v.spec.feedforward.bias_update_rate > 0)
            for v in exp.variants}
    assert ways == {(False, False), (True, False), (False, True)}
    assert "dynamics" in exp.measure.probes() and len(exp.seeds) >= 3


def test_hybrid_ratio_puts_attention_every_kth_layer():
    exp = load_experiment(EXPERIMENTS / "hybrid-ratio.yaml")
    layouts = set()
    for v in exp.variants:
        kinds = [row["attention"] for row in layer_rows(v.spec)]
        assert set(kinds) <= {"mha", "gated_deltanet"}
        layouts.add(tuple(i for i, k in enumerate(kinds) if k == "mha"))
    # all, every 2nd, every 4th, every 8th layer attention (the last of each group), none
    assert layouts == {tuple(range(8)), (1, 3, 5, 7), (3, 7), (7,), ()}


def test_zoology_mqar_sweeps_mixers_widths_and_pairs():
    """Issue 28.8: the redesign that can answer Zoology's question. Four mixers compared
    within each width x pairs condition, each at its own rate chosen on validation recall
    accuracy (an extendable log grid), at the pilot's budget (1,500 steps on the answers)."""
    exp = load_experiment(EXPERIMENTS / "zoology-mqar.yaml")
    mixers = {tuple(row["attention"] for row in layer_rows(v.spec)) for v in exp.variants}
    assert mixers == {("mha",) * 2, ("linear_attention",) * 2, ("mamba2",) * 2,
                      ("gated_deltanet",) * 2}
    assert {v.spec.emb_dim for v in exp.variants} == {64, 128}
    assert {v.data.n_pairs for v in exp.variants} == {4, 8}
    assert exp.data.task == "recall" and exp.data.loss_on == "answers"
    assert len(exp.seeds) == 3 and exp.spec.compare_on == "recall_accuracy"
    assert dict(exp.roles) == {
        "layout.pattern": "compared", "emb_dim": "condition", "data.n_pairs": "condition",
        "measure.training.lr": "tuned"}
    assert exp.spec.grid["measure.training.lr"] == [1.0e-3, 3.0e-3]
    assert exp.extensions() == {"measure.training.lr": 1}
    training = exp.spec.measure["training"]
    assert training is not None
    assert (training["steps"], training["batch_size"], training["schedule"],
            training["eval_every"]) == (1500, 32, "cosine", 250)
    # 4 mixers x 2 widths x 2 pair counts x 2 rates x 3 seeds training units before extension
    assert len(exp.variants) * len(exp.seeds) == 96


def test_mla_vs_gqa_compares_at_equal_kv_cache_and_near_equal_parameters():
    from variantlab import build_model
    from variantlab.probes.params import state_rows

    exp = load_experiment(EXPERIMENTS / "mla-vs-gqa.yaml")
    assert sorted({v.spec.n_layers for v in exp.variants}) == [2, 4]
    assert exp.roles["n_layers"] == "condition" and "timing" in exp.measure and "params" in exp.measure
    cache, params = {}, {}
    for v in exp.variants:
        if v.spec.n_layers != 2:
            continue
        a = v.spec.attention
        name = "mla" if a.kind == "mla" else {None: "mha", 2: "gqa2", 1: "gqa1"}[a.n_kv_heads]
        model = build_model(v.spec)
        per_token = {r["metric"]: r["value"] for r in state_rows(model)
                     if r["scope"] == "model"}["state_bytes_per_token"]
        cache[name] = per_token / 4 / 2  # float32 numbers per token and layer
        params[name] = sum(p.numel() for p in model.parameters())
    assert cache == {"mha": 128, "gqa2": 64, "gqa1": 32, "mla": 32}
    assert abs(params["mla"] - params["mha"]) <= 0.02 * params["mha"]


def test_attention_sinks_compares_sinks_within_each_window():
    exp = load_experiment(EXPERIMENTS / "attention-sinks.yaml")
    pairs = {(v.spec.attention.window, v.spec.attention.sinks) for v in exp.variants}
    assert pairs == {(None, False), (None, True), (16, False), (16, True)}
    assert exp.roles["attention.window"] == "condition"
    assert exp.roles["attention.sinks"] == "compared"
    dynamics = exp.measure["dynamics"]  # one fixed rate, inside the tuned grid
    assert dynamics.lr in exp.spec.grid["measure.training.lr"]
    assert dynamics.steps == exp.measure["training"].steps


def test_nope_interleave_scores_beyond_the_training_length():
    exp = load_experiment(EXPERIMENTS / "nope-interleave.yaml")
    rows = {tuple(r["kind"] for r in layer_rows(v.spec)) for v in exp.variants}
    assert rows == {("rope",) * 8, ("rope", "rope", "rope", "nope") * 2, ("rope", "nope") * 4}
    training = exp.measure["training"]
    assert training.seq_len == 64 and training.eval_lengths == [128, 256]
    assert all(v.spec.context_length == 256 for v in exp.variants)


def test_nope_recall_is_tuned_on_recall_and_scored_beyond_the_training_length():
    exp = load_experiment(EXPERIMENTS / "nope-recall.yaml")
    rows = {tuple(r["kind"] for r in layer_rows(v.spec)) for v in exp.variants}
    assert rows == {("rope",) * 4, ("rope", "rope", "rope", "nope"), ("rope", "nope") * 2}
    assert exp.spec.compare_on == "recall_accuracy" and exp.roles["measure.training.lr"] == "tuned"
    training = exp.measure["training"]
    assert training.seq_len == 32 and training.eval_lengths == [64, 128]
    assert training.steps >= 1500 and exp.spec.data.loss_on == "answers"
    assert all(v.spec.context_length == 128 for v in exp.variants)
