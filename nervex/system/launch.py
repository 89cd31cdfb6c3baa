"""Run every role of a parallel run on this machine: ``python -m nervex.system.launch CONFIG [--actors N]``.

``./run.sh dist CONFIG`` calls this. It starts the coordinator, waits for its address, then the league manager, the
learner and a manager that starts ``--actors`` actors, all bound to 127.0.0.1 and sharing one run directory. It
waits for the learner to finish (the target return, ``max_env_step`` or ``max_train_iter``), for ``--timeout``
seconds, or for Ctrl-C, and then stops every process it started: SIGTERM to each role's process group, SIGKILL to
what is left after a grace period. A role that dies early stops the run with an error naming it and its log.

The launcher compiles the config against the policy and env it names (``nervex.entry.compile_parallel_config``) and
writes it to ``<run_dir>/config.yaml``; the coordinator is started from that file and reads its plain ``system``
values (it imports no policy). ``--print-config`` only prints that compiled config (how ``coordinator_start``
compiles a user's YAML in a child process).

Exit status: the learner's (0 when it finished), 1 when another role died, 124 on the timeout, 130 on Ctrl-C,
2 for a bad config.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional, Tuple

import yaml

GRACE_S = 20.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m nervex.system.launch",
        description="Start the coordinator, league manager, learner and a manager with its actors on 127.0.0.1; "
        "stop them all when the learner finishes, on --timeout, on Ctrl-C, or when a role dies.",
    )
    parser.add_argument("config", help="the parallel config (a YAML with a system section)")
    parser.add_argument("--actors", type=int, default=None, help="actor processes (default: system.manager.actors)")
    parser.add_argument(
        "--run-dir",
        default=None,
        help="run directory (an existing one is resumed); default: runs/<exp_name>__<time>, a new one per launch",
    )
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds before every role is stopped (124)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the compiled config (YAML, every key, system.collect resolved) on stdout and exit",
    )
    return parser


class Launch:
    """The processes of one local parallel run."""

    def __init__(
        self,
        config: str,
        run_dir: str,
        overrides: List[str],
        actors: Optional[int],
        compiled_config: Optional[str] = None,
    ) -> None:
        self.run_dir = run_dir
        self.common = ["--config", config, "--run-dir", run_dir] + [a for o in overrides for a in ("--set", o)]
        # the coordinator reads the compiled config (overrides applied) when there is one; else it compiles `config`
        self.coordinator_args = ["--config", compiled_config, "--run-dir", run_dir] if compiled_config else None
        self.actors = actors
        self.processes: Dict[str, subprocess.Popen] = {}  # the newest process of each role
        self.started: List[Tuple[str, subprocess.Popen]] = []  # every process started, in order

    def start(self, role: str, extra: Optional[List[str]] = None) -> subprocess.Popen:
        common = self.coordinator_args if role == "coordinator" and self.coordinator_args else self.common
        command = [sys.executable, "-u", "-m", f"nervex.system.{role}_start", *common, *(extra or [])]
        os.makedirs(os.path.join(self.run_dir, "logs"), exist_ok=True)
        out = open(os.path.join(self.run_dir, "logs", f"{role}.stderr"), "ab")
        # a process group per role: its children (the manager's actors) are stopped with it
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
        out.close()
        self.processes[role] = process
        self.started.append((role, process))
        return process

    def wait_for_coordinator(self, timeout_s: float = 120.0) -> str:
        from nervex.system.protocol import read_coordinator_url

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            url = read_coordinator_url(self.run_dir)
            if url:
                return url
            if self.processes["coordinator"].poll() is not None:
                raise RoleDied("coordinator", self.processes["coordinator"].returncode, self.run_dir)
            time.sleep(0.1)
        raise TimeoutError(f"the coordinator did not write {self.run_dir}/coordinator.url within {timeout_s:.0f} s")

    def start_all(self) -> None:
        from nervex.system.protocol import COORDINATOR_URL_FILE

        stale = os.path.join(self.run_dir, COORDINATOR_URL_FILE)
        if os.path.exists(stale):
            os.remove(stale)  # a resumed run: wait for the new coordinator's address, not the last one's
        self.start("coordinator")
        self.wait_for_coordinator()
        self.start("league_manager")
        self.start("learner")
        self.start("manager", [] if self.actors is None else ["--actors", str(self.actors)])

    def watch(self, deadline: float) -> int:
        """Wait for the learner; returns its exit status. Raises ``RoleDied`` or ``TimeoutError``."""
        while True:
            learner = self.processes["learner"].poll()
            if learner is not None:
                return learner
            for role, process in self.processes.items():
                # status 0: the role saw the run finish (the learner is closing); anything else is a death
                if role != "learner" and process.poll() not in (None, 0):
                    raise RoleDied(role, process.returncode, self.run_dir)
            if time.monotonic() > deadline:
                raise TimeoutError("the run did not finish within --timeout")
            time.sleep(0.2)

    def stop_all(self, grace_s: float = GRACE_S) -> None:
        """SIGTERM every worker's process group and wait, then the coordinator's (workers finish their last calls
        against a live coordinator: the learner's stop checkpoint, an actor's completion); SIGKILL what remains."""
        workers = [(r, p) for r, p in reversed(self.started) if r != "coordinator"]
        coordinators = [(r, p) for r, p in reversed(self.started) if r == "coordinator"]
        for group in (workers, coordinators):
            for _, process in group:
                if process.poll() is None:
                    _signal_group(process, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            for role, process in group:
                try:
                    process.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    print(f"launch: {role} did not stop within {grace_s:.0f} s; killing it", file=sys.stderr)
                _signal_group(process, signal.SIGKILL)  # also any child it left behind
                process.wait()


class RoleDied(RuntimeError):
    def __init__(self, role: str, code: int, run_dir: str) -> None:
        super().__init__(
            f"the {role} exited with status {code} before the run finished; see {run_dir}/logs/{role}*.log and "
            f"{run_dir}/logs/{role}.stderr"
        )
        self.role = role


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    from nervex.config import ConfigError, apply_overrides, read_config, save_config, to_plain
    from nervex.entry.builder import compile_parallel_config
    from nervex.system.system_config import default_run_dir

    try:
        cfg = compile_parallel_config(apply_overrides(read_config(args.config), args.overrides))
    except (ConfigError, FileNotFoundError) as error:
        print(error if args.print_config else f"launch: {error}", file=sys.stderr)
        return 2
    if args.print_config:
        yaml.safe_dump(to_plain(cfg), sys.stdout, sort_keys=False, default_flow_style=False)
        return 0
    if args.actors is not None and args.actors < 1:
        print(f"launch: --actors must be >= 1, got {args.actors}", file=sys.stderr)
        return 2
    run_dir = args.run_dir or f"{default_run_dir(cfg)}__{time.strftime('%Y%m%d-%H%M%S')}"
    os.makedirs(run_dir, exist_ok=True)
    compiled = os.path.join(run_dir, "config.yaml")
    save_config(cfg, compiled)  # the learner writes the same config there again
    launch = Launch(args.config, run_dir, args.overrides, args.actors, compiled_config=compiled)
    interrupted = []
    previous = signal.signal(signal.SIGTERM, lambda *a: interrupted.append("SIGTERM") or _raise_interrupt())
    start = time.monotonic()
    print(f"launch: run directory {run_dir}", file=sys.stderr)
    code = 1
    try:
        launch.start_all()
        code = launch.watch(start + args.timeout)
        print(f"launch: learner finished with status {code} after {time.monotonic() - start:.1f} s", file=sys.stderr)
    except RoleDied as error:
        print(f"launch: {error}", file=sys.stderr)
        code = 1
    except TimeoutError as error:
        print(f"launch: {error}", file=sys.stderr)
        code = 124
    except KeyboardInterrupt:
        print(f"launch: {interrupted[0] if interrupted else 'Ctrl-C'}; stopping every role", file=sys.stderr)
        code = 130
    finally:
        launch.stop_all()
        signal.signal(signal.SIGTERM, previous)
    _summary(run_dir)
    return code


def _raise_interrupt() -> None:
    raise KeyboardInterrupt


def _summary(run_dir: str) -> None:
    path = os.path.join(run_dir, "eval.csv")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            lines = f.read().strip().splitlines()
        if len(lines) > 1:
            print(f"launch: last evaluation ({path}):\n  {lines[0]}\n  {lines[-1]}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
