"""Matrix games as two-move turn-based envs: payoffs of hand-picked joint actions, outcomes, masks, user payoffs."""

from __future__ import annotations

import numpy as np
import pytest

from nervex.envs import MATRIX_GAMES, MatrixGameEnv, check_env, create_env, encode_matrix
from nervex.envs.matrix_game import MAX_ACTIONS


def play(env: MatrixGameEnv, row: int, column: int):
    env.reset()
    first = env.step(row)
    return first, env.step(column)


@pytest.mark.parametrize(
    "game, row, column, reward, outcome",
    [
        ("rps", 0, 1, [-1, 1], [-1, 1]),  # rock loses to paper
        ("rps", 0, 2, [1, -1], [1, -1]),  # rock beats scissors
        ("rps", 2, 1, [1, -1], [1, -1]),  # scissors beat paper
        ("rps", 1, 1, [0, 0], [0, 0]),
        ("zero_sum_2x2", 0, 0, [3, -3], [1, -1]),
        ("zero_sum_2x2", 0, 1, [-2, 2], [-1, 1]),
        ("zero_sum_2x2", 1, 0, [-2, 2], [-1, 1]),
        ("zero_sum_2x2", 1, 1, [1, -1], [1, -1]),
        ("prisoners_dilemma", 0, 0, [3, 3], [0, 0]),  # both cooperate
        ("prisoners_dilemma", 0, 1, [0, 5], [-1, 1]),  # the sucker's payoff
        ("prisoners_dilemma", 1, 0, [5, 0], [1, -1]),
        ("prisoners_dilemma", 1, 1, [1, 1], [0, 0]),  # the equilibrium: a draw, though both lose 2 vs cooperating
    ],
)
def test_joint_actions_pay_the_games_matrix(game, row, column, reward, outcome):
    first, last = play(create_env({"env_type": "matrix_game", "game": game}), row, column)
    assert not first.done and first.reward.tolist() == [0.0, 0.0] and "episode_return" not in first.info
    assert last.done and last.info["terminated"] and not last.info["truncated"]
    assert last.reward.dtype == np.float64 and last.reward.tolist() == reward
    assert last.info["episode_return"].tolist() == reward and last.info["episode_len"] == 2
    assert last.info["outcome"].dtype == np.int64 and last.info["outcome"].tolist() == outcome
    assert last.info["joint_action"] == (row, column)


def test_the_2x2_game_has_the_di_engine_nash_and_value():
    row_payoff = MATRIX_GAMES["zero_sum_2x2"][..., 0]
    nash = np.array([0.375, 0.625])
    # at the equilibrium each seat's mixture leaves the other indifferent between its actions, at value -1/8
    np.testing.assert_allclose(nash @ row_payoff, [-0.125, -0.125])
    np.testing.assert_allclose(row_payoff @ nash, [-0.125, -0.125])
    np.testing.assert_array_equal(MATRIX_GAMES["zero_sum_2x2"][..., 1], -row_payoff)
    pd = MATRIX_GAMES["prisoners_dilemma"]
    np.testing.assert_array_equal(pd[..., 1], pd[..., 0].T)


def test_seat_one_sees_nothing_of_seat_zeros_choice():
    env = create_env({"env_type": "matrix_game", "game": "rps"})
    seen = []
    for row in range(3):
        env.reset()
        obs = env.step(row).obs
        seen.append((obs["obs"].tolist(), obs["action_mask"].tolist(), int(obs["to_play"])))
    assert seen == [([0.0, 1.0], [1, 1, 1], 1)] * 3


def test_observations_are_the_public_encoder():
    env = create_env({"env_type": "matrix_game", "payoff": [[1, 2], [3, 4], [5, 6]]})
    for seat, obs in enumerate((env.reset(), env.step(2).obs)):
        want_obs, want_mask = encode_matrix(seat, (3, 2))
        assert obs["obs"].dtype == np.float32 and obs["obs"].tolist() == want_obs.tolist()
        assert obs["action_mask"].dtype == np.int8 and obs["action_mask"].tolist() == want_mask.tolist()
        assert obs["to_play"] == np.int64(seat) and isinstance(obs["to_play"], np.int64)
    assert encode_matrix(1, (3, 2))[1].tolist() == [1, 1, 0]  # seat 1 has 2 actions, padded to 3
    assert encode_matrix(0, 4)[1].tolist() == [1, 1, 1, 1]
    last = env.step(1)
    assert last.obs["action_mask"].tolist() == [0, 0, 0] and int(last.obs["to_play"]) == 0  # the game is over


def test_a_zero_sum_user_payoff_gives_the_column_player_the_negative():
    env = MatrixGameEnv({"payoff": [[1, 2], [3, 4], [5, 6]]})
    info = env.info()
    assert info.act_space.n == 3 and info.obs_space["action_mask"].shape == (3,) and info.turn_based
    assert info.agent_ids == ("player_0", "player_1") and info.rew_space.shape == (2,)
    assert play(env, 2, 1)[1].reward.tolist() == [6.0, -6.0]
    env.reset()
    env.step(2)
    with pytest.raises(ValueError, match=r"illegal action 2 for seat player_1 \(move 1\); legal: \[0, 1\]"):
        env.step(2)  # the padding: seat 1 has only two columns
    assert env.step(np.int64(0)).reward.tolist() == [5.0, -5.0]  # the refused move changed nothing


def test_a_general_sum_user_payoff_is_used_as_given():
    payoff = [[[2, 1], [0, 0]], [[0, 0], [1, 2]]]  # battle of the sexes
    first, last = play(MatrixGameEnv({"payoff": payoff}), 1, 1)
    assert last.reward.tolist() == [1.0, 2.0] and last.info["outcome"].tolist() == [-1, 1]


@pytest.mark.parametrize(
    "payoff, message",
    [
        ([[1, 2], [3]], r"'payoff' has rows of different lengths; expected \(A0, A1, 2\)"),
        ([["a", "b"]], r"'payoff' must hold numbers only, got <U1 entries"),
        ([[True, False]], r"'payoff' must hold numbers only, got bool"),
        ([[[1, 2, 3]]], r"'payoff' has shape \(1, 1, 3\); expected \(A0, A1, 2\) .* or \(A0, A1\)"),
        ([1, 2, 3], r"'payoff' has shape \(3,\); expected \(A0, A1, 2\)"),
        ([[]], r"'payoff' has shape \(1, 0\); expected"),
        ([[1.0, float("inf")]], r"'payoff' must hold finite numbers within \+-1e\+09"),
        ([[1e12]], r"'payoff' must hold finite numbers within"),
        ([[0.0] * (MAX_ACTIONS + 1)], r"at most 1024 actions per seat"),
    ],
    ids=["ragged", "strings", "bools", "depth_3", "flat", "empty", "inf", "huge", "too_many_actions"],
)
def test_a_malformed_user_payoff_is_a_clear_error(payoff, message):
    with pytest.raises(ValueError, match=message):
        MatrixGameEnv({"payoff": payoff})


def test_game_and_payoff_are_exclusive_and_names_are_checked():
    with pytest.raises(ValueError, match=r"exactly one of the config keys 'game' .* and 'payoff'"):
        MatrixGameEnv({})
    with pytest.raises(ValueError, match=r"got game='rps' and payoff=a matrix"):
        MatrixGameEnv({"game": "rps", "payoff": [[1]]})
    with pytest.raises(KeyError, match=r"'rsp'; did you mean 'rps'\?"):
        MatrixGameEnv({"game": "rsp"})
    with pytest.raises(KeyError, match=r"unknown MatrixGameEnv config key 'paypff'; .*did you mean 'payoff'"):
        MatrixGameEnv({"paypff": [[1]]})


def test_step_before_reset_and_after_the_end_is_an_error():
    env = MatrixGameEnv({"game": "rps"})
    with pytest.raises(RuntimeError, match=r"step\(\) before reset\(\)"):
        env.step(0)
    play(env, 0, 0)
    with pytest.raises(RuntimeError, match=r"step\(\) before reset\(\)"):
        env.step(0)


@pytest.mark.parametrize("game", sorted(MATRIX_GAMES))
def test_check_env_accepts_every_built_in_game(game):
    check_env(MatrixGameEnv({"game": game}), n_steps=40, deterministic=True)  # no chance: the seed has no effect


def test_check_env_accepts_a_user_payoff():
    check_env(MatrixGameEnv({"payoff": [[1, -2, 0.5], [0, 3, -1]]}), n_steps=40, deterministic=True)
