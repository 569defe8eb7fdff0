"""A Ray cluster on this machine for the tests: a head node with two CPUs, listening on
loopback only, token authentication on, reached by address as a real cluster is.

The xdist workers of one test run share it: the first that needs it starts it, each one
counts itself in and out (a JSON file under a lock in the run's base temp folder), and the
last one out ends the nodes' process groups (``os.killpg``: SIGTERM, then SIGKILL)."""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass
class Cluster:
    address: str
    temp_dir: Path
    env: dict[str, str]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_node(args: list[str], env: dict[str, str], log: Path) -> int:
    """``ray start ARGS --block`` in its own process group, once it is up: its pgid."""
    ray = Path(sys.executable).parent / "ray"
    with open(log, "w") as out:
        proc = subprocess.Popen([str(ray), "start", *args, "--block"], env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 90
    while "Ray runtime started" not in log.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop_group(proc.pid)
            raise RuntimeError(f"ray start did not come up:\n{log.read_text()}")
        time.sleep(0.2)
    return proc.pid


def _stop_group(pgid: int, timeout: float = 5) -> None:
    """SIGTERM to the process group, SIGKILL to whatever is left after ``timeout``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                os.waitpid(-pgid, os.WNOHANG)  # reap the node if it is our child
            except ChildProcessError:
                pass
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def _start_cluster() -> dict:
    temp = Path(tempfile.mkdtemp(prefix="vl-ray-", dir="/tmp"))  # Unix sockets: short paths
    # Ray turns --node-ip-address 127.0.0.1 into the machine's own address and listens there;
    # with its "no cluster" switch off (as on macOS) the node IP stays loopback and the GCS,
    # raylet and agents listen on 127.0.0.1 only. The same switch refuses a second node
    # (`ray start --address`), so the cluster is one node: a head with two CPUs, whose two
    # worker processes run the units, reached by address like any cluster.
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token",
           "RAY_AUTH_TOKEN": secrets.token_hex(32), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    port = free_port()
    args = ["--head", "--node-ip-address", "127.0.0.1", "--port", str(port), "--num-cpus", "2",
            "--include-dashboard=false", "--temp-dir", str(temp), "--disable-usage-stats"]
    group = _start_node(args, env, temp / "head.log")
    if "Local node IP: 127.0.0.1" not in (temp / "head.log").read_text():
        _stop_group(group)
        raise RuntimeError(f"the head node is not on loopback:\n{(temp / 'head.log').read_text()}")
    return {"address": f"127.0.0.1:{port}", "temp": str(temp), "env": env, "groups": [group],
            "users": 0}


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextmanager
def shared_cluster(factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The test run's cluster (started by the first user, stopped by the last)."""
    base = factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # this run only
    info, lock = root / "ray-cluster.json", root / "ray-cluster.lock"
    with _locked(lock):
        state = json.loads(info.read_text()) if info.exists() else _start_cluster()
        state["users"] += 1
        info.write_text(json.dumps(state))
    try:
        yield Cluster(state["address"], Path(state["temp"]), state["env"])
    finally:
        with _locked(lock):
            state = json.loads(info.read_text())
            state["users"] -= 1
            if state["users"] == 0:
                for pgid in reversed(state["groups"]):
                    _stop_group(pgid)
                shutil.rmtree(state["temp"], ignore_errors=True)
                info.unlink()
            else:
                info.write_text(json.dumps(state))
