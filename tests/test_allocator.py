"""A process that computes units keeps the memory it frees: the allocator's thresholds are
fixed once, by the first unit, unless the user tuned glibc's allocator already."""

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from conftest import write_exp

from variantlab.config.experiment import load_experiment
from variantlab.executors import unit
from variantlab.probes import allocator, run_probe
from variantlab.sweep.units import plan_units

GLIBC = sys.platform.startswith("linux") and __import__("platform").libc_ver()[0] == "glibc"

# held-out scoring's pattern: a 16,384-position batch scored in pieces of 32 rows whose
# logits are concatenated (16 MiB) and given to the loss; prints the page faults of 20
# batches after 3 to settle, and the last loss
ROUNDS = """
import resource, sys, torch
from variantlab.probes import allocator
print(allocator.keep_freed_memory() if sys.argv[1] == "keep" else "default")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Embedding(256, 32), torch.nn.Linear(32, 128),
                            torch.nn.GELU(), torch.nn.Linear(128, 256))
tokens = torch.randint(0, 256, (256, 64))
def batch():
    with torch.no_grad():
        logits = torch.cat([model(tokens[i:i + 32]) for i in range(0, 256, 32)])
        return float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten()))
for _ in range(3):
    batch()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    loss = batch()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, repr(loss))
"""


def _start(code: str, *args: str, **env: str) -> subprocess.Popen:
    clean = {k: v for k, v in os.environ.items()
             if k not in allocator.USER_SETTINGS and k != "GLIBC_TUNABLES"}
    return subprocess.Popen([sys.executable, "-c", code, *args], env={**clean, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _output(process: subprocess.Popen) -> list[str]:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    return out.split()


@contextlib.contextmanager
def _ended(*processes: subprocess.Popen) -> Iterator[tuple[subprocess.Popen, ...]]:
    """The processes, killed on leaving if still running (an assertion failed first)."""
    try:
        yield processes
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()


def _python(code: str, *args: str, **env: str) -> list[str]:
    return _output(_start(code, *args, **env))


def _rounds(process: subprocess.Popen) -> tuple[str, int, float]:
    answer, faults, loss = _output(process)
    return answer, int(faults), float(loss)


#: glibc's thresholds as they adapt after a 16 MiB block was freed (which happens or not,
#: with the order of a process's frees): blocks to 16 MiB from the heap, trimmed at 32 MiB
ADAPTED = "glibc.malloc.mmap_threshold=16777216:glibc.malloc.trim_threshold=33554432"


@pytest.mark.slow  # a subprocess, a real pool or a browser: end to end
@pytest.mark.skipif(not GLIBC, reason="glibc's allocator only")
def test_freed_blocks_are_kept_instead_of_faulted_in_again():
    with _ended(_start(ROUNDS, "keep"),
                _start(ROUNDS, "keep", GLIBC_TUNABLES=ADAPTED)) as (kept, adapted):
        answer, faults, loss = _rounds(kept)
        assert answer == "set"
        # a batch's logits are 4,096 pages: kept, at most one more such block is faulted in over
        # 20 batches (the heap's last growth to its peak)
        assert faults <= 4_096 + 1_024
        # glibc's own thresholds, once adapted, trim the heap's top after every batch; set by
        # the user, they stand
        answer, faults, adapted_loss = _rounds(adapted)
        assert answer == "user"
        assert faults > 40_960  # at least half of the 20 batches' logits, faulted in again
        assert adapted_loss == loss and 5.0 < loss < 6.0  # the same bits: only the memory moved


@pytest.mark.skipif(not GLIBC, reason="glibc's allocator only")
@pytest.mark.parametrize("env", [{"MALLOC_TRIM_THRESHOLD_": "65536"},
                                 {"MALLOC_ARENA_MAX": "2"},
                                 {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=65536"}])
def test_the_users_own_allocator_settings_win(env):
    code = "from variantlab.probes import allocator; print(allocator.keep_freed_memory())"
    assert _python(code, **env) == ["user"]
    assert _python(code) == ["set"]


def test_user_tuned_reads_the_environment():
    assert not allocator.user_tuned({"PATH": "/bin", "GLIBC_TUNABLES": "glibc.cpu.hwcaps=x"})
    assert allocator.user_tuned({"MALLOC_MMAP_THRESHOLD_": "1"})
    assert allocator.user_tuned({"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=1"})


def test_it_is_applied_once_and_by_every_unit(monkeypatch, tmp_path):
    first = allocator.keep_freed_memory()
    assert first in ("set", "user", "not glibc", "refused")
    monkeypatch.setattr(allocator, "_apply", lambda: pytest.fail("applied twice"))
    assert allocator.keep_freed_memory() == first
    calls = []
    monkeypatch.setattr(unit, "keep_freed_memory", lambda: calls.append(1) or first)
    experiment = load_experiment(write_exp(tmp_path, "  norm.kind: [layer]\n"))
    one = next(u for u in plan_units(experiment) if u.probe == "params")
    record, rows = unit.run_unit(one, experiment, run_probe)
    assert calls == [1] and record.status == "ok" and rows


# three rounds of 3 x 16 MiB made and freed (kept by the heap), then the timing probe's
# peak-memory region around one fresh 16 MiB tensor; prints that region's peak in MiB, and
# whether giving the free pages back afterwards gave any back
PEAK = """
import sys, torch
from variantlab.probes import allocator, timing
allocator.keep_freed_memory()
if sys.argv[1] == "unreleased":
    timing.release_free_memory = lambda: False
for _ in range(3):
    xs = [torch.ones(4 * 1024 * 1024) for _ in range(3)]
    del xs
with timing.PeakMemory(torch.device("cpu")) as mem:
    x = torch.ones(4 * 1024 * 1024)
del x
print(mem.bytes / 2 ** 20, allocator.release_free_memory())
"""


@pytest.mark.skipif(not GLIBC or not os.path.exists("/proc/self/clear_refs"),
                    reason="glibc's allocator and Linux's resident-set high-water mark")
@pytest.mark.slow  # a subprocess, a real pool or a browser: end to end
def test_memory_freed_before_a_timing_region_does_not_hide_its_peak():
    with _ended(_start(PEAK, "released"), _start(PEAK, "unreleased")) as (released, unreleased):
        peak, gave_back = _output(released)
        assert 16.0 <= float(peak) < 24.0  # the region's 16 MiB tensor
        assert gave_back == "True"  # the region's tensor, freed and kept
        peak, gave_back = _output(unreleased)
        assert float(peak) < 4.0  # served from the kept heap, unseen
        assert gave_back == "True"


def test_without_glibc_nothing_is_set_or_given_back(monkeypatch):
    monkeypatch.setattr(allocator, "_libc", lambda: None)
    assert allocator.release_free_memory() is False
    assert allocator._apply() == "not glibc"
