"""benchmarks/throughput.py's busy processes: all in one group of their own, all ended."""

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
