"""SerialEvaluator reports its env manager's fault counters (eval/env_*) and warns when envs were restarted."""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Dict, List, Optional

from nervex.envs import BaseEnvTimestep
from nervex.worker.actor import SerialEvaluator, eval_episodes_per_env
from nervex.worker.actor.env_manager import SubprocessEnvManager

from .envs import ClockEnv


class FaultyClockEnv(ClockEnv):
    """``ClockEnv`` (obs ``[env_tag, t]``, reward 1 per step) with 2-step episodes and one fault.

    On its ``fault_step``-th step since it was built, the first instance (across processes) to create the file
    ``marker`` fails: ``fault='exit'`` calls ``os._exit(3)``, ``fault='hang'`` sleeps a minute. Later instances, such
    as the one rebuilt after the failure, behave.
    """

    config: Dict[str, Any] = dict(ClockEnv.config, episode_len=2, fault=None, fault_step=3, marker="")

    def __init__(self, cfg: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(cfg)
        self._steps = 0

    def _claim_fault(self) -> bool:
        try:
            os.close(os.open(self._cfg["marker"], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return True
        except FileExistsError:
            return False

    def step(self, action: Any) -> BaseEnvTimestep:
        self._steps += 1
        if self._cfg["fault"] and self._steps == self._cfg["fault_step"] and self._claim_fault():
            if self._cfg["fault"] == "exit":
                os._exit(3)
            time.sleep(60.0)
        return super().step(action)


class ZeroEvalMode:
    """An eval mode that always picks action 0."""

    def forward(self, data_id: List[int], obs: Dict[int, Any], **setting: Any) -> Dict[int, Dict[str, Any]]:
        return {env_id: {"action": 0} for env_id in data_id}

    def reset(self, data_id: Optional[List[int]]) -> None:
        pass


FAULT_KEYS = {"eval/env_restarts": "restarts", "eval/env_timeouts": "timeouts", "eval/env_crashes": "crashes"}


def test_eval_reports_env_restarts_timeouts_and_crashes(tmp_path, caplog):
    """Env 0's process exits on its 3rd step, env 1's hangs on its 3rd (each once, in the first evaluation)."""
    n_episode = 4
    cfgs = [
        dict(env_tag=0.0, fault="exit", marker=str(tmp_path / "exit0")),
        dict(env_tag=1.0, fault="hang", marker=str(tmp_path / "hang1")),
    ]
    episodes = eval_episodes_per_env(n_episode, len(cfgs))
    manager = SubprocessEnvManager(
        FaultyClockEnv, cfgs, len(cfgs), episodes, worker_num=2, step_timeout=0.5, reset_timeout=5, retry_delay=0
    )
    logger = logging.getLogger("tests.serial_evaluator")
    evaluator = SerialEvaluator({"n_episode": n_episode}, manager, ZeroEvalMode(), logger=logger)
    try:
        with caplog.at_level(logging.WARNING, logger=logger.name):
            first = evaluator.eval(train_iter=1, env_step=100)
        # each env: episode 1, then its 3rd step (the 1st of episode 2) fails; the rebuilt env plays episode 2
        assert first["eval/n_episode"] == 4 and first["eval/mean_reward"] == 2.0
        stats = manager.stats
        assert {key: first[key] for key in FAULT_KEYS} == {
            "eval/env_restarts": 2,
            "eval/env_timeouts": 1,
            "eval/env_crashes": 1,
        }
        assert {key: first[key] for key in FAULT_KEYS} == {key: stats[name] for key, name in FAULT_KEYS.items()}
        assert all(type(first[key]) is int for key in FAULT_KEYS)
        assert stats["dropped_episodes"] == 2
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warnings == [
            "[evaluator] 2 env restart(s) during the evaluation at env_step=100; since the start: restarts: 2, "
            "timeouts: 1, crashes: 1, dropped episodes: 2"
        ]

        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=logger.name):
            second = evaluator.eval(train_iter=2, env_step=200)  # no fault left: cumulative counters, no warning
        assert second["eval/n_episode"] == 4
        assert {key: second[key] for key in FAULT_KEYS} == {key: first[key] for key in FAULT_KEYS}
        assert {key: second[key] for key in FAULT_KEYS} == {
            key: manager.stats[name] for key, name in FAULT_KEYS.items()
        }
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    finally:
        evaluator.close()
