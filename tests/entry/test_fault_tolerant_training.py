"""Training goes on when environments fail: the subprocess manager restarts them, the actor drops the cut episodes.

``CrashingCartPoleEnv`` is registered as ``crashing_cartpole`` at module level so that worker processes find it:
forked workers inherit it, spawned ones import this module (``tests`` is a package) when they unpickle the class.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
from typing import Any, Dict, List, Optional

import numpy as np
import pytest

from app_zoo.classic_control.cartpole.envs import CartPoleEnv
from nervex.config import read_config
from nervex.entry import SerialTrainer
from nervex.utils import ENV_REGISTRY

from .conftest import CARTPOLE_DQN, small_cfg


@ENV_REGISTRY.register("crashing_cartpole", force=True)  # force: spawned workers import this module again
class CrashingCartPoleEnv(CartPoleEnv):
    """CartPole-v1 that fails on purpose.

    Config keys besides CartPole's: ``step_crash_prob`` / ``reset_crash_prob`` (raise ``RuntimeError`` from a
    step / reset with this probability, drawn from a stream seeded by ``seed()``, apart from the env's own),
    ``exit_at_step`` (``os._exit(3)`` on this step counted since the env was built; 0 = never) and
    ``crash_marker`` (a file path: only the first env of the whole run to get there creates it and exits).
    """

    config: Dict[str, Any] = dict(
        CartPoleEnv.config, step_crash_prob=0.0, reset_crash_prob=0.0, exit_at_step=0, crash_marker=""
    )

    def __init__(self, cfg: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(cfg)
        self._steps = 0
        self._crash_rng = np.random.default_rng(0)

    def seed(self, seed: int) -> None:
        super().seed(seed)
        self._crash_rng = np.random.default_rng([seed, 0xC4A5])

    def _claim_crash(self) -> bool:
        marker = self._cfg["crash_marker"]
        if not marker:
            return True
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))  # atomic: one winner across processes
            return True
        except FileExistsError:
            return False

    def reset(self) -> Any:
        if self._cfg["reset_crash_prob"] and self._crash_rng.random() < self._cfg["reset_crash_prob"]:
            raise RuntimeError("crashing_cartpole: reset failed on purpose")
        return super().reset()

    def step(self, action: Any) -> Any:
        self._steps += 1
        if self._steps == self._cfg["exit_at_step"] and self._claim_crash():
            os._exit(3)
        if self._cfg["step_crash_prob"] and self._crash_rng.random() < self._cfg["step_crash_prob"]:
            raise RuntimeError(f"crashing_cartpole: step {self._steps} failed on purpose")
        return super().step(action)


def assert_all_dead(pids: List[int]) -> None:
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def read_scalars(run_dir: str, tag: str) -> List[float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(run_dir)
    events.Reload()
    if tag not in events.Tags()["scalars"]:
        return []
    return [e.value for e in events.Scalars(tag)]


# spawn: each worker imports torch, nervex and this module (~3 s per process on 2 cores): kept out of the default run
@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_training_goes_on_after_a_worker_dies(run_root, tmp_path, context):
    """One collector env's process exits on its 50th step (env_step ~100); 400 env steps of DQN training go on."""
    cfg = small_cfg(
        **{
            "env.env_type": "crashing_cartpole",
            "env.manager_type": "subprocess",
            "env.exit_at_step": 50,
            "env.crash_marker": str(tmp_path / "crashed"),  # exactly one crash in the run, whichever env gets there
            # one env per worker: the crash cuts exactly one episode (the default would be min(2, cpu_count))
            "env.manager": {"worker_num": 2, "context": context, "retry_delay": 0.0},
        }
    )
    pids: List[int] = []
    with SerialTrainer(cfg, seed=0, exp_name="crash", run_root=run_root) as trainer:
        collector = trainer.actor._env
        results = [trainer.train()]
        first_pids = list(collector.worker_pids)
        while trainer.env_step < 400:
            results.append(trainer.train())
        pids = first_pids + collector.worker_pids + trainer.evaluator._env.worker_pids
        run_dir = trainer.run_dir
        assert os.path.exists(tmp_path / "crashed")
        assert trainer.actor.abnormal_episodes == 1
        assert collector.stats == dict(
            restarts=1, dropped_episodes=1, timeouts=0, crashes=1, exceptions=0, reset_requests=0
        )
        assert set(first_pids) != set(collector.worker_pids)  # the dead worker was replaced
        assert trainer.evaluator._env.stats["restarts"] == 0  # the marker was taken before the first evaluation
        assert trainer.train_iter > 0 and math.isfinite(results[-1]["train/loss"])
        assert [r["eval/n_episode"] for r in results if "eval/n_episode" in r] == [2, 2]  # at 200 and 400
        last = results[-1]
        assert last["rollout/abnormal_episodes"] == 1.0 and last["env/restarts"] == 1.0 and last["env/crashes"] == 1.0
    assert not mp.active_children()
    assert_all_dead(pids)
    # the restart is reported: a warning in the text log and env/* scalars in TensorBoard
    with open(os.path.join(run_dir, "log.txt"), encoding="utf-8") as f:
        log = f.read()
    assert "env restarts: 1" in log and "crashes: 1" in log
    assert read_scalars(run_dir, "env/restarts")[-1] == 1.0
    assert read_scalars(run_dir, "rollout/abnormal_episodes")[-1] == 1.0


@pytest.mark.slow
def test_dqn_reaches_195_with_randomly_failing_envs(tmp_path):
    """The shipped CartPole DQN config with envs in subprocesses that raise from 0.05% of steps and 0.5% of resets.

    Training goes on past the first evaluation >= 195 (which may come after ~3,000 env steps, where 0.05% per step
    gives no failure in one run out of five) until 20,000 env steps, so ~10 step failures are expected;
    ``stop_val`` is out of reach and ``max_env_step`` (40,000) bounds a run that has not reached 195 by then.
    """
    cfg = read_config(CARTPOLE_DQN)
    cfg.env.env_type = "crashing_cartpole"
    cfg.env.manager_type = "subprocess"
    cfg.env.step_crash_prob = 0.0005
    cfg.env.reset_crash_prob = 0.005
    cfg.max_env_step = 40000
    cfg.evaluator.stop_val = 501  # CartPole-v1 returns at most 500
    first_195 = None
    with SerialTrainer(cfg, seed=0, exp_name="crashy", run_root=str(tmp_path)) as trainer:
        for result in trainer:
            if first_195 is None and result.get("eval/mean_reward", 0.0) >= 195:
                first_195 = result["env_step"]
            if first_195 is not None and trainer.env_step >= 20000:
                break
        stats = trainer.actor._env.stats
        pids = trainer.actor._env.worker_pids + trainer.evaluator._env.worker_pids
        assert first_195 is not None, (
            f"best evaluation {trainer.evaluator.best_reward} after {trainer.env_step} steps; env stats {stats}"
        )
        assert stats["restarts"] > 0 and stats["exceptions"] > 0, stats
        assert trainer.actor.abnormal_episodes > 0, stats
        assert stats["dropped_episodes"] == trainer.actor.abnormal_episodes
        assert stats["crashes"] == stats["timeouts"] == 0  # exceptions rebuild the env inside its worker
        assert result["env/restarts"] == stats["restarts"]
    assert not mp.active_children()
    assert_all_dead(pids)
