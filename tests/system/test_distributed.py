"""Tests of the data-parallel learner (``nervex.system.distributed``).

The environment parsing and the Slurm host lists are tables of named cases. The process-group tests start real
processes (``dist_worker.py``, gloo on 127.0.0.1, one thread each): two learners on the halves of a batch end with the
parameters of one learner on the whole batch; ``broadcast_policy`` makes the ranks equal; a rank that dies or stalls
makes the survivor raise within the group's timeout. Every subprocess has a deadline and is killed when the test
ends, whatever its outcome.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

import pytest
import torch

from nervex.system.distributed import (
    DistInfo,
    all_reduce_mean,
    attach_gradient_allreduce,
    broadcast_parameters,
    destroy_process_group,
    dist_info_from_env,
    expand_hostlist,
    first_host,
    init_process_group,
)
from tests.system.dist_worker import BATCH, cartpole_batch, make_dqn_policy

WORKER = Path(__file__).with_name("dist_worker.py")
DEADLINE_S = 60.0  # no worker may outlive this, even on a loaded machine
FAIL_TIMEOUT_S = 5.0  # the process-group timeout of the failure tests


# ---- environment parsing --------------------------------------------------------------------------------------------
TORCHRUN = dict(RANK="1", WORLD_SIZE="4", LOCAL_RANK="1", MASTER_ADDR="10.0.0.5", MASTER_PORT="29400")
SLURM = dict(
    SLURM_PROCID="5", SLURM_NTASKS="8", SLURM_LOCALID="1", SLURM_JOB_NODELIST="node[01-04]", SLURM_JOB_ID="4242"
)

ENV_CASES: List[Tuple[str, Dict[str, str], DistInfo]] = [
    ("no launcher: a single process", {}, DistInfo(0, 1, 0, "127.0.0.1", 29500, "single")),
    ("torchrun", TORCHRUN, DistInfo(1, 4, 1, "10.0.0.5", 29400, "torchrun")),
    ("torchrun's variables win over Slurm's", {**SLURM, **TORCHRUN}, DistInfo(1, 4, 1, "10.0.0.5", 29400, "torchrun")),
    ("torchrun with one process needs no master", dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"),
     DistInfo(0, 1, 0, "127.0.0.1", 29500, "torchrun")),
    ("slurm: rank from SLURM_PROCID, SLURM_LOCALID only the local rank", SLURM,
     DistInfo(5, 8, 1, "node01", 15000 + 4242, "slurm")),
    ("slurm: the step's node list before the job's", {**SLURM, "SLURM_STEP_NODELIST": "gpu-b[3-4],gpu-a1"},
     DistInfo(5, 8, 1, "gpu-b3", 19242, "slurm")),
    ("slurm: SLURM_NODELIST as the last resort",
     {**{k: v for k, v in SLURM.items() if k != "SLURM_JOB_NODELIST"}, "SLURM_NODELIST": "n[001-004]"},
     DistInfo(5, 8, 1, "n001", 19242, "slurm")),
    ("slurm: the port wraps at 20000 job ids", {**SLURM, "SLURM_JOB_ID": "123456"},
     DistInfo(5, 8, 1, "node01", 15000 + 3456, "slurm")),
    ("slurm: explicit MASTER_ADDR and MASTER_PORT win", {**SLURM, "MASTER_ADDR": "login1", "MASTER_PORT": "23456"},
     DistInfo(5, 8, 1, "login1", 23456, "slurm")),
    ("slurm: no SLURM_LOCALID means local rank 0", {k: v for k, v in SLURM.items() if k != "SLURM_LOCALID"},
     DistInfo(5, 8, 0, "node01", 19242, "slurm")),
    ("slurm: one task needs neither node list nor job id", dict(SLURM_PROCID="0", SLURM_NTASKS="1"),
     DistInfo(0, 1, 0, "127.0.0.1", 29500, "slurm")),
]  # fmt: skip


@pytest.mark.parametrize("env, expected", [c[1:] for c in ENV_CASES], ids=[c[0] for c in ENV_CASES])
def test_dist_info_from_env(env: Dict[str, str], expected: DistInfo) -> None:
    assert dist_info_from_env(env) == expected


def _without(env: Mapping[str, str], *names: str) -> Dict[str, str]:
    return {k: v for k, v in env.items() if k not in names}


ENV_ERRORS: List[Tuple[str, Dict[str, str], str]] = [
    ("SLURM_PROCID not an integer", {**SLURM, "SLURM_PROCID": "x"}, "SLURM_PROCID='x' is not an integer"),
    ("SLURM_PROCID outside the world", {**SLURM, "SLURM_PROCID": "8"}, "SLURM_PROCID='8' must be < SLURM_NTASKS=8"),
    ("SLURM_NTASKS missing", _without(SLURM, "SLURM_NTASKS"), "SLURM_NTASKS is not set"),
    ("SLURM_NTASKS zero", {**SLURM, "SLURM_NTASKS": "0"}, "SLURM_NTASKS='0' must be >= 1"),
    ("SLURM_LOCALID negative", {**SLURM, "SLURM_LOCALID": "-1"}, "SLURM_LOCALID='-1' must be >= 0"),
    ("SLURM_JOB_ID not an integer", {**SLURM, "SLURM_JOB_ID": "12_3"}, "SLURM_JOB_ID='12_3' is not an integer"),
    ("no job id to derive the port from", _without(SLURM, "SLURM_JOB_ID"), "SLURM_JOB_ID is not set; set MASTER_PORT"),
    ("no node list", _without(SLURM, "SLURM_JOB_NODELIST"), "SLURM_NODELIST is set; set MASTER_ADDR"),
    ("malformed node list", {**SLURM, "SLURM_JOB_NODELIST": "node[01-"}, "SLURM_JOB_NODELIST='node[01-'"),
    ("RANK outside the world", {**TORCHRUN, "RANK": "4"}, "RANK='4' must be < WORLD_SIZE=4"),
    ("RANK without WORLD_SIZE", _without(TORCHRUN, "WORLD_SIZE"), "WORLD_SIZE is not set"),
    ("WORLD_SIZE without RANK", _without(TORCHRUN, "RANK"), "RANK is not set"),
    ("LOCAL_RANK missing", _without(TORCHRUN, "LOCAL_RANK"), "LOCAL_RANK is not set"),
    ("MASTER_PORT missing", _without(TORCHRUN, "MASTER_PORT"), "MASTER_PORT is not set"),
    ("MASTER_PORT not a port", {**TORCHRUN, "MASTER_PORT": "70000"}, "MASTER_PORT='70000' must be a port"),
    ("MASTER_ADDR empty", {**TORCHRUN, "MASTER_ADDR": " "}, "MASTER_ADDR is empty"),
]


@pytest.mark.parametrize("env, message", [c[1:] for c in ENV_ERRORS], ids=[c[0] for c in ENV_ERRORS])
def test_dist_info_from_env_names_the_bad_variable(env: Dict[str, str], message: str) -> None:
    with pytest.raises(ValueError) as info:
        dist_info_from_env(env)
    assert message in str(info.value)


def test_dist_info_checks_itself_and_names_the_main_rank() -> None:
    info = DistInfo(1, 2, 0, "h", 1234, "torchrun")
    assert (info.is_main, info.distributed) == (False, True)
    assert DistInfo(0, 1, 0, "h", 1234, "single").is_main
    with pytest.raises(ValueError, match=r"rank must be in \[0, 2\), got 2"):
        DistInfo(2, 2, 0, "h", 1234, "torchrun")
    with pytest.raises(ValueError, match="source must be one of"):
        DistInfo(0, 1, 0, "h", 1234, "mpi")


# ---- Slurm host lists -----------------------------------------------------------------------------------------------
HOSTLIST_CASES: List[Tuple[str, str, List[str]]] = [
    ("one host", "node01", ["node01"]),
    ("a range and a single number", "node[01-03,07]", ["node01", "node02", "node03", "node07"]),
    ("two prefixes", "gpu-a[1-2],gpu-b5", ["gpu-a1", "gpu-a2", "gpu-b5"]),
    ("zero padding kept", "n[001-004]", ["n001", "n002", "n003", "n004"]),
    ("plain names", "host1,host2", ["host1", "host2"]),
    ("unpadded range crossing a digit", "n[9-11]", ["n9", "n10", "n11"]),
    ("padded range crossing a digit", "n[08-10]", ["n08", "n09", "n10"]),
    ("text after the brackets", "n[1-2]-ib", ["n1-ib", "n2-ib"]),
    ("two bracket groups: the last fastest", "r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("a group then a plain name", "a[3-4],b", ["a3", "a4", "b"]),
]


@pytest.mark.parametrize("nodelist, hosts", [c[1:] for c in HOSTLIST_CASES], ids=[c[0] for c in HOSTLIST_CASES])
def test_expand_hostlist_and_first_host(nodelist: str, hosts: List[str]) -> None:
    assert list(expand_hostlist(nodelist)) == hosts
    assert first_host(nodelist) == hosts[0]


def test_first_host_of_a_huge_range_costs_nothing() -> None:
    assert first_host("n[000000001-999999999]") == "n000000001"


HOSTLIST_ERRORS = [
    ("empty", "", "empty"),
    ("unclosed bracket", "node[01-03", "never closed"),
    ("closing bracket alone", "node]1", "']' without '['"),
    ("nested brackets", "n[[1]]", "nested '['"),
    ("range ending below its start", "n[3-1]", "ends below its start"),
    ("empty name", "a,,b", "empty host name"),
    ("letters in a range", "n[a-b]", "bad range 'a-b'"),
    ("empty brackets", "n[]", "bad range ''"),
]


@pytest.mark.parametrize("nodelist, message", [c[1:] for c in HOSTLIST_ERRORS], ids=[c[0] for c in HOSTLIST_ERRORS])
def test_first_host_rejects_malformed_lists(nodelist: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        first_host(nodelist)


# ---- a single process: everything is a no-op ------------------------------------------------------------------------
def test_a_single_process_needs_no_group() -> None:
    info = DistInfo(0, 1, 0, "127.0.0.1", 29500, "single")
    model = torch.nn.Linear(3, 2)
    before = [p.detach().clone() for p in model.parameters()]
    init_process_group(info)  # a no-op
    broadcast_parameters([model])
    handle = attach_gradient_allreduce([model], 1)
    model(torch.ones(4, 3)).sum().backward()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert torch.equal(model.bias.grad, torch.full((2,), 4.0))  # untouched by any averaging
    assert (handle.reductions, all_reduce_mean(2.5)) == (0, 2.5)
    handle.remove()
    destroy_process_group()  # safe without a group
    destroy_process_group()


def test_arguments_are_checked_before_any_group_exists() -> None:
    info = DistInfo(0, 2, 0, "127.0.0.1", 29500, "torchrun")
    with pytest.raises(ValueError, match="timeout_s must be a positive number"):
        init_process_group(info, timeout_s=0)
    with pytest.raises(ValueError, match="device must be 'cpu', 'cuda' or 'cuda:i', got 'meta'"):
        init_process_group(info, device="meta")
    with pytest.raises(RuntimeError, match="world_size=2 but no process group is initialized"):
        attach_gradient_allreduce([torch.nn.Linear(2, 2)], 2)
    with pytest.raises(ValueError, match="none of the modules' parameters requires a gradient"):
        attach_gradient_allreduce([torch.nn.Linear(2, 2).requires_grad_(False)], 1)


# ---- real process groups --------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env(rank: Optional[int], world_size: int, port: int) -> Dict[str, str]:
    """The environment of one worker: torchrun's variables for ``rank`` (None: a single process), nothing of an
    enclosing launcher's (the suite itself may run under Slurm or torchrun)."""
    launcher = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k not in launcher}
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1")
    if rank is not None:
        env.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    return env


@contextlib.contextmanager
def workers(runs: List[Tuple[Optional[int], int, List[str]]], port: int) -> Iterator[List[subprocess.Popen]]:
    """Start ``dist_worker.py`` once per ``(rank, world_size, args)``; kill every one still running at the end."""
    procs: List[subprocess.Popen] = []
    try:
        for rank, world_size, args in runs:
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(WORKER), *args],
                    env=worker_env(rank, world_size, port),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=10)


def finish(proc: subprocess.Popen, deadline: float) -> str:
    """Wait for ``proc`` until the monotonic ``deadline``; its output, or a failure showing it."""
    try:
        out, _ = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate(timeout=10)
        pytest.fail(f"worker {proc.args} still ran at its deadline; output:\n{out}")
    assert proc.returncode == 0, f"worker {proc.args} exited with {proc.returncode}; output:\n{out}"
    return out


def leaves(value: Any, path: str = "") -> Iterator[Tuple[str, Any]]:
    """``(path, leaf)`` of a nested state dict, depth first."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from leaves(item, f"{path}/{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from leaves(item, f"{path}[{i}]")
    else:
        yield path, value


def assert_same_state(actual: Mapping[str, Any], expected: Mapping[str, Any], atol: float) -> None:
    """Every leaf equal: tensors within ``atol`` (``atol=0``: bitwise), everything else exactly."""
    got, want = dict(leaves(actual)), dict(leaves(expected))
    assert got.keys() == want.keys()
    for path, value in want.items():
        if isinstance(value, torch.Tensor):
            diff = (got[path].double() - value.double()).abs().max().item() if value.numel() else 0.0
            assert diff <= atol, f"{path} differs by {diff:.3g} (tolerance {atol:g})"
        else:
            assert got[path] == value, path


def load(path: Path) -> Dict[str, Any]:
    return torch.load(path, weights_only=True)


def learn_single(steps: int) -> Dict[str, Any]:
    """The reference: one learner, in this process, ``steps`` learn steps on the whole batch."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the workers
    try:
        policy = make_dqn_policy(seed=0)
        batch = cartpole_batch(BATCH, seed=0)
        losses = [policy.learn_mode.forward(dict(batch))["total_loss"] for _ in range(steps)]
        return dict(state=policy.state_dict(), losses=losses)
    finally:
        torch.set_num_threads(threads)


def test_two_gloo_learners_match_one_learner_with_the_doubled_batch(tmp_path: Path) -> None:
    # DQN's loss is the importance-weighted *mean* over the batch, so the mean of the two halves' gradients is the
    # whole batch's gradient; clipping (grad_clip 1.0, active here) and Adam then act on equal gradients
    runs = [(r, 2, ["train", "--out", str(tmp_path / f"rank{r}.pt"), "--steps", "3"]) for r in (0, 1)]
    with workers(runs, free_port()) as procs:
        deadline = time.monotonic() + DEADLINE_S
        single = learn_single(steps=3)  # while the workers start
        for proc in procs:
            finish(proc, deadline)
    rank0, rank1 = (load(tmp_path / name) for name in ("rank0.pt", "rank1.pt"))
    assert rank0["reductions"] == rank1["reductions"] == 3  # one gradient all-reduce per learn step
    assert_same_state(rank1["state"], rank0["state"], atol=0.0)  # the ranks never drift apart
    assert_same_state(rank0["state"], single["state"], atol=1e-6)  # model, target copy, Adam's moments and step
    assert rank0["losses"] != rank1["losses"]  # the ranks did train on different rows
    assert rank0["mean_losses"] == rank1["mean_losses"]
    assert rank0["mean_losses"] == pytest.approx(single["losses"], abs=1e-6)


def test_two_gloo_sac_learners_stay_equal_temperature_included(tmp_path: Path) -> None:
    """SAC's temperature ``log_alpha`` is trained by its own optimizer outside the model: averaged like the model's
    parameters, every rank takes the same temperature step on different rows (without it, the ranks drift apart)."""
    runs = [(r, 2, ["train_sac", "--out", str(tmp_path / f"rank{r}.pt"), "--steps", "3"]) for r in (0, 1)]
    with workers(runs, free_port()) as procs:
        deadline = time.monotonic() + DEADLINE_S
        for proc in procs:
            finish(proc, deadline)
    rank0, rank1 = (load(tmp_path / name) for name in ("rank0.pt", "rank1.pt"))
    assert rank0["reductions"] == rank1["reductions"] >= 3
    assert_same_state(rank1["state"], rank0["state"], atol=0.0)
    assert not torch.equal(rank0["state"]["learn"]["log_alpha"], rank0["start_log_alpha"])  # it did train


def test_broadcast_policy_gives_every_rank_rank0s_whole_state(tmp_path: Path) -> None:
    port = free_port()
    runs = [(r, 2, ["broadcast", "--out", str(tmp_path / f"rank{r}.pt")]) for r in (0, 1)]
    with workers(runs, port) as procs:
        deadline = time.monotonic() + DEADLINE_S
        for proc in procs:
            finish(proc, deadline)
    before0, before1 = (load(tmp_path / f"rank{r}.pt.before")["before"] for r in (0, 1))
    (after0, mismatch0), (after1, mismatch1) = (
        (d["state"], d["mismatch"]) for d in (load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    )
    for mismatch in (mismatch0, mismatch1):  # the first try, with only rank 0's optimizer stepped
        assert "broadcast_policy: the ranks hold policy states of different layouts" in mismatch
    # each rank stepped on its own data from its own seed: weights, targets and Adam's moments differed, and so
    # did the target's update count (1 against 2)
    for part in ("model", "learn"):
        with pytest.raises(AssertionError, match="differs by"):
            assert_same_state(before1[part], before0[part], atol=0.0)
    counts = [b["learn"]["agents"]["learn_agent"]["update_counts"]["target"] for b in (before0, before1)]
    assert counts == [1, 2]
    assert_same_state(after0, before0, atol=0.0)  # the source keeps its state
    assert_same_state(after1, before0, atol=0.0)  # and the other rank now holds exactly that


def test_gradients_are_averaged_over_accumulated_passes_and_layouts_are_checked(tmp_path: Path) -> None:
    runs = [(r, 2, ["hooks", "--out", str(tmp_path / f"rank{r}.json")]) for r in (0, 1)]
    with workers(runs, free_port()) as procs:
        deadline = time.monotonic() + DEADLINE_S
        for proc in procs:
            finish(proc, deadline)
    for rank in (0, 1):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert "attach_gradient_allreduce: the ranks hold parameters of different layouts" in result["mismatch"]
        assert result["broadcast_equal"] is True
        assert result["max_grad_diff"] < 1e-6
        assert result["reductions"] == result["reductions_after_remove"] == 2


@pytest.mark.parametrize("mode", ["kill", "stall"])
def test_a_dead_or_stalled_rank_makes_the_survivor_raise_within_the_timeout(tmp_path: Path, mode: str) -> None:
    port, out = free_port(), tmp_path / "rank0.json"
    args = ["fail", "--mode", mode, "--timeout-s", str(FAIL_TIMEOUT_S)]
    runs = [(0, 2, [*args, "--out", str(out)]), (1, 2, [*args, "--out", str(tmp_path / "rank1.json")])]
    with workers(runs, port) as (survivor, failing):
        finish(survivor, time.monotonic() + DEADLINE_S)
        if mode == "kill":
            assert failing.wait(timeout=10) == -9
        else:
            assert failing.poll() is None  # still asleep: the survivor gave up on it by itself
    result = json.loads(out.read_text())
    assert result["error"] == "RuntimeError", result
    assert "gradient all-reduce failed on rank 0" in result["message"]
    assert result["reductions"] == 0
    # from the learn step to the error: a closed connection is noticed at once, a silent peer at the timeout
    # (start-up is left out: importing torch takes seconds on a loaded machine)
    assert result["elapsed_s"] < FAIL_TIMEOUT_S + 5.0
    if mode == "stall":
        assert result["elapsed_s"] > FAIL_TIMEOUT_S - 1.0


def test_a_rank_whose_peers_never_come_fails_to_join_within_the_timeout(tmp_path: Path) -> None:
    out = tmp_path / "rank0.json"
    with workers([(0, 2, ["alone", "--timeout-s", "3", "--out", str(out)])], free_port()) as (proc,):
        finish(proc, time.monotonic() + DEADLINE_S)
    result = json.loads(out.read_text())
    assert result["error"] == "RuntimeError", result
    assert "rank 0 of 2 (torchrun) could not join the gloo process group at tcp://127.0.0.1:" in result["message"]
    assert 2.0 < result["elapsed_s"] < 3.0 + 5.0
