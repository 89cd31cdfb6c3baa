"""The QMIX paper's two-step game: every joint action's payoff, by hand (2A pays 7 whatever; 2B [[0, 1], [1, 8]])."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from nervex.envs import TwoStepGameEnv, check_env, team_value
from nervex.envs.two_step import PAYOFF_2A, PAYOFF_2B

PAYOFFS = {
    # (first-step action of agent 1, second-step joint action): team payoff
    **{(0, joint): 7.0 for joint in itertools.product((0, 1), repeat=2)},
    (1, (0, 0)): 0.0,
    (1, (0, 1)): 1.0,
    (1, (1, 0)): 1.0,
    (1, (1, 1)): 8.0,
}


@pytest.mark.parametrize("branch_joint, payoff", list(PAYOFFS.items()), ids=[str(k) for k in PAYOFFS])
@pytest.mark.parametrize("other_first", [0, 1])
def test_every_joint_action_pays_the_papers_payoff(branch_joint, payoff, other_first):
    branch, joint = branch_joint
    env = TwoStepGameEnv()
    obs = env.reset()
    assert obs["obs"].tolist() == [[1, 0, 0]] * 2 and obs["global_state"].tolist() == [1, 0, 0]
    first = env.step(np.array([branch, other_first]))  # agent 2's first action does not matter
    assert first.reward.tolist() == [0.0, 0.0] and not first.done
    assert first.obs["global_state"].tolist() == ([0, 1, 0] if branch == 0 else [0, 0, 1])
    last = env.step(np.array(joint))
    assert last.reward.tolist() == [payoff, payoff] and last.done
    assert last.info["terminated"] and not last.info["truncated"] and last.info["episode_len"] == 2
    assert team_value(last.info["episode_return"], env.info().team_reward) == payoff  # 'mean': the paper's payoff


def test_constants_and_info():
    assert PAYOFF_2A == 7.0 and PAYOFF_2B.tolist() == [[0, 1], [1, 8]]
    info = TwoStepGameEnv().info()
    assert info.agent_num == 2 and info.act_space.nvec.tolist() == [2, 2] and info.team_reward == "mean"


def test_bad_actions_and_steps_after_the_end_raise():
    env = TwoStepGameEnv()
    env.reset()
    with pytest.raises(ValueError, match="one of 0 or 1 per agent"):
        env.step(np.array([2, 0]))
    env.step(np.array([0, 0]))
    env.step(np.array([0, 0]))
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step(np.array([0, 0]))


def test_check_env_passes():
    check_env(TwoStepGameEnv(), n_steps=20, deterministic=True)
