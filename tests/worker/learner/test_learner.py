"""BaseLearner and its hooks, on a tiny fake learn mode (the learner is policy-agnostic)."""

import os

import pytest
import torch

from nervex.policy.base_policy import LearnMode
from nervex.torch_utils import load_checkpoint
from nervex.worker.learner import BaseLearner, LearnerHook, LrDecayHook


class TinyPolicy:
    """A learn mode with one parameter and a real optimizer, so checkpoints and lr decay act on real state."""

    def __init__(self, lr=1.0):
        self.w = torch.nn.Parameter(torch.zeros(1))
        self._optimizer = torch.optim.SGD([self.w], lr=lr)

    def forward(self, data):
        loss = ((self.w - data["target"]) ** 2).sum()
        self._optimizer.zero_grad()
        loss.backward()
        self._optimizer.step()
        return {"total_loss": loss.item(), "cur_lr": self._optimizer.param_groups[0]["lr"]}

    def state_dict(self):
        return {"w": self.w.detach().clone(), "optimizer": self._optimizer.state_dict()}

    def load_state_dict(self, sd):
        with torch.no_grad():
            self.w.copy_(sd["w"])
        self._optimizer.load_state_dict(sd["optimizer"])

    def mode(self):
        return LearnMode(self.forward, self.state_dict, self.load_state_dict, lambda: {"optimizer": self._optimizer})


def make(tmp_path, **hook):
    cfg = {"hook": dict(log_show_after_iter=0, **hook)}
    policy = TinyPolicy(lr=0.25)
    return policy, BaseLearner(cfg, policy.mode(), run_dir=str(tmp_path))


def test_train_counts_and_returns_info(tmp_path):
    policy, learner = make(tmp_path)
    info = learner.train({"target": torch.ones(1)}, env_step=10)
    # w: 0 -> 0 - 0.25 * 2 * (0 - 1) = 0.5
    assert info["total_loss"] == 1.0
    assert policy.w.item() == 0.5
    assert learner.last_iter == 1 and learner.env_step == 10


def test_save_every_n_and_final(tmp_path):
    _, learner = make(tmp_path, save_ckpt_after_iter=2)
    for _ in range(5):
        learner.train({"target": torch.ones(1)})
    learner.call_hook("after_run")
    files = sorted(os.listdir(tmp_path / "ckpt"))
    assert files == ["final.pt", "iteration_2.pt", "iteration_4.pt"]
    state = load_checkpoint(str(tmp_path / "ckpt" / "iteration_4.pt"))
    assert state["train_iter"] == 4 and state["version"] == 2


def test_load_ckpt_hook_resumes(tmp_path):
    policy, learner = make(tmp_path)
    learner.train({"target": torch.ones(1)}, env_step=33)
    path = learner.save_checkpoint(str(tmp_path / "x.pt"))
    policy2, learner2 = make(tmp_path / "other", load_ckpt=path)
    learner2.call_hook("before_run")
    assert learner2.last_iter == 1 and learner2.env_step == 33
    assert policy2.w.item() == 0.5


def test_checkpoint_version_is_checked(tmp_path):
    _, learner = make(tmp_path)
    state = learner.state_dict()
    state["version"] = 99
    with pytest.raises(ValueError, match="version 99"):
        learner.load_state_dict(state)


def test_hooks_run_in_priority_order(tmp_path):
    _, learner = make(tmp_path)
    order = []

    class Rec(LearnerHook):
        def __call__(self, lrn):
            order.append(self.name)

    learner.register_hook(Rec("late", "after_iter", priority=90))
    learner.register_hook(Rec("early", "after_iter", priority=10))
    learner.train({"target": torch.ones(1)})
    assert order == ["early", "late"]
    with pytest.raises(ValueError, match="unknown position 'after_everything'"):
        Rec("x", "after_everything")


@pytest.mark.parametrize(
    "kind,it,expected",
    [
        ("linear", 0, 1.0),
        ("linear", 50, 1.0 + (0.1 - 1.0) * 0.5),  # halfway: 0.55
        ("linear", 100, 0.1),
        ("linear", 500, 0.1),  # stays at the end value
        ("cosine", 0, 1.0),
        ("cosine", 50, 0.1 + 0.9 * 0.5),  # cos(pi/2) = 0 -> midpoint 0.55
        ("cosine", 100, 0.1),
    ],
)
def test_lr_decay_factor(kind, it, expected):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2.0)
    hook = LrDecayHook([opt], kind, end_factor=0.1, total_iter=100)
    assert hook.factor(it) == pytest.approx(expected)


def test_lr_decay_via_config_moves_optimizer_lr(tmp_path):
    cfg = {"hook": dict(log_show_after_iter=0), "lr_decay": dict(type="linear", end_factor=0.5, total_iter=4)}
    policy = TinyPolicy(lr=1.0)
    learner = BaseLearner(cfg, policy.mode(), run_dir=str(tmp_path))
    for _ in range(2):
        learner.train({"target": torch.ones(1)})
    assert policy._optimizer.param_groups[0]["lr"] == pytest.approx(0.75)  # 1 + (0.5 - 1) * 2/4


def test_lr_decay_acts_on_every_optimizer_of_the_learn_mode(tmp_path):
    actor_w, critic_w = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    optimizers = {"actor": torch.optim.SGD([actor_w], lr=1.0), "critic": torch.optim.SGD([critic_w], lr=0.1)}

    def forward(data):
        return {"total_loss": 0.0}

    mode = LearnMode(forward, lambda: {}, lambda state: None, lambda: optimizers)
    cfg = {"hook": dict(log_show_after_iter=0), "lr_decay": dict(type="linear", end_factor=0.5, total_iter=4)}
    learner = BaseLearner(cfg, mode, run_dir=str(tmp_path))
    for _ in range(4):
        learner.train({})
    assert optimizers["actor"].param_groups[0]["lr"] == pytest.approx(0.5)
    assert optimizers["critic"].param_groups[0]["lr"] == pytest.approx(0.05)


def test_learner_section_is_validated_by_the_learner():
    mode = LearnMode(lambda data: {}, lambda: {}, lambda state: None, lambda: {})
    with pytest.raises(
        ValueError, match=r"unknown key 'learner.hook.log_show_after'.*did you mean 'learner.hook.log_show_after_iter'"
    ):
        BaseLearner({"hook": {"log_show_after": 5}}, mode)
    with pytest.raises(ValueError, match=r"key 'learner.lr_decay.type' must be one of 'none', 'linear', 'cosine'"):
        BaseLearner({"lr_decay": {"type": "exp"}}, mode)
