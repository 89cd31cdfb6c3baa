"""The learn loop, with real parts (CartPole envs, DQN and PPO policies, buffers, learner, evaluator)."""

import csv
import math
import os
from typing import Any, Dict, List

import numpy as np
import pytest
import torch

from nervex.entry import compile_config
from nervex.entry.builder import (
    make_actor,
    make_buffer,
    make_env_managers,
    make_evaluator,
    make_learner,
    make_policy,
)
from nervex.policy import set_seed
from nervex.torch_utils import collate, load_checkpoint
from nervex.worker.learner import EVAL_CSV_FIELDS, FigureMeans, LearnLoop, index_batch

ENV = {"env_type": "cartpole", "manager_type": "base", "collector_env_num": 2, "evaluator_env_num": 2}


def dqn_cfg(**learn: Any) -> Dict[str, Any]:
    return {
        "seed": 0,
        "max_env_step": 100000,
        "env": dict(ENV),
        "policy": {
            "policy_type": "dqn",
            "model": {"hidden_sizes": [16]},
            "nstep": 1,
            "priority": True,
            "learn": {"batch_size": 8, "learning_starts": 0, "update_per_collect": 4, **learn},
            "collect": {"n_sample": 32},
        },
        "replay_buffer": {"maxlen": 1000},
        "learner": {"hook": {"log_show_after_iter": 0, "save_ckpt_after_run": False}},
        "evaluator": {"n_episode": 2, "eval_freq": 100, "stop_val": 10000},
    }


def ppo_cfg(batch_size: int, epochs: int) -> Dict[str, Any]:
    return {
        "seed": 0,
        "max_env_step": 100000,
        "env": dict(ENV),
        "policy": {
            "policy_type": "ppo",
            "model": {"hidden_sizes": [16]},
            "learn": {"epoch_per_collect": epochs, "batch_size": batch_size},
            "collect": {"rollout_len": 20},
        },
        "learner": {"hook": {"log_show_after_iter": 0, "save_ckpt_after_run": False}},
        "evaluator": {"n_episode": 2, "eval_freq": 100, "stop_val": 10000},
    }


class Run:
    """A run's parts and a loop over them; collects real samples with the policy's collect mode."""

    def __init__(self, raw: Dict[str, Any], run_dir: Any, **loop_kwargs: Any) -> None:
        set_seed(0)  # two runs made alike start with the same weights
        self.cfg = cfg = compile_config(raw)
        collector_env, evaluator_env, env_info = make_env_managers(cfg, 0)
        self.policy = make_policy(cfg, env_info)
        self.contract = type(self.policy).contract(self.policy.cfg)
        self.actor = make_actor(cfg, collector_env, self.policy, 0)
        self.evaluator = make_evaluator(cfg, evaluator_env, self.policy)
        self.learner = make_learner(cfg, self.policy, None, None, None)
        self.buffer = make_buffer(cfg, self.contract, 0)
        self.batches: List[Dict[str, Any]] = []
        self.infos: List[Dict[str, Any]] = []
        self.loop = LearnLoop(
            cfg,
            self.policy,
            self.learner,
            self.buffer,
            self.evaluator,
            run_dir=None if run_dir is None else str(run_dir),
            seed=0,
            on_batch=lambda batch, info: (self.batches.append(batch), self.infos.append(info)),
            **loop_kwargs,
        )

    def collect(self) -> List[Dict[str, Any]]:
        setting = self.policy.command_mode.get_setting_collect(self.loop.command_info())
        samples = self.actor.collect(self.contract.collect, setting)
        self.loop.env_step += len(samples)
        return samples

    def close(self) -> None:
        self.loop.close()
        self.actor.close()
        self.evaluator.close()


@pytest.fixture
def runs(tmp_path):
    made: List[Run] = []

    def make(raw: Dict[str, Any], run_dir: Any = "default", **loop_kwargs: Any) -> Run:
        if run_dir == "default":
            run_dir = tmp_path / f"run{len(made)}"
            os.makedirs(run_dir / "ckpt")
        made.append(Run(raw, run_dir, **loop_kwargs))
        return made[-1]

    yield make
    for run in made:
        run.close()


def params(policy: Any) -> List[torch.Tensor]:
    return [p.detach().clone() for p in policy.model.parameters()]


# ---- on-policy ---------------------------------------------------------------------------------------------------
ROLLOUT_CASES = {
    # name: (samples n, batch_size b, epochs e, minibatch sizes of one epoch)
    "b divides n": (40, 10, 2, [10, 10, 10, 10]),
    "a short last minibatch": (40, 15, 3, [15, 15, 10]),
    "one minibatch of the whole rollout": (40, 40, 2, [40]),
    "batch larger than the rollout": (7, 10, 4, [7]),
    "one sample": (1, 10, 2, [1]),
}


@pytest.mark.parametrize("n, b, epochs, sizes", ROLLOUT_CASES.values(), ids=ROLLOUT_CASES.keys())
def test_a_rollout_of_n_samples_makes_epochs_times_ceil_n_over_b_steps(runs, n, b, epochs, sizes):
    run = runs(ppo_cfg(b, epochs), run_dir=None)
    rollout = run.collect()[:n]
    trained = run.loop.train_rollout(rollout)
    assert trained.steps == epochs * math.ceil(n / b) == run.loop.train_iter == len(run.infos)
    assert [len(batch["obs"]) for batch in run.batches] == sizes * epochs
    # each epoch is one pass: every sample once
    whole = collate(rollout)["obs"]
    per_epoch = len(sizes)
    for epoch in range(epochs):
        seen = torch.cat([batch["obs"] for batch in run.batches[epoch * per_epoch : (epoch + 1) * per_epoch]])
        assert sorted(map(tuple, seen.tolist())) == sorted(map(tuple, whole.tolist()))
    means = {k: np.mean([float(info[k]) for info in run.infos]) for k in ("total_loss", "approx_kl")}
    assert trained.figures["total_loss"] == pytest.approx(means["total_loss"])
    assert trained.figures["approx_kl"] == pytest.approx(means["approx_kl"])


@pytest.mark.parametrize("rank", [0, 1])
def test_each_rank_trains_on_its_shard_with_a_share_of_the_batch(runs, rank):
    run = runs(ppo_cfg(10, 1), run_dir=None, rank=rank, world_size=2)
    rollout = run.collect()[:33]  # 32 usable: 16 per rank, minibatches of 10 // 2 = 5
    trained = run.loop.train_rollout(rollout)
    assert trained.steps == 4 and [len(batch["obs"]) for batch in run.batches] == [5, 5, 5, 1]
    shard = collate(rollout[rank:32:2])["obs"]
    seen = torch.cat([batch["obs"] for batch in run.batches])
    assert sorted(map(tuple, seen.tolist())) == sorted(map(tuple, shard.tolist()))


def test_a_rank_outside_the_group_is_refused(runs):
    with pytest.raises(ValueError, match=r"rank must be in \[0, world_size=2\), got 2"):
        runs(ppo_cfg(10, 1), run_dir=None, rank=2, world_size=2)


# ---- off-policy --------------------------------------------------------------------------------------------------
def test_owed_steps_train_on_sampled_batches_and_update_their_priorities(runs):
    run = runs(dqn_cfg(), run_dir=None)
    samples = run.collect()
    run.loop.store(samples)
    initial = run.buffer.priority(np.arange(len(samples)))
    assert np.all(initial == initial[0])  # new samples all get the current maximum
    trained = run.loop.train_off_policy(5)
    assert trained.steps == 5 == run.loop.train_iter == len(run.batches)
    assert trained.figures["total_loss"] == pytest.approx(np.mean([i["total_loss"] for i in run.infos]))
    # the last batch's priorities are its |TD errors| (through the buffer's monotone transform), in the same order
    last_uid = run.batches[-1]["unique_id"].numpy()
    stored = run.buffer.priority(last_uid)
    td = np.asarray(run.infos[-1]["priority"], dtype=np.float64)
    assert len(set(td.tolist())) > 1 and not np.any(stored == initial[0])
    assert np.array_equal(np.argsort(stored, kind="stable"), np.argsort(td, kind="stable"))


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_each_rank_samples_its_share_of_an_off_policy_batch(runs, world_size):
    """One gradient step consumes ``batch_size`` samples whatever the ranks (each samples ``batch_size // N``, the
    gradients are averaged): the serial replay ratio, and the rate limiter's ``sampled``, count the same samples."""
    run = runs(dqn_cfg(), run_dir=None, rank=0, world_size=world_size)
    run.loop.store(run.collect())
    assert run.loop.train_off_policy(3).steps == 3
    assert [len(batch["obs"]) for batch in run.batches] == [8 // world_size] * 3


def test_owed_steps_equal_a_hand_written_sample_train_update_loop(runs):
    """The loop's off-policy phase is exactly: sample, train, update priorities, ``steps`` times."""
    run, ref = runs(dqn_cfg(), run_dir=None), runs(dqn_cfg(), run_dir=None)
    samples = run.collect()
    ref.loop.env_step = run.loop.env_step
    run.loop.store(samples)
    ref.buffer.extend(samples, learner_iter=0)
    run.loop.train_off_policy(6)
    setting = ref.policy.command_mode.get_setting_learn(ref.loop.command_info())
    for _ in range(6):
        batch = ref.buffer.sample(8, learner_iter=ref.learner.last_iter)
        info = ref.learner.train(batch, ref.loop.env_step, setting)
        ref.buffer.update(info["priority"], unique_id=batch["unique_id"])
    for a, b in zip(params(run.policy), params(ref.policy)):
        assert torch.equal(a, b)
    uid = np.arange(len(samples))
    np.testing.assert_array_equal(run.buffer.priority(uid), ref.buffer.priority(uid))


OWED_CASES = {
    # name: (samples stored, steps asked, steps taken)
    "all owed steps": (32, 3, 3),
    "nothing owed": (32, 0, 0),
    "fewer samples than a batch": (5, 4, 0),
    "exactly one batch": (8, 2, 2),
}


@pytest.mark.parametrize("stored, asked, taken", OWED_CASES.values(), ids=OWED_CASES.keys())
def test_owed_steps_are_taken_only_when_the_buffer_holds_a_batch(runs, stored, asked, taken):
    run = runs(dqn_cfg(), run_dir=None)
    run.loop.store(run.collect()[:stored])
    assert run.loop.train_off_policy(asked).steps == taken == run.loop.train_iter


def test_storing_on_policy_is_refused_naming_the_remedy(runs):
    run = runs(ppo_cfg(10, 1), run_dir=None)
    with pytest.raises(RuntimeError, match="on-policy and has no replay buffer; use train_rollout"):
        run.loop.store(run.collect())


# ---- evaluation --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("stop_val, stops", [(5.0, True), (10000.0, False)], ids=["reached", "not reached"])
def test_evaluation_writes_a_csv_row_and_best_pt_and_stops_at_stop_val(runs, tmp_path, stop_val, stops):
    raw = dqn_cfg()
    raw["evaluator"]["stop_val"] = stop_val
    run = runs(raw)
    run.loop.store(run.collect())
    run.loop.train_off_policy(3)
    run.collect()
    run.collect()
    assert not run.loop.eval_due()  # 96 env steps < eval_freq 100
    run.collect()
    assert run.loop.eval_due()
    figures = run.loop.evaluate()
    assert not run.loop.eval_due()
    with open(os.path.join(run.loop.run_dir, "eval.csv")) as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == EVAL_CSV_FIELDS and len(rows) == 1
    assert (int(rows[0]["env_step"]), int(rows[0]["train_iter"])) == (128, 3)
    assert float(rows[0]["mean_reward"]) == pytest.approx(figures["eval/mean_reward"])
    assert figures["eval/mean_reward"] >= 8  # a CartPole episode lasts at least 8 steps
    assert run.loop.scalar_writer.latest["eval/mean_reward"] == figures["eval/mean_reward"]
    best = load_checkpoint(os.path.join(run.loop.run_dir, "ckpt", "best.pt"))
    assert (best["train_iter"], best["env_step"]) == (3, 128)  # the first evaluation is the best so far
    assert run.loop.stopped is stops
    if stops:
        mean = figures["eval/mean_reward"]
        assert run.loop.stop_reason == f"evaluation mean {mean:.2f} >= stop_val 5.0"


def test_a_loop_without_run_dir_evaluates_and_writes_no_file(runs, tmp_path):
    run = runs(dqn_cfg(), run_dir=None)
    run.loop.env_step = 100
    assert run.loop.evaluate()["eval/n_episode"] >= 2
    assert run.loop.eval_csv is None and not list(tmp_path.rglob("*.pt")) and not list(tmp_path.rglob("*.csv"))


# ---- limits ------------------------------------------------------------------------------------------------------
LIMIT_CASES = {
    # name: (env_step, train_iter, stopped, reason)
    "below both": (99, 9, False, ""),
    "env steps reached": (100, 0, True, "max_env_step 100 reached"),
    "train iterations reached": (50, 10, True, "max_train_iter 10 reached"),
    "both reached: env steps named": (150, 12, True, "max_env_step 100 reached"),
}


@pytest.mark.parametrize("env_step, train_iter, stopped, reason", LIMIT_CASES.values(), ids=LIMIT_CASES.keys())
def test_limits_stop_the_run_with_their_reason(runs, env_step, train_iter, stopped, reason):
    raw = dict(dqn_cfg(), max_env_step=100, max_train_iter=10)
    run = runs(raw, run_dir=None)
    run.loop.env_step, run.learner.last_iter = env_step, train_iter
    assert run.loop.check_limits() is stopped
    assert (run.loop.stopped, run.loop.stop_reason) == (stopped, reason)


def test_the_first_stop_reason_is_kept(runs):
    run = runs(dict(dqn_cfg(), max_env_step=100), run_dir=None)
    run.loop.stop("evaluation mean 200.00 >= stop_val 195")
    run.loop.env_step = 500
    assert run.loop.check_limits() is True
    assert run.loop.stop_reason == "evaluation mean 200.00 >= stop_val 195"


def test_command_info_is_the_runs_progress(runs):
    run = runs(dict(dqn_cfg(), max_env_step=100, max_train_iter=10), run_dir=None)
    run.loop.env_step, run.learner.last_iter = 42, 7
    assert run.loop.command_info() == dict(
        env_step=42, train_iter=7, learner_step=7, max_env_step=100, max_train_iter=10
    )


# ---- scalars -----------------------------------------------------------------------------------------------------
def test_scalars_average_the_train_figures_since_the_last_write(runs):
    run = runs(dqn_cfg(), run_dir=None)
    run.loop.store(run.collect())
    run.loop.train_off_policy(2)
    assert run.loop.write_scalars({"rollout/ep_rew_mean": 12.5, "no_slash": 1.0}) is False  # 32 < 1000 env steps
    run.loop.train_off_policy(3)
    run.loop.env_step = 1000
    assert run.loop.write_scalars({"rollout/ep_rew_mean": 12.5, "no_slash": 1.0}) is True
    latest = run.loop.scalar_writer.latest
    assert latest["train/loss"] == pytest.approx(np.mean([i["total_loss"] for i in run.infos]))  # all 5 steps
    assert latest["train/q_value"] == pytest.approx(np.mean([i["q_value"] for i in run.infos]))
    assert latest["train/train_iter"] == 5.0 and latest["rollout/ep_rew_mean"] == 12.5
    assert "no_slash" not in latest and latest["buffer/size"] == 32.0
    assert latest["time/fps"] > 0
    run.loop.train_off_policy(1)
    run.loop.stop("test")  # a stop writes at once
    assert run.loop.write_scalars() is True
    assert latest["train/loss"] == pytest.approx(run.infos[-1]["total_loss"])  # only the step since


def test_state_round_trip_keeps_progress(runs):
    run = runs(dqn_cfg(), run_dir=None)
    run.loop.store(run.collect())
    run.loop.train_off_policy(4)
    state = run.loop.state_dict()
    assert (state["train_iter"], state["env_step"]) == (4, 32)
    other = runs(dqn_cfg(), run_dir=None)
    other.loop.load_state_dict(state)
    assert (other.loop.train_iter, other.loop.env_step) == (4, 32)
    assert other.loop.time_figures()["time/fps"] == 0.0  # frames per second count from the resumed step
    for a, b in zip(params(run.policy), params(other.policy)):
        assert torch.equal(a, b)


# ---- helpers -----------------------------------------------------------------------------------------------------
def test_figure_means_count_numbers_and_scalar_tensors_only():
    means = FigureMeans()
    means.add({"loss": 1.0, "kl": torch.tensor(0.5), "flag": True, "priority": torch.ones(4), "name": "x"})
    means.add({"loss": 3, "kl": torch.tensor(1.5)})
    assert means.steps == 2 and means.means() == {"loss": 2.0, "kl": 1.0}
    assert means.take() == {"loss": 2.0, "kl": 1.0} and means.means() == {} and means.steps == 0


def test_index_batch_takes_rows_of_nested_tensors_and_passes_the_rest():
    batch = {"obs": torch.arange(12).reshape(6, 2), "nested": {"r": torch.arange(6.0)}, "meta": "keep"}
    out = index_batch(batch, torch.tensor([4, 1]))
    assert out["obs"].tolist() == [[8, 9], [2, 3]] and out["nested"]["r"].tolist() == [4.0, 1.0]
    assert out["meta"] == "keep"
