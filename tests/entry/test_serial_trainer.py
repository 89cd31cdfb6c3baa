"""Behaviour of the serial trainer: determinism, save/load, resume, run directory, callbacks, CLI."""

import csv
import glob
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from nervex.entry import DefaultCallbacks, SerialTrainer, serial_pipeline
from nervex.torch_utils import load_checkpoint

from .conftest import ROOT, small_cfg


def params(policy):
    return [p.detach().clone() for p in policy.model.parameters()]


def run_iters(trainer, n):
    for _ in range(n):
        trainer.train()


def test_same_seed_gives_identical_parameters(run_root):
    results = []
    for i in range(2):
        with SerialTrainer(small_cfg(), seed=3, exp_name=f"det{i}", run_root=run_root) as trainer:
            run_iters(trainer, 40)  # 320 env steps, 4 gradient steps per iteration after 64 steps
            assert trainer.env_step == 320 and trainer.train_iter > 100
            results.append(params(trainer.policy))
    for a, b in zip(*results):
        assert torch.equal(a, b)
    with SerialTrainer(small_cfg(), seed=4, exp_name="det_other", run_root=run_root) as trainer:
        run_iters(trainer, 40)
        other = params(trainer.policy)
    assert any(not torch.equal(a, b) for a, b in zip(results[0], other))


def test_save_then_load_gives_identical_actions(run_root):
    rng = np.random.default_rng(0)
    observations = rng.normal(size=(32, 4)).astype(np.float32)
    with SerialTrainer(small_cfg(), seed=0, exp_name="a", run_root=run_root) as trainer:
        run_iters(trainer, 30)
        path = trainer.save_checkpoint()
        actions = [int(trainer.compute_single_action(o)) for o in observations]
        train_iter, env_step = trainer.train_iter, trainer.env_step
    assert os.path.exists(path)
    state = load_checkpoint(path)  # weights_only=True inside
    assert state["train_iter"] == train_iter and state["env_step"] == env_step
    with SerialTrainer(small_cfg(), seed=1, exp_name="b", run_root=run_root) as fresh:
        before = [int(fresh.compute_single_action(o)) for o in observations]
        fresh.load_checkpoint(path)
        after = [int(fresh.compute_single_action(o)) for o in observations]
        assert fresh.train_iter == train_iter and fresh.env_step == env_step
    assert after == actions
    assert before != actions  # the check could fail: an untrained net acts differently


def test_resume_from_load_ckpt_config(run_root):
    with SerialTrainer(small_cfg(), seed=0, exp_name="first", run_root=run_root) as trainer:
        run_iters(trainer, 20)
        path = trainer.save_checkpoint()
        train_iter, env_step = trainer.train_iter, trainer.env_step
        weights = params(trainer.policy)
    cfg = small_cfg(**{"learner.hook": {"load_ckpt": path}})
    with SerialTrainer(cfg, seed=0, exp_name="resumed", run_root=run_root) as resumed:
        assert resumed.train_iter == train_iter
        assert resumed.env_step == env_step
        for a, b in zip(weights, params(resumed.policy)):
            assert torch.equal(a, b)
        result = resumed.train()
        assert result["env_step"] == env_step + 8
        # the replay buffer starts empty again: learning resumes once it holds a batch (16 samples)
        assert result["train_iter"] == train_iter
        result = resumed.train()
        assert result["train_iter"] == train_iter + 4


def test_resume_with_replay_buffer(run_root):
    with SerialTrainer(small_cfg(), seed=0, exp_name="buf", run_root=run_root) as trainer:
        run_iters(trainer, 10)
        path = trainer.save_checkpoint(with_buffer=True)
        size = len(trainer.buffer)
    assert size == 80 and os.path.exists(path[:-3] + ".replay.npz")
    with SerialTrainer(small_cfg(), seed=0, exp_name="buf2", run_root=run_root) as resumed:
        resumed.load_checkpoint(path, with_buffer=True)
        assert len(resumed.buffer) == size
        train_iter = resumed.train_iter
        assert resumed.train()["train_iter"] == train_iter + 4  # trains at once: the buffer came back


def test_run_directory_contents(run_root):
    with SerialTrainer(small_cfg(), seed=0, exp_name="logs", run_root=run_root) as trainer:
        run_iters(trainer, 60)  # 480 env steps: two evaluations at 200 and 400
        run_dir = trainer.run_dir
    assert os.path.isfile(os.path.join(run_dir, "config.yaml"))
    assert os.path.isfile(os.path.join(run_dir, "ckpt", "final.pt"))
    assert os.path.isfile(os.path.join(run_dir, "ckpt", "best.pt"))
    with open(os.path.join(run_dir, "eval.csv")) as f:
        rows = list(csv.DictReader(f))
    assert [int(r["env_step"]) for r in rows] == [200, 400]
    assert all(float(r["mean_reward"]) > 0 for r in rows)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(run_dir)
    events.Reload()
    tags = set(events.Tags()["scalars"])
    for tag in ("rollout/ep_rew_mean", "train/loss", "time/fps", "eval/mean_reward", "train/learning_rate"):
        assert tag in tags, f"{tag} missing from {sorted(tags)}"
    steps = [e.step for e in events.Scalars("eval/mean_reward")]
    assert steps == [200, 400]  # x-axis is env steps


def test_callbacks_are_called(run_root):
    class Recorder(DefaultCallbacks):
        def __init__(self):
            self.counts = {}

        def _hit(self, name):
            self.counts[name] = self.counts.get(name, 0) + 1

        def on_episode_start(self, trainer, env_id):
            self._hit("start")

        def on_episode_step(self, trainer, env_id, transition):
            self._hit("step")

        def on_episode_end(self, trainer, env_id, episode_return, episode_len):
            self._hit("end")
            assert episode_len > 0 and episode_return == float(episode_len)  # CartPole: +1 per step

        def on_sample_end(self, trainer, samples):
            self._hit("sample")

        def on_learn_on_batch(self, trainer, batch, info):
            self._hit("learn")

        def on_train_result(self, trainer, result):
            self._hit("result")

    rec = Recorder()
    with SerialTrainer(small_cfg(), seed=0, exp_name="cb", run_root=run_root, callbacks=rec) as trainer:
        run_iters(trainer, 20)
        assert rec.counts["step"] == trainer.env_step == 160
        assert rec.counts["learn"] == trainer.train_iter
    assert rec.counts["sample"] == rec.counts["result"] == 20
    assert rec.counts["end"] >= 1 and rec.counts["start"] == rec.counts["end"] + 2


def test_generator_and_step_limit(run_root):
    cfg = small_cfg(max_env_step=96)
    with SerialTrainer(cfg, seed=0, exp_name="gen", run_root=run_root) as trainer:
        results = list(trainer)
    assert results[-1]["stop"] and results[-1]["env_step"] == 96
    assert len(results) == 12
    assert "max_env_step" in trainer.stop_reason


def test_serial_pipeline_returns_the_trained_policy(run_root):
    """The returned policy is the one the run ended with: greedy on its own Q-values, and equal to final.pt."""
    from nervex.entry import load_policy

    policy = serial_pipeline(small_cfg(max_env_step=1000), seed=0, exp_name="pipe", run_root=run_root)
    obs = np.random.default_rng(0).normal(size=(32, 4)).astype(np.float32)
    acted = policy.eval_mode.forward(list(range(32)), dict(enumerate(obs)))
    actions = [int(acted[i]["action"]) for i in range(32)]
    with torch.no_grad():
        greedy = policy.model(torch.from_numpy(obs))["logit"].argmax(-1).tolist()
    assert actions == greedy and len(set(actions)) == 2  # a trained net, not a constant
    final = load_policy(os.path.join(run_root, "pipe", "ckpt", "final.pt"))
    again = final.eval_mode.forward(list(range(32)), dict(enumerate(obs)))
    assert [int(again[i]["action"]) for i in range(32)] == actions


def _env_with_root():
    # the repository first, then whatever PYTHONPATH already held (an install outside site-packages, say)
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))


def test_cli_trains_and_reports(tmp_path):
    env = _env_with_root()
    cmd = [
        sys.executable,
        "-m",
        "nervex",
        "-m",
        "serial",
        "-c",
        os.path.join(ROOT, "app_zoo/classic_control/cartpole/config/cartpole_dqn.yaml"),
        "-s",
        "1",
        "--set",
        "max_env_step=80",
        "--set",
        "policy.learn.learning_starts=40",
        "--exp-name",
        "cli",
        "--run-root",
        str(tmp_path),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "max_env_step 80 reached" in out.stdout
    assert os.path.isfile(tmp_path / "cli" / "config.yaml")
    assert glob.glob(str(tmp_path / "cli" / "events.out.tfevents.*"))


def test_cli_config_error_exit_code(tmp_path):
    env = _env_with_root()
    cmd = [
        sys.executable,
        "-m",
        "nervex",
        "-c",
        os.path.join(ROOT, "app_zoo/classic_control/cartpole/config/cartpole_dqn.yaml"),
        "--set",
        "policy.lern.batch_size=3",
        "--run-root",
        str(tmp_path),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert out.returncode == 2
    assert "unknown key 'policy.lern' in cartpole_dqn.yaml; did you mean 'policy.learn'?" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("manager_type", ["subprocess"])
def test_trainer_with_subprocess_manager(run_root, manager_type):
    cfg = small_cfg(**{"env.manager_type": manager_type})
    with SerialTrainer(cfg, seed=0, exp_name="sub", run_root=run_root) as trainer:
        run_iters(trainer, 10)
        assert trainer.env_step == 80


def test_subprocess_manager_training_is_reproducible(run_root):
    """Workers answer in any order; the manager's env-id order keeps a seeded run identical."""
    runs = []
    for i in range(2):
        cfg = small_cfg(**{"env.manager_type": "subprocess", "env.collector_env_num": 4})
        with SerialTrainer(cfg, seed=3, exp_name=f"subdet{i}", run_root=run_root) as trainer:
            run_iters(trainer, 25)
            runs.append(params(trainer.policy))
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_cli_unknown_gym_id_is_a_clean_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("env:\n  env_type: gym\n  env_id: CartPol-v1\npolicy:\n  policy_type: dqn\n")
    env = _env_with_root()
    cmd = [sys.executable, "-m", "nervex", "-c", str(bad), "--run-root", str(tmp_path / "runs")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert out.returncode == 2
    assert "unknown Gymnasium env id 'CartPol-v1'" in out.stderr and "did you mean 'CartPole-v1'?" in out.stderr
    assert "Traceback" not in out.stderr


def test_prefetching_learner_trains_and_stops_cleanly(run_root):
    import threading

    before = threading.active_count()
    cfg = small_cfg(**{"learner.prefetch": 2})
    with SerialTrainer(cfg, seed=0, exp_name="prefetch", run_root=run_root) as trainer:
        run_iters(trainer, 20)
        assert trainer.env_step == 160 and trainer.train_iter == 4 * (20 - 64 // 8 + 1)
        assert trainer.loop.loader is not None and trainer.loop.loader.delivered >= trainer.train_iter
    assert threading.active_count() == before  # the loader's thread is gone


def test_save_data_writes_offline_dataset(run_root, tmp_path):
    from nervex.data import OfflineDataLoader, OfflineDataset

    data_dir = str(tmp_path / "offline")
    with SerialTrainer(small_cfg(**{"actor.save_data": data_dir}), seed=0, exp_name="save", run_root=run_root) as t:
        run_iters(t, 30)
        episodes = t.actor.episode_count
        finished_steps = sum(t.actor.episode_lens)
    dataset = OfflineDataset(data_dir)  # whole episodes only: the writer gets a trajectory when its episode ends
    assert dataset.num_trajectories == episodes
    assert len(dataset) == finished_steps
    first = dataset.trajectory(0)
    n = len(first["reward"])
    assert bool(first["done"][-1]) and not first["done"][:-1].any()
    np.testing.assert_array_equal(first["obs"][1:], first["next_obs"][:-1])  # consecutive steps chain up
    batch = next(iter(OfflineDataLoader(dataset, batch_size=8, seed=0)))
    assert batch["obs"].shape == (8, 4) and batch["obs"].dtype == torch.float32 and n > 0
