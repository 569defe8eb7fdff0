"""``variantlab run --executor ray``: against a Ray cluster these tests start on this machine
(a head node with two CPUs on loopback, token authentication on; one per test run,
:mod:`ray_cluster`) and reach by its address, as a real cluster is reached. The same rows as
in process, bit for bit; a killed worker's unit retried or failed while the rest completes;
plugin files beside the YAML and ``--plugin`` files shipped to the workers; bad input refused
before a store exists; Ctrl-C cancels the tasks in flight and keeps what finished."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from conftest import ALL_PROBES, FAST_PROBES, TINY_MODEL, invoke, stored, write_exp
from ray_cluster import Cluster, free_port, shared_cluster

from variantlab.store.store import load_run


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory) -> Iterator[Cluster]:
    """A Ray head node on this machine, shared by the run (tests/ray_cluster.py)."""
    pytest.importorskip("ray")
    with shared_cluster(tmp_path_factory) as cluster:
        yield cluster


def run_cli(cluster: Cluster, *args: object, cwd: Path | None = None) -> tuple[int, str]:
    """``variantlab run ARGS --executor ray --address ADDR`` as its own process (a driver
    with the cluster's token in its environment): exit code and output."""
    cmd = [sys.executable, "-m", "variantlab", "run", *map(str, args), "--no-report",
           "--executor", "ray", "--address", cluster.address]
    done = subprocess.run(cmd, env=cluster.env, cwd=cwd, capture_output=True, text=True,
                          timeout=300)
    return done.returncode, done.stdout + done.stderr


# -- bad input: refused before anything runs or is written --------------------------------
def test_unknown_executor_exits_2_naming_the_choices(tmp_path):
    exp = write_exp(tmp_path, "  norm.kind: [layer, rms]\n")
    result = invoke("run", exp, "--out", tmp_path / "runs", "--executor", "slurm")
    assert result.exit_code == 2, result.output
    assert "--executor: unknown executor 'slurm'. Registered: inprocess, pool, ray" \
        in result.output
    assert "Traceback" not in result.output and not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("args", "message"), [
    (["--executor", "pool", "--address", "10.0.0.1:6379"],
     "--address: the pool executor does not take it (it takes: --workers)"),
    (["--address", "10.0.0.1:6379"],
     "--address: the inprocess executor does not take it"),
    (["--executor", "ray", "--retries", "-1"],
     "--retries: Input should be greater than or equal to 0 (given: -1)"),
    (["--executor", "ray", "--address", "10.0.0.1:6379", "--workers", "2"],
     "--workers: sizes a local Ray instance; a cluster at --address has its own size"),
    (["--executor", "ray", "--address", "no-port-here"],
     "--address: 'no-port-here' is not HOST:PORT"),
    (["--executor-option", "partition"], "--executor-option: 'partition' is not KEY=VALUE"),
])
def test_executor_options_are_checked_before_compute(tmp_path, args, message):
    pytest.importorskip("ray")
    exp = write_exp(tmp_path, "  norm.kind: [layer, rms]\n")
    result = invoke("run", exp, "--out", tmp_path / "runs", *args)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split()), result.output
    assert not (tmp_path / "runs").exists()


def test_an_address_nothing_answers_on_exits_2_quickly(tmp_path):
    pytest.importorskip("ray")
    exp = write_exp(tmp_path, "  norm.kind: [layer, rms]\n")
    t0 = time.monotonic()
    result = invoke("run", exp, "--out", tmp_path / "runs", "--executor", "ray",
                    "--address", f"127.0.0.1:{free_port()}", "--device", "cuda")
    assert result.exit_code == 2, result.output
    # the units would run on the cluster: this machine's lack of a GPU is not checked
    assert "--address: no Ray cluster answers at 127.0.0.1:" in result.output
    assert "CUDA" not in result.output
    assert "ray start --head" in result.output and time.monotonic() - t0 < 20
    assert not (tmp_path / "runs").exists()


def test_ray_without_the_package_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    exp = write_exp(tmp_path, "  norm.kind: [layer, rms]\n")
    result = invoke("run", exp, "--out", tmp_path / "runs", "--executor", "ray",
                    "--address", "10.0.0.1:6379")
    assert result.exit_code == 2, result.output
    assert "ray needs the ray package to reach 10.0.0.1:6379: pip install 'variantlab[ray]'" \
        in " ".join(result.output.split())
    assert not (tmp_path / "runs").exists()


# -- against the cluster ------------------------------------------------------------------
@pytest.mark.slow
def test_ray_by_address_stores_the_in_process_rows_bit_for_bit(tmp_path, ray_cluster):
    exp = write_exp(tmp_path, "  norm.kind: [layer, rms]\n", measure=ALL_PROBES)
    one, two = tmp_path / "one", tmp_path / "two"
    assert invoke("run", exp, "--out", one, "--no-report").exit_code == 0
    code, output = run_cli(ray_cluster, exp, "--out", two)
    assert code == 0, output
    assert f"8 unit(s), Ray cluster at {ray_cluster.address}" in output
    assert "8 unit(s): 8 computed, 0 stored already, 0 failed" in output
    units_1, rows_1 = stored(one / "pooltest")
    units_2, rows_2 = stored(two / "pooltest")
    assert set(rows_2.probe) == {"params", "gradients", "training", "timing"}
    pd.testing.assert_frame_equal(units_1, units_2)
    pd.testing.assert_frame_equal(rows_1, rows_2)  # float values bit for bit

    # timing units: started after every other unit had finished, one at a time
    units = load_run(two / "pooltest").units
    timing, others = units[units.probe == "timing"], units[units.probe != "timing"]
    assert timing.started_at.min() >= others.finished_at.max()
    first, second = timing.sort_values("started_at").itertuples()
    assert second.started_at >= first.finished_at

    code, output = run_cli(ray_cluster, exp, "--out", two)
    assert code == 0 and "8 unit(s): 0 computed, 8 stored already, 0 failed" in output


# a probe that says where its plugin file was imported from and where it ran
WHERE_PLUGIN = '''
import os

import variantlab
from variantlab.plugin.rows import row


class WhereSettings(variantlab.ProbeSettings):
    pass


def run(spec, settings, *, seed, data, base_dir, device, registry):
    here = os.path.dirname(os.path.abspath(__file__))
    return [row("where", "plugin_dir", 1, scope="info", name=here),
            row("where", "cwd", 1, scope="info", name=os.getcwd())]


@variantlab.hookimpl
def register_probes(register):
    register("where", WhereSettings, run, device_free=True)
'''

# a norm kind from a --plugin file in another folder
EXTRA_NORM = '''
from typing import Literal

from torch import nn

import variantlab


class HalfSpec(variantlab.ComponentSpec):
    kind: Literal["half_layer"] = "half_layer"


@variantlab.hookimpl
def register_norms(register):
    register("half_layer", HalfSpec, lambda spec, dim: nn.LayerNorm(dim))
'''


@pytest.mark.slow
def test_plugin_files_reach_the_workers(tmp_path, ray_cluster, monkeypatch):
    folder, elsewhere = tmp_path / "exp", tmp_path / "elsewhere"
    folder.mkdir()
    elsewhere.mkdir()
    (folder / "where.py").write_text(WHERE_PLUGIN)
    (elsewhere / "extra_norm.py").write_text(EXTRA_NORM)
    exp = folder / "where.yaml"
    exp.write_text(f"name: where\nseeds: [0, 1]\nmodel: {TINY_MODEL}\n"
                   "grid:\n  norm.kind: [layer, half_layer]\nplugins: [where.py]\n"
                   + FAST_PROBES + "  where: {}\n")
    monkeypatch.chdir(tmp_path)  # --plugin files are named relative to this folder
    code, output = run_cli(ray_cluster, exp, "--out", tmp_path / "runs",
                           "--plugin", "elsewhere/extra_norm.py", cwd=tmp_path)
    assert code == 0, output
    assert "12 unit(s): 12 computed, 0 stored already, 0 failed" in output
    rows = load_run(tmp_path / "runs" / "where").rows
    where = rows[rows.probe == "where"]
    # imported from the copy of the experiment's folder Ray unpacked for its workers
    for name in where.name:
        assert not Path(name).is_relative_to(folder) and \
            Path(name).is_relative_to(ray_cluster.temp_dir), name
    # the variant built with the norm from --plugin, on the workers, matches in process
    same = invoke("run", exp, "--out", tmp_path / "local", "--no-report",
                  "--plugin", "elsewhere/extra_norm.py")
    assert same.exit_code == 0, same.output
    _, ray_rows = stored(tmp_path / "runs" / "where")
    _, local_rows = stored(tmp_path / "local" / "where")
    pick = ["gradients", "params"]
    pd.testing.assert_frame_equal(
        ray_rows[ray_rows.probe.isin(pick)].reset_index(drop=True),
        local_rows[local_rows.probe.isin(pick)].reset_index(drop=True))


# a probe that leaves its worker's pid in pid_dir, then naps: the test kills some of them
NAP_PLUGIN = '''
import os
import time
from pathlib import Path

import variantlab
from variantlab.plugin.rows import row


class NapSettings(variantlab.ProbeSettings):
    seconds: float = 3.0
    pid_dir: str = ""


def run(spec, settings, *, seed, data, base_dir, device, registry):
    Path(settings.pid_dir, f"seed{seed}-{os.getpid()}").touch()
    time.sleep(settings.seconds)
    return [row("nap", "slept", settings.seconds, unit="s")]


@variantlab.hookimpl
def register_probes(register):
    register("nap", NapSettings, run, device_free=True)
'''


def start_naps(tmp_path: Path, cluster: Cluster, plugin: str, seeds: list[int], nap: str,
               *args: str) -> tuple[Path, Path, subprocess.Popen]:
    """Start ``variantlab run`` of params + the nap ``plugin`` probe (settings ``nap`` then
    the pid folder) on the cluster: ``(experiment file, pid folder, process)``."""
    pids = tmp_path / "pids"
    pids.mkdir()
    (tmp_path / "nap.py").write_text(plugin)
    exp = tmp_path / "nap.yaml"
    exp.write_text(f"name: nap\nseeds: {seeds}\nmodel: {TINY_MODEL}\nplugins: [nap.py]\n"
                   f"measure:\n  params: {{}}\n  nap: {{{nap}pid_dir: '{pids}'}}\n")
    cmd = [sys.executable, "-m", "variantlab", "run", str(exp), "--out", str(tmp_path / "runs"),
           "--no-report", "--executor", "ray", "--address", cluster.address, *args]
    proc = subprocess.Popen(cmd, env=cluster.env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    return exp, pids, proc


def _kill_workers(pids: Path, proc: subprocess.Popen, plan: dict[str, int]) -> dict[str, int]:
    """While ``proc`` runs, SIGKILL the workers that write pid files: for each seed prefix in
    ``plan`` at most that many times. Returns the kills per prefix."""
    killed: dict[str, int] = dict.fromkeys(plan, 0)
    seen: set[str] = set()
    while proc.poll() is None:
        for path in pids.iterdir():
            prefix, _, pid = path.name.partition("-")
            if path.name in seen or prefix not in plan:
                continue
            seen.add(path.name)
            if killed[prefix] < plan[prefix]:
                os.kill(int(pid), signal.SIGKILL)
                killed[prefix] += 1
        time.sleep(0.05)
    return killed


@pytest.mark.slow
def test_a_killed_worker_is_retried_then_failed_and_the_rest_completes(tmp_path, ray_cluster):
    exp, pids, proc = start_naps(tmp_path, ray_cluster, NAP_PLUGIN, [0, 1, 2], "seconds: 2.0, ",
                                 "--retries", "1")
    # seed 1: its first worker is killed (retried, then ok); seed 2: both tries killed
    killed = _kill_workers(pids, proc, {"seed1": 1, "seed2": 2})
    output = proc.communicate(timeout=60)[0]
    assert killed == {"seed1": 1, "seed2": 2}, output
    assert proc.returncode == 1, output
    assert "6 unit(s): 5 computed, 0 stored already, 1 failed" in output
    units = load_run(tmp_path / "runs" / "nap").units.set_index(["probe", "seed"])
    assert units.loc[("nap", 1), "status"] == "ok"
    failed = units.loc[("nap", 2)]
    assert failed.status == "failed" and "Worker" in failed.error, failed.error
    assert "Ray ran the task 2 time(s) (--retries 1)" in failed.traceback
    assert (units.status == "ok").sum() == 5

    code, output = run_cli(ray_cluster, exp, "--out", tmp_path / "runs")
    assert code == 0, output
    assert "6 unit(s): 1 computed, 5 stored already, 0 failed" in output


# a probe that naps until a "go" file exists (at most an hour), leaving its pid in pid_dir
WAIT_PLUGIN = NAP_PLUGIN.replace(
    "    time.sleep(settings.seconds)\n",
    "    deadline = time.monotonic() + 3600\n"
    "    while not Path(settings.pid_dir, 'go').exists() and time.monotonic() < deadline:\n"
    "        time.sleep(0.05)\n")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
def test_ctrl_c_on_the_cluster_cancels_the_running_tasks_and_keeps_finished_units(
        tmp_path, ray_cluster):
    exp, pids, proc = start_naps(tmp_path, ray_cluster, WAIT_PLUGIN, [0, 1], "")
    deadline = time.monotonic() + 120
    while len(list(pids.iterdir())) < 2:  # both naps running, on the cluster's two CPUs
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.05)
    workers = [int(p.name.partition("-")[2]) for p in pids.iterdir()]
    proc.send_signal(signal.SIGINT)  # Ctrl-C
    output = proc.communicate(timeout=60)[0]
    assert proc.returncode == 130, output
    assert "interrupted: finished units are stored" in output
    units = load_run(tmp_path / "runs" / "nap").units
    assert sorted(units.probe) == ["params", "params"]  # the params units ran before the naps
    assert set(units.status) == {"ok"}
    deadline = time.monotonic() + 30  # cancel(force=True) ends the naps' worker processes
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in workers), workers

    (pids / "go").touch()
    code, output = run_cli(ray_cluster, exp, "--out", tmp_path / "runs")
    assert code == 0, output
    assert "4 unit(s): 2 computed, 2 stored already, 0 failed" in output


class FakeRay:
    """What the executor calls of ``ray``, in this process: the first task finishes, then
    Ctrl-C arrives while the driver waits for the next."""

    def __init__(self) -> None:
        self.tasks: dict[int, tuple] = {}
        self.cancelled: list[tuple[int, bool]] = []
        self.waits = 0

    def put(self, obj):
        return obj

    def remote(self, fn):
        fake = self

        class Remote:
            def options(self, **kwargs):
                assert kwargs["retry_exceptions"] is False and kwargs["max_retries"] == 2
                return self

            def remote(self, *args):
                ref = len(fake.tasks)
                fake.tasks[ref] = (fn, args)
                return ref

        return Remote()

    def wait(self, refs, num_returns=1, timeout=None):
        self.waits += 1
        if self.waits > 2:
            raise KeyboardInterrupt
        return [refs[0]], refs[1:]

    def get(self, ref):
        fn, args = self.tasks[ref]
        return fn(*args)

    def cancel(self, ref, force=False):
        self.cancelled.append((ref, force))

    def shutdown(self):
        pass


def test_ctrl_c_cancels_the_tasks_in_flight_and_keeps_finished_units(tmp_path):
    pytest.importorskip("ray")
    from variantlab.config.experiment import load_experiment
    from variantlab.executors.ray import RayExecutor
    from variantlab.executors.runner import run_experiment

    fake = FakeRay()

    class Connected(RayExecutor):
        def prepare(self, experiment, units, context):
            self.ray, self.capacity = fake, (2.0, 0.0)

    exp = load_experiment(write_exp(tmp_path, "  norm.kind: [layer, rms]\n"))
    summary = run_experiment(exp, tmp_path / "runs", executor=Connected())
    assert summary.interrupted and summary.done == 1 and summary.exit_code == 130
    # two at once (the cluster's two CPUs), a third when the first had finished
    assert len(fake.tasks) == 3 and fake.waits == 3
    assert fake.cancelled == [(1, True), (2, True)]
    assert list(load_run(tmp_path / "runs" / "pooltest").units.status) == ["ok"]
    again = run_experiment(exp, tmp_path / "runs")
    assert (again.done, again.skipped) == (3, 1)


def test_resources_are_checked_and_left_out_of_unit_keys(tmp_path):
    from variantlab.config.experiment import InputError, experiment_from_text
    from variantlab.errors import SpecError
    from variantlab.executors.ray_env import check_capacity, check_devices, unit_resources
    from variantlab.executors.runner import plan_units

    text = write_exp(tmp_path, "  norm.kind: [layer, rms]\n").read_text()
    plain = experiment_from_text(text)
    asked = experiment_from_text(text + "resources:\n  gradients: {num_cpus: 2, num_gpus: 0.5}\n")
    assert [u.key for u in plan_units(plain)] == [u.key for u in plan_units(asked)]
    by_probe = {u.probe: u for u in plan_units(asked, "cuda")}
    assert unit_resources(asked, by_probe["gradients"]) == (2.0, 0.5)
    assert unit_resources(asked, by_probe["params"]) == (1.0, 0.0)  # no device: no GPU
    assert unit_resources(plain, by_probe["gradients"]) == (1.0, 1.0)  # cuda: one GPU
    with pytest.raises(InputError, match=r"resources\.timing: no probe 'timing' runs in this "
                                         r"experiment; .* \(params, gradients\)"):
        experiment_from_text(text + "resources:\n  timing: {num_cpus: 2}\n")
    with pytest.raises(InputError, match=r"resources\.params\.num_cpus: .*greater than 0"):
        experiment_from_text(text + "resources:\n  params: {num_cpus: 0}\n")

    nodes = [{"Alive": True, "Resources": {"CPU": 4.0}}, {"Alive": False,
                                                          "Resources": {"CPU": 8.0, "GPU": 1.0}}]
    check_capacity(nodes, {"params": (4.0, 0.0)})
    with pytest.raises(SpecError, match=r"resources\.gradients: each gradients unit asks for "
                                        r"1 CPU\(s\) and 1 GPU\(s\), .*the largest: 4 CPU\(s\), "
                                        r"0 GPU\(s\)"):
        check_capacity(nodes, {"params": (1.0, 0.0), "gradients": (1.0, 1.0)})
    with pytest.raises(SpecError, match=r"--device: cuda:1 names one GPU of this machine"):
        check_devices([(0, u) for u in plan_units(plain, "cuda:1")], "cuda:1")


# a probe that lists the files of its worker's current folder (the shipped working folder)
LIST_PLUGIN = '''
import os

import variantlab
from variantlab.plugin.rows import row


class ListSettings(variantlab.ProbeSettings):
    pass


def run(spec, settings, *, seed, data, base_dir, device, registry):
    found = sorted(os.path.relpath(os.path.join(d, f)) for d, _, fs in os.walk(".") for f in fs)
    return [row("listing", "files", len(found), scope="info", name="|".join(found))]


@variantlab.hookimpl
def register_probes(register):
    register("listing", ListSettings, run, device_free=True)
'''


@pytest.mark.slow
def test_only_what_units_read_is_shipped_and_an_oversize_payload_is_refused(
        tmp_path, ray_cluster):
    folder = tmp_path / "exp"
    (folder / "corpus").mkdir(parents=True)
    (folder / "listing.py").write_text(LIST_PLUGIN)
    (folder / "corpus" / "a.txt").write_text("a small corpus of words, repeated. " * 60_000)
    with open(folder / "checkpoint.pt", "wb") as f:  # 300 MB beside the YAML, sparse
        f.truncate(300_000_000)
    exp = folder / "list.yaml"
    exp.write_text(f"name: listing\nseeds: [0]\nmodel: {TINY_MODEL}\nplugins: [listing.py]\n"
                   "data: {source: text, path: 'corpus/*.txt'}\n"
                   "measure:\n  params: {}\n  gradients: {batch_size: 2, seq_len: 16, "
                   "batches: 1}\n  listing: {}\n")
    code, output = run_cli(ray_cluster, exp, "--out", folder / "runs", "--ray-max-upload", "1")
    assert code == 2, output
    assert f"the largest: {folder / 'corpus' / 'a.txt'} (2.1 MB)" in output
    assert not (folder / "runs").exists()

    code, output = run_cli(ray_cluster, exp, "--out", folder / "runs", "--ray-max-upload", "3")
    assert code == 0, output
    rows = load_run(folder / "runs" / "listing").rows
    listing = rows[rows.probe == "listing"].name.iloc[0].split("|")
    assert listing == ["corpus/a.txt", "listing.py"]
