"""The PettingZoo AEC adapter on tic-tac-toe: scripted games with hand-known results, masks, errors, managers."""

from __future__ import annotations

import pickle
from typing import Any, Dict, List

import numpy as np
import pytest

pytest.importorskip("pettingzoo")

from app_zoo.games import TicTacToeEnv  # noqa: E402
from nervex.envs import check_env, create_env  # noqa: E402
from nervex.worker.actor.env_manager import BaseEnvManager, SubprocessEnvManager  # noqa: E402

# cells 0..8; PettingZoo's squares: any row, column or diagonal of three wins
FIRST_WINS = [0, 3, 1, 4, 2]  # X: 0 1 2
SECOND_WINS = [0, 4, 1, 2, 8, 6]  # O: 4 2 6 (a diagonal); X: 0 1 8
DRAW = [0, 4, 8, 1, 7, 6, 2, 5, 3]  # X: 0 8 7 2 3, O: 4 1 6 5: no line


def play(env: TicTacToeEnv, moves: List[int]) -> List[Any]:
    env.reset()
    return [env.step(m) for m in moves]


def test_info_describes_two_turn_based_seats():
    info = TicTacToeEnv({}).info()
    assert info.agent_num == 2 and info.agent_ids == ("player_1", "player_2") and info.turn_based
    assert info.rew_space.shape == (2,) and info.act_space.n == 9
    assert set(info.obs_space.spaces) == {"obs", "action_mask", "to_play"}
    assert info.obs_space["obs"].shape == (18,) and info.obs_space["obs"].dtype == np.float32


@pytest.mark.parametrize(
    "moves, outcome",
    [(FIRST_WINS, [1, -1]), (SECOND_WINS, [-1, 1]), (DRAW, [0, 0])],
    ids=["first_wins", "second_wins", "draw"],
)
def test_scripted_game_gives_the_exact_result(moves, outcome):
    timesteps = play(TicTacToeEnv({}), moves)
    for ts in timesteps[:-1]:
        assert not ts.done and ts.reward.tolist() == [0.0, 0.0] and "episode_return" not in ts.info
    last = timesteps[-1]
    assert last.done and last.info["terminated"] and not last.info["truncated"]
    assert last.reward.dtype == np.float64 and last.reward.tolist() == [float(o) for o in outcome]
    assert last.info["episode_return"].tolist() == [float(o) for o in outcome]
    assert last.info["outcome"].tolist() == outcome and last.info["outcome"].dtype == np.int64
    assert last.info["episode_len"] == len(moves)


def test_seats_alternate_and_each_sees_the_board_from_its_side():
    env = TicTacToeEnv({})
    obs = env.reset()
    assert int(obs["to_play"]) == 0 and obs["action_mask"].tolist() == [1] * 9
    ts = env.step(4)  # X takes the centre
    obs = ts.obs
    assert int(obs["to_play"]) == 1
    assert obs["action_mask"].tolist() == [1, 1, 1, 1, 0, 1, 1, 1, 1]
    planes = obs["obs"].reshape(9, 2)  # C-order flattening of (3, 3, 2): cell k is row k
    assert planes[:, 0].sum() == 0 and planes[4, 1] == 1.0  # O sees X's mark on its "opponent" plane
    obs = env.step(0).obs
    planes = obs["obs"].reshape(9, 2)
    assert int(obs["to_play"]) == 0 and planes[4, 0] == 1.0 and planes[0, 1] == 1.0


def test_an_illegal_move_is_a_clear_error_and_the_game_goes_on():
    env = TicTacToeEnv({})
    env.reset()
    env.step(4)
    with pytest.raises(ValueError, match=r"illegal action 4 for seat player_2 \(move 1\); legal: \[0, 1, 2, 3, 5"):
        env.step(4)
    with pytest.raises(ValueError, match=r"illegal action 9 for seat player_2"):
        env.step(9)
    assert env.step(np.int64(0)).reward.tolist() == [0.0, 0.0]  # the refused moves changed nothing


def test_step_after_the_end_needs_a_reset():
    env = TicTacToeEnv({})
    play(env, FIRST_WINS)
    with pytest.raises(RuntimeError, match=r"step\(\) before reset\(\)"):
        env.step(5)
    assert int(env.reset()["action_mask"].sum()) == 9


def test_a_move_limit_truncates():
    env = create_env({"env_type": "tictactoe", "max_episode_steps": 3})
    timesteps = play(env, FIRST_WINS[:3])
    last = timesteps[-1]
    assert last.done and last.info["truncated"] and not last.info["terminated"]
    assert last.info["outcome"].tolist() == [0, 0] and last.info["episode_len"] == 3


def test_generic_adapter_takes_pettingzoo_ids_and_names_an_unknown_one():
    env = create_env({"env_type": "pettingzoo_aec", "env_id": "tictactoe_v3"})
    assert env.info().agent_ids == ("player_1", "player_2")
    with pytest.raises(KeyError, match=r"unknown PettingZoo AEC env id 'classic/tictactoe-v9'.*did you mean"):
        create_env({"env_type": "pettingzoo_aec", "env_id": "classic/tictactoe-v9"}).info()


def test_unflattened_observations_keep_the_games_planes():
    env = create_env({"env_type": "tictactoe", "flatten_obs": False})
    assert env.reset()["obs"].shape == (3, 3, 2)
    assert env.info().obs_space["obs"].shape == (3, 3, 2)


def test_check_env_accepts_it():
    check_env(TicTacToeEnv({}), n_steps=200, deterministic=True)  # tic-tac-toe has no chance moves


def test_pickles_before_and_after_use():
    env = TicTacToeEnv({})
    play(env, FIRST_WINS[:2])
    clone = pickle.loads(pickle.dumps(env))
    assert [ts.info.get("outcome") for ts in play(clone, FIRST_WINS)][-1].tolist() == [1, -1]


def _script(env_id: int, move: int, obs: Dict[str, Any]) -> int:
    """A deterministic legal move that differs per env: the (env_id + move)-th legal cell, wrapped."""
    legal = np.flatnonzero(obs["action_mask"])
    return int(legal[(env_id + move) % len(legal)])


def _run(manager: BaseEnvManager, steps: int) -> List[Dict[int, Any]]:
    manager.seed(0)
    manager.launch()
    trace, moves = [], 0
    for _ in range(steps):
        ready = manager.ready_obs
        timesteps = manager.step({i: _script(i, moves, o) for i, o in ready.items()})
        trace.append(timesteps)
        moves += 1
    return trace


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return type(a) is type(b) and a.dtype == b.dtype and np.array_equal(a, b)
    return type(a) is type(b) and a == b


def test_subprocess_manager_returns_the_same_timesteps_as_the_base_manager():
    with BaseEnvManager(TicTacToeEnv, {}, env_num=3) as base:
        want = _run(base, 20)
    with SubprocessEnvManager(TicTacToeEnv, {}, env_num=3, worker_num=2, retry_delay=0.0) as sub:
        got = _run(sub, 20)
    assert sum(ts.done for step in want for ts in step.values()) >= 3  # several games ended and auto-reset
    for step, (w, g) in enumerate(zip(want, got)):
        assert w.keys() == g.keys(), f"step {step}"
        for env_id in w:
            assert _same(tuple(w[env_id]), tuple(g[env_id])), f"step {step}, env {env_id}"
