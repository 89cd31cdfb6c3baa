"""The shipped Pong configs train on real ALE frames: a few hundred env steps with learning on (smoke tests; the
full runs need a GPU)."""

import glob
import os

import pytest

from nervex.config import read_config
from nervex.entry import SerialTrainer

pytest.importorskip("ale_py")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PONG = sorted(glob.glob(os.path.join(ROOT, "app_zoo", "atari", "config", "pong_*.yaml")))


@pytest.mark.parametrize("path", PONG, ids=[os.path.basename(p)[: -len(".yaml")] for p in PONG])
def test_pong_config_trains_a_few_steps_on_real_frames(tmp_path, path):
    cfg = read_config(path)
    cfg.max_env_step = 256
    cfg.env.update(manager_type="base", collector_env_num=2, evaluator_env_num=1)
    cfg.evaluator.update(n_episode=1, eval_freq=10**9)  # a Pong game lasts thousands of steps: no evaluation here
    learn = cfg.policy.learn
    if "learning_starts" in learn:  # off-policy: a small buffer, learning from the first collection on
        # batch 4: R2D2's first collection (640 steps over 2 envs) holds 6 sequences of 80 learn steps
        learn.update(learning_starts=64, batch_size=min(int(learn.get("batch_size", 32)), 4))
        cfg.replay_buffer.maxlen = 2000
    with SerialTrainer(cfg, seed=0, exp_name="pong_smoke", run_root=str(tmp_path)) as trainer:
        trainer.run(progress=False)
    assert trainer.env_step >= 256
    assert trainer.train_iter > 0
