"""Every shipped config compiles and trains for a few iterations (shrunk so the whole set takes seconds)."""

import glob
import os

import pytest

from nervex.config import apply_overrides, read_config
from nervex.entry import LeagueTrainer, SerialTrainer, compile_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = sorted(
    path
    for path in glob.glob(os.path.join(ROOT, "app_zoo", "**", "config", "*.yaml"), recursive=True)
    if not path.endswith("_space.yaml")  # a search space of `nervex -m tune`, not a config
)
NEEDS = {
    "atari": "ale_py",
    "box2d": "Box2D",
    "mujoco": "mujoco",
    "sumo": "libsumo",
    "gfootball": "gfootball_engine",
    "poker": "pyspiel",
}


def shrink(cfg):
    """Overrides that keep a config's algorithm, model and env but make a few iterations cheap (decided on the
    compiled config: on-policy or not, and the collect and learn keys the policy has)."""
    compiled = compile_config(cfg)
    collect, learn = compiled.policy.collect, compiled.policy.learn
    libsumo = compiled.env.env_type in ("sumo", "sumo_grid")  # one simulation per process: keep its workers
    over = ["env.collector_env_num=2", "env.evaluator_env_num=1", "evaluator.n_episode=1"]
    over += ["env.num_seconds=100"] if libsumo else ["env.manager_type=base"]
    over += ["evaluator.eval_freq=1000000", "learner.hook.log_show_after_iter=0"]
    if compiled.policy.on_policy:
        over += ["policy.learn.epoch_per_collect=2", "policy.learn.batch_size=8"]
        over += ["policy.collect.rollout_len=16"] if collect.get("rollout_len") else []
        over += ["policy.collect.n_episode=2"] if collect.get("n_episode") else []
    else:
        over += ["policy.learn.learning_starts=0", "policy.learn.batch_size=8", "replay_buffer.maxlen=1000"]
        over += ["policy.learn.update_per_collect=2"] if learn.get("update_per_collect", 0) > 2 else []
        over += ["policy.collect.n_sample=16"] if (collect.get("n_sample") or 0) > 16 else []
    return apply_overrides(cfg, over)


# a football engine starts in ~20 s and steps at ~3.5 ms: its configs' few iterations take minutes, so they are slow
SLOW = ("gfootball",)
PARAMS = [
    pytest.param(path, marks=[pytest.mark.slow] if any(f"{os.sep}{f}{os.sep}" in path for f in SLOW) else [])
    for path in CONFIGS
]


@pytest.mark.parametrize("path", PARAMS, ids=lambda p: os.path.relpath(p, os.path.join(ROOT, "app_zoo")))
def test_shipped_config_compiles_and_trains(path, tmp_path):
    for folder, module in NEEDS.items():
        if f"{os.sep}{folder}{os.sep}" in path:
            pytest.importorskip(module)
    cfg = compile_config(read_config(path))  # as shipped
    assert cfg.policy.policy_type
    trainer_cls = LeagueTrainer if cfg.get("league") is not None else SerialTrainer  # a league: every player
    with trainer_cls(shrink(read_config(path)), seed=0, run_root=str(tmp_path)) as trainer:
        for _ in range(3):
            result = trainer.train()
    if trainer_cls is LeagueTrainer:
        result = {k.split("/", 1)[1]: v for k, v in result.items() if k.startswith("main/")}
    assert result["env_step"] > 0
    if cfg.policy.on_policy:
        assert result["train_iter"] > 0  # on-policy learns from the first rollout
