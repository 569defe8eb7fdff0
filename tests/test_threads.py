"""The torch thread policy (issue 39, item 1): a pure function of cores, load and workers;
the user's choice wins; a run computes with the count chosen and stores it per unit."""

import math

import pytest
import torch

from variantlab.errors import SpecError
from variantlab.executors import threads as policy
from variantlab.executors.pool import threads_per_worker


@pytest.mark.parametrize(("cores", "load", "workers", "want"), [
    (2, 0.0, 1, 2),    # quiet 2-core machine: both cores
    (2, 0.4, 1, 2),    # a little background load still leaves 2
    (2, 1.0, 1, 1),    # one busy process beside: 1
    (2, 2.0, 1, 1),    # two busy processes: 1, never 0
    (2, 9.0, 1, 1),    # overloaded: still 1
    (8, 3.0, 1, 5),    # 8 cores, 3 busy: floor(8 - 3 + 0.5) = 5
    (8, 0.0, 1, 8),    # never more than the cores
    (2, 0.0, 2, 1),    # --workers 2: one thread each
    (16, 0.0, 4, 1),
    (4, math.nan, 1, 4),  # unknown load: as idle
])
def test_policy_threads_from_cores_load_and_workers(cores, load, workers, want):
    assert policy.policy_threads(cores, load, workers) == want


def test_the_users_choice_wins_over_the_policy(monkeypatch):
    monkeypatch.delenv("VARIANTLAB_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(policy, "AT_IMPORT", torch.get_num_threads())
    monkeypatch.setattr(policy, "cores", lambda: 2)
    monkeypatch.setattr(policy, "load", lambda: 1.2)
    assert policy.choose_threads(1) == policy.Threads(1, "policy")
    monkeypatch.setattr(policy, "load", lambda: 0.1)
    assert policy.choose_threads(1) == policy.Threads(2, "policy")
    assert policy.choose_threads(2) == policy.Threads(1, "policy")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert policy.choose_threads(2) == policy.Threads(3, "OMP_NUM_THREADS")
    monkeypatch.setenv("VARIANTLAB_THREADS", "4")
    assert policy.choose_threads(1) == policy.Threads(4, "VARIANTLAB_THREADS")
    assert policy.choose_threads(1, 5) == policy.Threads(5, "--threads")
    assert threads_per_worker(2, 5) == 5
    monkeypatch.delenv("VARIANTLAB_THREADS")
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(policy, "AT_IMPORT", torch.get_num_threads() + 1)  # set since import
    assert policy.choose_threads(1) == policy.Threads(torch.get_num_threads(),
                                                      "torch.set_num_threads")


@pytest.mark.parametrize("text", ["0", "-1", "two", "1.5"])
def test_a_bad_thread_count_says_which_setting_to_change(monkeypatch, text):
    monkeypatch.setenv("VARIANTLAB_THREADS", text)
    with pytest.raises(SpecError, match="VARIANTLAB_THREADS.*not a number of threads"):
        policy.choose_threads(1)
    with pytest.raises(SpecError, match="--threads: 0 is not a number of threads"):
        policy.choose_threads(1, 0)


def test_a_run_computes_with_the_chosen_count_and_stores_it(tmp_path, tiny, monkeypatch):
    import textwrap

    import yaml

    from variantlab.config.experiment import experiment_from_text
    from variantlab.executors.runner import run_experiment
    from variantlab.store.store import Store

    seen = []

    def probe(name, spec, settings, **kw):
        seen.append(torch.get_num_threads())
        return [{"probe": name, "metric": "m", "value": 1.0}]

    text = textwrap.dedent(f"""\
        name: threads
        model: {yaml.safe_dump(tiny, default_flow_style=True).strip()}
        variants:
          - name: a
          - name: b
            set: {{emb_dim: 16}}
        measure: {{params: {{}}}}
        """)
    exp = experiment_from_text(text, "threads.yaml", base_dir=tmp_path)
    before = torch.get_num_threads()
    summary = run_experiment(exp, tmp_path, probe_fn=probe, threads=3)
    assert summary.ok and seen == [3, 3]
    assert torch.get_num_threads() == before  # put back after the run
    with Store(tmp_path / "threads") as store:
        stored = store.conn.execute("SELECT torch_threads FROM units").fetchall()
    assert [r[0] for r in stored] == [3, 3]
