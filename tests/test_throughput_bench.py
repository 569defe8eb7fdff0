"""benchmarks/throughput.py: its busy processes (all in one group of their own, all ended) and
the CPU time of what a run leaves behind."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "throughput.py"


def _bench():
    spec = importlib.util.spec_from_file_location("throughput_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["throughput_bench"] = module
    spec.loader.exec_module(module)
    return module


def _members(group: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == group and fields[0] != "Z":
                out.append(int(entry.name))
    return out


def test_busy_starts_n_spinners_in_a_group_of_their_own_and_ends_them():
    bench = _bench()
    with bench.busy(3, settle=0.5) as group:
        assert group is not None and group != os.getpgid(0)
        assert len(_members(group)) == 3
    deadline = time.monotonic() + 10
    while _members(group) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _members(group) == []
    with bench.busy(0) as none:
        assert none is None


def test_label_keys_are_left_out_of_both_versions_yaml():
    bench = _bench()
    for doc in (bench.sweep_yaml(False), bench.main_yaml(False)):
        assert not set(bench.LABEL_KEYS) & set(doc)
    sweep = bench.sweep_yaml(False)
    assert sweep["seeds"] == [0, 1] and sweep["model"]["emb_dim"] == 32
    assert sweep["measure"]["training"]["steps"] == 100


def test_the_sweep_runs_each_versions_default_kernels_and_the_main_job_the_reference():
    bench = _bench()
    assert "kernels" not in bench.sweep_yaml(False)  # each version at its defaults
    assert bench.reference_sweep_yaml(False)["kernels"] == "reference"
    main = bench.main_yaml(False)
    assert main["kernels"] == "reference"  # the seeds' configuration, as committed
    assert "kernels" not in bench.before_yaml(main)  # the version before rejects the key
    try:
        bench.before_yaml({**main, "kernels": "fast"})
    except SystemExit as exc:
        assert "reference kernels only" in str(exc)
    else:
        raise AssertionError("a fast-kernel YAML for the version before was accepted")


def test_compare_states_the_tolerance_of_each_kind_of_job():
    bench = _bench()
    before = {"mlp-gelu lr": 0.03, "mlp-gelu test_loss": 3.0, "mlp-gelu seed range": 0.2}
    close = {"mlp-gelu lr": 0.03, "mlp-gelu test_loss": 3.00005}
    assert bench.compare(before, close, False).endswith("(within 0.0001)")
    moved = {"mlp-gelu lr": 0.03, "mlp-gelu test_loss": 3.04}
    assert "ABOVE 0.0001" in bench.compare(before, moved, False)
    text = bench.compare(before, moved, True)  # 0.04 of a 0.2 range: 0.20
    assert text.startswith("same choices") and "at most 0.20 of the seeds' range" in text
    assert text.endswith("(within 0.25)")
    one_seed = {**before, "mlp-gelu seed range": 0.0}  # --smoke: no range to compare with
    assert bench.compare(one_seed, before, True).endswith("(within 0.25)")
    assert "(ABOVE 0.25)" in bench.compare(one_seed, moved, True)
    far = {"mlp-gelu lr": 0.01, "mlp-gelu test_loss": 3.06}
    text = bench.compare(before, far, True)
    assert text.startswith("DIFFERENT choices") and "(ABOVE 0.25)" in text


def test_kernel_floor_bench_runs_its_paths():
    path = BENCH.parent / "kernel_floor.py"
    spec = importlib.util.spec_from_file_location("kernel_floor_bench", path)
    floor = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(floor)
    import torch

    bare = floor.bare_model()
    assert bare(torch.zeros(2, 8, dtype=torch.long)).shape == (2, 8, floor.VOCAB)
    for model in (bare, floor.variantlab_model("fast"), floor.variantlab_model("reference")):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        times = floor.step_times(model, opt, 2)
        assert len(times) == 2 and all(t > 0 for t in times)
    assert 0 < floor.adamw_gap(20) < 1e-5
    loop = floor.loop_times(3)  # the probe's own loop: a time per step after the 5 warm-up
    assert len(loop) == 3 and all(t > 0 for t in loop)
    assert floor.module_walk_ms(floor.variantlab_model("fast"), repeats=10) > 0


ORPHAN = '''
import importlib.util, os, subprocess, sys, time
spec = importlib.util.spec_from_file_location("bench", sys.argv[1])
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
subreaper = sys.argv[2] == "1"
if subreaper:
    assert bench.become_subreaper()
# a child that leaves a grandchild burning 0.5 s of CPU behind (as a run leaves its
# forkserver), and exits at once
burn = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.5: pass\\n"
child = ("import subprocess, sys\\n"
         f"subprocess.Popen([sys.executable, '-c', {burn!r}])\\n")
cpu0 = bench.children_cpu()
subprocess.run([sys.executable, "-c", child], check=True)
bench.reap_orphans(set(), timeout=30)
print(bench.children_cpu() - cpu0)
'''


def test_the_orphans_of_a_run_are_waited_for_and_their_cpu_counted():
    """As the pool's forkserver outlives the run that started it, a grandchild outlives its
    parent here: made this process's child (a subreaper), it is waited for and its CPU time
    counted; without, it is not."""
    import subprocess

    if not sys.platform.startswith("linux"):
        return
    got = {}
    for subreaper in ("1", "0"):
        done = subprocess.run([sys.executable, "-c", ORPHAN, str(BENCH), subreaper],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        got[subreaper] = float(done.stdout.split()[-1])
    assert got["1"] >= 0.45  # the grandchild's 0.5 s, counted
    assert got["0"] < 0.45  # reaped by init instead: lost to this process


def test_paired_ratios_give_an_interval_and_say_where_it_stands_against_the_target():
    bench = _bench()
    before = [{"wall": w} for w in (100.0, 80.0, 90.0)]
    under = [{"wall": w} for w in (45.0, 36.0, 40.5)]  # 0.45 every pair: no spread
    text = bench.paired(before, under, 0.5)
    assert "per pair 0.450, 0.450, 0.450" in text and "geometric mean 0.450" in text
    assert text.endswith("over 3 pairs: under 0.5")
    spread = [{"wall": w} for w in (40.0, 44.0, 50.4)]  # 0.40, 0.55, 0.56
    text = bench.paired(before, spread, 0.5)
    assert "geometric mean 0.498" in text and text.endswith("not clearly under 0.5")
    low, high = (float(x) for x in text.split("interval ")[1].split(" over")[0].split(" to "))
    assert low < 0.5 < high
    above = [{"wall": w} for w in (55.0, 44.8, 50.0)]
    assert bench.paired(before, above, 0.5).endswith("ABOVE 0.5")
    assert bench.paired(before, above).endswith("over 3 pairs")  # no target: no verdict
    assert bench.paired(before[:1], under[:1], 0.5) == "after / before 0.450 (one pair: no interval)"


def test_the_target_is_judged_only_against_the_version_at_the_start_of_the_issue():
    import subprocess

    bench = _bench()
    head = subprocess.run(["git", "-C", str(BENCH.parent), "rev-parse", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert bench.same_commit("HEAD", head)  # two spellings of one commit
    assert bench.same_commit(head[:10], "HEAD")
    assert not bench.same_commit("HEAD", "no-such-ref-here")
    assert not bench.same_commit("no-such-ref-here", "no-such-ref-here")
    if bench.same_commit(bench.ISSUE_START, bench.ISSUE_START):  # not in a shallow clone
        assert not bench.same_commit("HEAD", bench.ISSUE_START)  # main moved on since
