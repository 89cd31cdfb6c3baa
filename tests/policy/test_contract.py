"""The policy contract: declared defaults and contract, portable state, settings, batching, optimizers."""

import warnings

import numpy as np
import pytest
import torch

from nervex.agent import Agent
from nervex.config import ConfigError
from nervex.policy import A2CPolicy, CollectSpec, CommonPolicy, DQNPolicy, LearnSpec, Policy, PPOPolicy
from nervex.torch_utils import CheckpointError, load_checkpoint, save_checkpoint

OBS = torch.tensor(np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32))


def dqn(**cfg):
    return DQNPolicy({"policy_type": "dqn", "model": {"obs_dim": 4, "action_dim": 2}, **cfg}, **{})


def actions(mode, obs=OBS, **setting):
    data = {i: o.numpy() for i, o in enumerate(obs)}
    out = mode.forward(list(data), data, **setting)
    return np.stack([out[i]["action"] for i in data])


# ---- the contract -----------------------------------------------------------------------------------------------
def test_contract_of_each_policy_from_its_config():
    c = DQNPolicy.contract(DQNPolicy.compile_section({"policy_type": "dqn"}))
    assert (c.on_policy, c.buffer_type, c.collect) == (False, "prioritized", CollectSpec("sample", 8))
    assert c.learn == LearnSpec(batch_size=64, update_per_collect=1, learning_starts=1000, random_warmup=False)
    c = DQNPolicy.contract(
        DQNPolicy.compile_section({"policy_type": "dqn", "priority": False, "collect": {"n_episode": 2}})
    )
    assert c.buffer_type == "uniform" and c.collect == CollectSpec("episode", 2)
    c = PPOPolicy.contract(PPOPolicy.compile_section({"policy_type": "ppo", "collect": {"rollout_len": 32}}))
    assert (c.on_policy, c.buffer_type, c.collect) == (True, None, CollectSpec("rollout", 32))
    assert (c.learn.epoch_per_collect, c.learn.batch_size) == (10, 64)
    assert c.train_iter_per_collect(8 * 32) == 10 * 4  # epochs x minibatches: train_iter counts gradient steps
    c = A2CPolicy.contract(A2CPolicy.compile_section({"policy_type": "a2c"}))
    assert c.collect == CollectSpec("rollout", 5) and c.learn.batch_size is None and c.train_iter_per_collect(40) == 1
    c = PPOPolicy.contract(PPOPolicy.compile_section({"policy_type": "ppo", "collect": {"n_episode": 4}}))
    assert c.collect == CollectSpec("episode", 4, restart_envs=True)


def test_a_subclass_default_keeps_the_base_range():
    with pytest.raises(ConfigError, match=r"key 'policy.learn.epoch_per_collect' must be >= 1, got 0"):
        PPOPolicy.compile_section({"policy_type": "ppo", "learn": {"epoch_per_collect": 0}})
    with pytest.raises(ConfigError, match=r"key 'policy.gae_lambda' must be >= 0 and <= 1, got 1.5"):
        A2CPolicy.compile_section({"policy_type": "a2c", "gae_lambda": 1.5})


def test_a_policy_built_directly_validates_its_section():
    with pytest.raises(
        ConfigError, match=r"unknown key 'policy.learn.learnin_rate'; did you mean 'policy.learn.learning_rate'"
    ):
        dqn(learn={"learnin_rate": 0.1})
    with pytest.raises(ConfigError, match=r"key 'policy.learn.learning_rate' must be > 0, got -0.001"):
        dqn(learn={"learning_rate": -1e-3})


# ---- portable state ---------------------------------------------------------------------------------------------
def test_learner_snapshot_loads_into_collect_only_and_eval_only_dqn(tmp_path):
    learner = dqn()
    batch = {
        "obs": OBS[:8],
        "next_obs": OBS[8:],
        "action": torch.randint(2, (8,)),
        "reward": torch.ones(8, 1),
        "terminated": torch.zeros(8, dtype=torch.bool),
    }
    for _ in range(5):
        learner.learn_mode.forward(dict(batch))
    path = tmp_path / "snap.pt"
    save_checkpoint({"policy": learner.learn_mode.state_dict()}, path)
    state = load_checkpoint(path)["policy"]  # weights_only=True
    assert set(state) == {"model", "extra", "learn"} and set(state["learn"]) == {"agents", "optimizers"}
    collector = DQNPolicy(learner.cfg, enable_field=["collect"])
    evaluator = DQNPolicy(learner.cfg, enable_field=["eval"])
    collector.collect_mode.load_state_dict(state)
    evaluator.eval_mode.load_state_dict(state)
    greedy = actions(learner.eval_mode)
    assert np.array_equal(actions(collector.collect_mode, eps=0.0), greedy)
    assert np.array_equal(actions(evaluator.eval_mode), greedy)
    assert not np.array_equal(actions(DQNPolicy(learner.cfg, enable_field=["eval"]).eval_mode), greedy)
    assert "learn" not in collector.state_dict()  # a collect-only policy has no learn state to give
    with pytest.raises(RuntimeError, match="built without its 'learn' mode"):
        _ = collector.learn_mode


def test_learn_state_roundtrip_keeps_target_and_optimizer():
    a = dqn(learn={"target_update_freq": 3})
    batch = {
        "obs": OBS[:8],
        "next_obs": OBS[8:],
        "action": torch.zeros(8, dtype=torch.long),
        "reward": torch.ones(8, 1),
        "terminated": torch.zeros(8, dtype=torch.bool),
    }
    for _ in range(4):
        a.learn_mode.forward(dict(batch))
    b = dqn(learn={"target_update_freq": 3})
    b.learn_mode.load_state_dict(a.learn_mode.state_dict())
    for policy in (a, b):
        policy.learn_mode.forward(dict(batch))
    for pa, pb in zip(a._learn_agent.get_model("target").parameters(), b._learn_agent.get_model("target").parameters()):
        assert torch.equal(pa, pb)
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(pa, pb)  # same optimizer moments, same step


def test_ppo_snapshot_carries_observation_normalization():
    cfg = {
        "policy_type": "ppo",
        "model": {"obs_dim": 4, "action_dim": 2, "action_space": "continuous"},
        "normalize": {"obs": True},
    }
    learner = PPOPolicy(cfg)
    for _ in range(3):  # the collect mode updates the running statistics
        actions(learner.collect_mode, OBS * 5 + 3)
    state = learner.learn_mode.state_dict()
    assert state["extra"]["obs_rms"]["count"] > 40
    evaluator = PPOPolicy(cfg, enable_field=["eval"])
    evaluator.eval_mode.load_state_dict(state)
    np.testing.assert_array_equal(actions(evaluator.eval_mode), actions(learner.eval_mode))
    fresh = PPOPolicy(cfg, enable_field=["eval"])  # same weights only would not do: the statistics matter
    fresh.model.load_state_dict(learner.model.state_dict())
    assert not np.allclose(actions(fresh.eval_mode), actions(learner.eval_mode))


def test_loading_something_that_is_not_a_policy_state_says_so(tmp_path):
    with pytest.raises(ValueError, match=r"needs a policy state with 'model'; got \['weights'\]"):
        dqn().eval_mode.load_state_dict({"weights": {}})
    path = tmp_path / "ckpt.pt"
    save_checkpoint({"policy": dqn().state_dict()}, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path)
    message = str(err.value)
    assert "ckpt.pt" in message and "truncated or corrupted" in message and "\n" not in message


# ---- settings and batching -------------------------------------------------------------------------------------
class SettingProbe(CommonPolicy):
    """Records what reaches its collect forward: the batch shape, attribute settings and keyword settings."""

    config = dict(model={"obs_dim": 4, "action_dim": 2})
    default_model_type = "fc_discrete_net"

    def _init_learn(self):
        pass

    def _forward_learn(self, data):
        return {}

    def _init_collect(self):
        self._collect_setting_set = {"temperature"}
        self.seen = []

    def _forward_collect(self, data_id, data, eps=None):
        self.seen.append((tuple(data.shape), self._temperature, eps))
        return {
            "action": torch.zeros(data.shape[0], dtype=torch.long),
            "logit": torch.arange(data.shape[0] * 2.0).view(-1, 2),
        }

    def _get_train_sample(self, traj):
        return list(traj)

    def _init_eval(self):
        pass

    def _forward_eval(self, data_id, data):
        return {"action": torch.zeros(data.shape[0])}


def test_settings_reach_a_mode_as_attributes_or_keywords_and_outputs_are_split_per_env():
    probe = SettingProbe({"policy_type": "probe"})
    data = {3: OBS[0].numpy(), 7: OBS[1].numpy()}
    out = probe.collect_mode.forward([3, 7], data, temperature=0.5, eps=0.1)
    assert probe.seen == [((2, 4), 0.5, 0.1)]  # one batched call; temperature set as self._temperature
    assert set(out) == {3, 7} and out[7]["logit"].tolist() == [2.0, 3.0]
    with pytest.raises(TypeError, match=r"setting\(s\) \['beta'\] .* neither listed in _collect_setting_set nor"):
        probe.collect_mode.forward([3], {3: OBS[0].numpy()}, beta=1.0)


def test_every_optimizer_and_learn_agent_is_found():
    class TwoOptimizers(SettingProbe):
        def _init_learn(self):
            self._actor_optimizer = torch.optim.SGD(self._model.parameters(), lr=0.1)
            self._critic_optimizer = torch.optim.Adam(self._model.parameters(), lr=0.01)
            self._agent = Agent(self._model)
            self._agent.add_model("target", update_type="momentum", update_kwargs={"theta": 0.1})

    policy = TwoOptimizers({"policy_type": "two"})
    assert sorted(policy.learn_mode.optimizers()) == ["actor_optimizer", "critic_optimizer"]
    assert set(policy.learn_mode.state_dict()["learn"]["agents"]) == {"agent"}


# ---- policies that declare nothing (nerveX style) ---------------------------------------------------------------
class Undeclared(SettingProbe):
    config = Policy.config


def test_a_policy_without_config_is_accepted_with_a_warning_and_its_contract_keys_still_checked():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        section = Undeclared.compile_section({"policy_type": "u", "learn": {"algo": {"nstep": 3}}, "on_policy": True})
    assert any("declares no `config` defaults" in str(w.message) and "config = dict(" in str(w.message) for w in caught)
    assert section.learn.algo.nstep == 3 and section.on_policy is True
    assert Undeclared.contract(section).collect == CollectSpec("rollout", 128)  # on_policy read from the YAML
    with pytest.raises(ConfigError, match=r"key 'policy.learn.epoch_per_collect' must be >= 1"):
        Undeclared.compile_section({"policy_type": "u", "on_policy": True, "learn": {"epoch_per_collect": -1}})


def test_a_policy_without_a_default_model_says_how_to_name_one():
    class NoModel(SettingProbe):
        default_model_type = None

    with pytest.raises(
        ValueError, match=r"NoModel has no default model: set policy.model_type to one of .*fc_discrete_net"
    ):
        NoModel({"policy_type": "nomodel"})
    built = NoModel({"policy_type": "nomodel", "model_type": "fc_discrete_net"})
    assert type(built.model).__name__ == "FCDiscreteNet"


def test_on_policy_rollout_cut_mid_episode_needs_the_actors_bootstrap():
    policy = PPOPolicy({"policy_type": "ppo", "model": {"obs_dim": 4, "action_dim": 2}})
    adder = policy.collect_mode.adder
    assert adder is policy.collect_mode.adder  # one Adder per policy: it owns the trajectories
    assert adder.add(0, {"done": False, "terminated": False, "truncated": False, "value": 0.0, "reward": 1.0}) == []
    with pytest.raises(RuntimeError, match="env 0's trajectory ends mid-episode without 'next_value'"):
        adder.flush(0)


def test_a_policy_with_neither_a_streaming_adder_nor_get_train_sample_is_told_what_to_write():
    class NoAdder(SettingProbe):
        _get_train_sample = Policy._get_train_sample

    with pytest.raises(TypeError, match=r"NoAdder: _init_collect must set self._adder = Adder\(kind=...\)"):
        _ = NoAdder({"policy_type": "noadder"}).collect_mode
