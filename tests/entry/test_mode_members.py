"""Every member of the four mode interfaces is used by a worker: none is dead weight a new policy must write."""

from typing import Any, Set

from nervex.entry import SerialTrainer, load_policy
from nervex.policy import CollectMode, CommandMode, DQNPolicy, EvalMode, LearnMode, PPOPolicy, register_policy
from nervex.utils import POLICY_REGISTRY

from .conftest import small_cfg

USED: Set[str] = set()


class Recorder:
    """Stands in front of a mode: records which members the workers call (or read, for plain values)."""

    def __init__(self, mode: Any, name: str) -> None:
        self._mode, self._name = mode, name

    def __getattr__(self, item: str) -> Any:
        value = getattr(self._mode, item)
        if not callable(value):
            USED.add(f"{self._name}.{item}")
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            USED.add(f"{self._name}.{item}")
            return value(*args, **kwargs)

        return call


def recording(cls: type) -> type:
    class Recording(cls):
        config = cls.config  # the same declared defaults

        learn_mode = property(lambda self: Recorder(cls.learn_mode.fget(self), "learn"))
        collect_mode = property(lambda self: Recorder(cls.collect_mode.fget(self), "collect"))
        eval_mode = property(lambda self: Recorder(cls.eval_mode.fget(self), "eval"))
        command_mode = property(lambda self: Recorder(cls.command_mode.fget(self), "command"))

    Recording.__name__ = f"Recording{cls.__name__}"
    return Recording


def test_every_mode_member_is_used_by_training_resuming_and_serving(tmp_path):
    names = {"rec_dqn": recording(DQNPolicy), "rec_ppo": recording(PPOPolicy)}
    for name, cls in names.items():
        register_policy(name, cls)
    try:
        dqn = small_cfg(**{"policy.policy_type": "rec_dqn", "learner.lr_decay": {"type": "linear"}})
        dqn["evaluator"]["eval_freq"] = 100
        with SerialTrainer(dqn, seed=0, exp_name="dqn", run_root=str(tmp_path)) as trainer:
            for _ in range(20):
                trainer.train()
            path = trainer.save_checkpoint()
            trainer.load_checkpoint(path)
        ppo = small_cfg(**{"policy.policy_type": "rec_ppo"})
        ppo["policy"] = {"policy_type": "rec_ppo", "collect": {"rollout_len": 8}, "learn": {"batch_size": 8}}
        del ppo["replay_buffer"]
        with SerialTrainer(ppo, seed=0, exp_name="ppo", run_root=str(tmp_path)) as trainer:
            trainer.train()
            ppo_path = trainer.save_checkpoint()
        load_policy(ppo_path, enable_field=("collect",))  # an actor process's way in: a collect-only policy
        load_policy(ppo_path, enable_field=("eval",))
    finally:
        for name in names:
            POLICY_REGISTRY.unregister(name)
    expected = {
        f"{mode}.{field}"
        for mode, fields in (
            ("learn", LearnMode._fields),
            ("collect", CollectMode._fields),
            ("eval", EvalMode._fields),
            ("command", CommandMode._fields),
        )
        for field in fields
    }
    assert expected - USED == set(), f"mode members no worker uses: {sorted(expected - USED)}"
