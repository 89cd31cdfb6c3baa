"""OpenSpiel games as turn-based nervex envs: the contract, Kuhn hands against OpenSpiel's own returns, seeding,
encoders, errors, and the one-ply connect-four heuristic on hand-built positions."""

from __future__ import annotations

import pickle
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import List

import numpy as np
import pytest

pyspiel = pytest.importorskip("pyspiel")

from nervex.envs import OpenSpielEnv, check_env, create_env, encode_open_spiel  # noqa: E402
from nervex.envs.open_spiel_env import import_pyspiel, one_ply_connect_four  # noqa: E402

PASS, BET = 0, 1  # Kuhn poker's actions (bet = call)
GAMES = ["kuhn_poker", "leduc_poker", "tic_tac_toe", "connect_four"]


def make(game: str, **cfg) -> OpenSpielEnv:
    return create_env({"env_type": "open_spiel", "game": game, **cfg})


def random_game(env: OpenSpielEnv, rng: np.random.Generator):
    """Play one game of random legal moves; yield (obs before the move, timestep)."""
    obs = env.reset()
    while True:
        ts = env.step(rng.choice(np.flatnonzero(obs["action_mask"])))
        yield obs, ts
        if ts.done:
            return
        obs = ts.obs


def dealt(env: OpenSpielEnv) -> List[int]:
    """Reset ``env``; return the chance outcomes sampled before the first decision (the deal)."""
    env.reset()
    return env.state.history()


def kuhn_card(obs) -> int:
    """The acting seat's card (0 = J, 1 = Q, 2 = K): the information state is [player (2), card (3), history]."""
    return int(np.argmax(obs["obs"][2:5]))


# ---- the contract ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "game, chance", [("kuhn_poker", True), ("leduc_poker", True), ("tic_tac_toe", False), ("connect_four", False)]
)
def test_check_env_accepts_each_game(game, chance):
    check_env(make(game), n_steps=150, deterministic=not chance)


def test_info_describes_two_turn_based_seats():
    info = make("kuhn_poker").info()
    assert info.agent_num == 2 and info.agent_ids == ("player_0", "player_1") and info.turn_based
    assert info.act_space.n == 2 and info.rew_space.shape == (2,)
    assert info.rew_space.low.tolist() == [-2.0, -2.0] and info.rew_space.high.tolist() == [2.0, 2.0]
    assert info.obs_space["obs"].shape == (11,) and info.obs_space["obs"].dtype == np.float32
    assert make("connect_four").info().obs_space["obs"].shape == (126,)  # observation tensor: no information state


# ---- Kuhn poker -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "actions, stake",
    [([PASS, PASS], 1), ([BET, BET], 2), ([PASS, BET, BET], 2)],
    ids=["check_check", "bet_call", "check_bet_call"],
)
def test_a_kuhn_showdown_pays_the_higher_card(actions, stake):
    for seed in range(6):
        env = make("kuhn_poker")
        env.seed(seed)
        obs = env.reset()
        cards = [kuhn_card(obs), None]
        for i, action in enumerate(actions):
            ts = env.step(action)
            if i == 0:
                cards[1] = kuhn_card(ts.obs)
            assert ts.done == (i == len(actions) - 1)
        sign = 1 if cards[0] > cards[1] else -1
        assert ts.reward.tolist() == [sign * stake, -sign * stake], f"seed {seed}, cards {cards}"
        assert ts.info["episode_return"].tolist() == list(env.state.returns())
        assert ts.info["outcome"].tolist() == [sign, -sign] and ts.info["episode_len"] == len(actions)
        # OpenSpiel replaying the same deal and moves agrees
        replay = env.game.new_initial_state()
        for action in cards + actions:
            replay.apply_action(action)
        assert replay.returns() == ts.reward.tolist()


def test_a_kuhn_fold_pays_the_bettor_one_whatever_the_cards():
    env = make("kuhn_poker")
    for seed in range(4):
        env.seed(seed)
        env.reset()
        timesteps = [env.step(a) for a in (PASS, BET, PASS)]  # check, bet, fold
        assert [t.reward.tolist() for t in timesteps] == [[0.0, 0.0], [0.0, 0.0], [-1.0, 1.0]]
        assert timesteps[-1].info["outcome"].tolist() == [-1, 1]


def test_rewards_sum_to_open_spiels_returns_over_random_games():
    rng = np.random.default_rng(0)
    for game in ("kuhn_poker", "leduc_poker", "connect_four"):
        env = make(game)
        env.seed(1)
        for _ in range(20):
            rewards = [ts.reward for _, ts in random_game(env, rng)]
            returns = np.asarray(env.state.returns())
            np.testing.assert_array_equal(np.sum(rewards, axis=0), returns)
            assert all(not r.any() for r in rewards[:-1])  # terminal rewards only, for these games


def test_seeding_reproduces_the_deals_and_different_seeds_differ():
    def deals(seed: int, n: int = 60) -> List[List[int]]:
        env = make("kuhn_poker")
        env.seed(seed)
        return [dealt(env)[:2] for _ in range(n)]

    first = deals(7)
    assert first == deals(7) and first != deals(8)
    counts = Counter(tuple(deal) for deal in deals(0, 1200))
    assert len(counts) == 6 and all(120 <= c <= 280 for c in counts.values()), counts  # 200 +- 5 sigma each


def test_the_chance_sampler_follows_the_outcome_probabilities():
    env = make("leduc_poker")
    env.seed(3)
    firsts = np.bincount([dealt(env)[0] for _ in range(1200)], minlength=6)
    assert firsts.sum() == 1200 and all(130 <= c <= 270 for c in firsts), firsts  # 6 cards, 200 +- 5 sigma each


# ---- observations ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("game", GAMES)
def test_observations_are_the_public_encoder(game):
    env, rng = make(game), np.random.default_rng(0)
    env.seed(0)
    checked = 0
    for _ in range(5):
        for _, ts in random_game(env, rng):
            want_obs, want_mask = encode_open_spiel(env.state, int(ts.obs["to_play"]))
            assert ts.obs["obs"].dtype == np.float32 and ts.obs["action_mask"].dtype == np.int8
            np.testing.assert_array_equal(ts.obs["obs"], want_obs)
            np.testing.assert_array_equal(ts.obs["action_mask"], want_mask)  # at the end: all zeros from OpenSpiel
            checked += 1
    assert checked >= 10
    first = env.reset()
    assert first["obs"].tolist() == encode_open_spiel(env.state, int(first["to_play"]))[0].tolist()
    tensor = "information_state_tensor" if game.endswith("poker") else "observation_tensor"
    assert encode_open_spiel(env.state, 0)[0].tolist() == getattr(env.state, tensor)(0)


@pytest.mark.parametrize("game", GAMES)
def test_the_fast_and_the_plain_observation_paths_agree(game):
    fast, plain = make(game), make(game)
    fast.info()
    plain.info()
    assert fast._observer is not None  # the four games take the fast path (OpenSpiel's Observation buffer)
    plain._observer = None  # the fallback: the tensor method's Python list
    rng_a, rng_b = np.random.default_rng(2), np.random.default_rng(2)
    for env in (fast, plain):
        env.seed(4)
    for _ in range(3):
        for (obs_a, ts_a), (obs_b, ts_b) in zip(random_game(fast, rng_a), random_game(plain, rng_b)):
            for key in ("obs", "action_mask", "to_play"):
                np.testing.assert_array_equal(obs_a[key], obs_b[key])
                np.testing.assert_array_equal(ts_a.obs[key], ts_b.obs[key])
                assert ts_a.obs[key].dtype == ts_b.obs[key].dtype
            np.testing.assert_array_equal(ts_a.reward, ts_b.reward)


def test_the_last_observation_has_no_legal_moves_and_the_other_seat():
    env = make("tic_tac_toe")
    env.reset()
    for cell in (0, 3, 1, 4):
        env.step(cell)
    ts = env.step(2)  # x completes the top row
    assert ts.done and ts.reward.tolist() == [1.0, -1.0] and ts.info["outcome"].tolist() == [1, -1]
    assert ts.obs["action_mask"].tolist() == [0] * 9 and int(ts.obs["to_play"]) == 1


def test_connect_four_planes_are_per_player_not_from_the_movers_view():
    """OpenSpiel 2.0.2: (player 0's stones, player 1's stones, empty) x 6 rows (0 = bottom) x 7 columns, the same
    for both players; ``one_ply_connect_four`` relies on this layout."""
    env = make("connect_four")
    env.reset()
    for column in (3, 3, 0):
        obs = env.step(column).obs
    planes = obs["obs"].reshape(3, 6, 7)
    assert int(obs["to_play"]) == 1
    assert np.argwhere(planes[0]).tolist() == [[0, 0], [0, 3]]
    assert np.argwhere(planes[1]).tolist() == [[1, 3]]
    assert planes[2].sum() == 42 - 3 and planes[2][0, 3] == 0
    np.testing.assert_array_equal(encode_open_spiel(env.state, 0)[0], encode_open_spiel(env.state, 1)[0])


# ---- errors and limits ----------------------------------------------------------------------------------------------
def test_an_illegal_action_is_a_clear_error_and_the_game_goes_on():
    env = make("connect_four")
    env.reset()
    for _ in range(6):
        env.step(2)  # column 2 is full
    with pytest.raises(ValueError, match=r"illegal action 2 for seat player_0 \(move 6\); legal: \[0, 1, 3, 4, 5, 6\]"):
        env.step(2)
    with pytest.raises(ValueError, match=r"illegal action 7 for seat player_0"):
        env.step(7)
    with pytest.raises(ValueError, match=r"illegal action -1 for seat player_0"):
        env.step(-1)
    assert int(env.step(np.int64(0)).obs["to_play"]) == 1  # the refused moves changed nothing


def test_step_before_reset_and_after_the_end_is_an_error():
    env = make("kuhn_poker")
    with pytest.raises(RuntimeError, match=r"step\(\) before reset\(\)"):
        env.step(0)
    env.reset()
    env.step(PASS)
    env.step(PASS)
    with pytest.raises(RuntimeError, match=r"step\(\) before reset\(\)"):
        env.step(0)


def test_a_move_limit_truncates():
    env = make("connect_four", max_episode_steps=3)
    env.reset()
    last = [env.step(c) for c in (0, 1, 2)][-1]
    assert last.done and last.info["truncated"] and not last.info["terminated"]
    assert last.info["outcome"].tolist() == [0, 0] and last.info["episode_len"] == 3
    assert last.obs["action_mask"].sum() == 7  # not over: the seat to move still has its moves
    with pytest.raises(ValueError, match=r"'max_episode_steps' must be None or an int >= 1"):
        make("connect_four", max_episode_steps=0)


@pytest.mark.parametrize(
    "cfg, error, message",
    [
        ({"game": "kuhn_pokr"}, KeyError, r"unknown OpenSpiel game 'kuhn_pokr' .*did you mean 'kuhn_poker'\?"),
        ({"game": "matrix_rps"}, ValueError, r"turn-based games; 'matrix_rps' has .*SIMULTANEOUS"),
        ({"game": "goofspiel"}, ValueError, r"turn-based games; 'goofspiel'"),
        ({"game": "kuhn_poker", "game_kwargs": {"players": 3}}, ValueError, r"two-player games; .* has 3 players"),
        ({"game": "kuhn_poker", "game_kwargs": {"plyers": 2}}, ValueError, r"cannot load 'kuhn_poker' .*'plyers'"),
        ({"game": "kuhn_poker", "game_kwargs": {"players": [2]}}, ValueError, r"'game_kwargs.players' must be"),
        ({"game": "kuhn_poker", "gmae_kwargs": {}}, KeyError, r"did you mean 'game_kwargs'"),
    ],
    ids=["unknown", "simultaneous", "simultaneous_chance", "three_players", "bad_param", "param_type", "bad_key"],
)
def test_games_the_env_cannot_play_are_clear_errors(cfg, error, message):
    with pytest.raises(error, match=message):
        create_env({"env_type": "open_spiel", **cfg}).info()


def test_without_open_spiel_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyspiel", None)  # makes `import pyspiel` raise ImportError
    with pytest.raises(ImportError, match=r"pip install open_spiel"):
        import_pyspiel()
    with pytest.raises(ImportError, match=r"pip install open_spiel"):
        make("kuhn_poker").reset()


def test_nervex_envs_imports_without_open_spiel():
    code = (
        "import sys; sys.modules['pyspiel'] = None; import nervex.envs; "
        "from nervex.utils.registry import ENV_REGISTRY; print('open_spiel' in ENV_REGISTRY)"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=root)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "True"


def test_pickles_before_and_after_use():
    env = make("kuhn_poker")
    env.seed(5)
    env.reset()
    clone = pickle.loads(pickle.dumps(env))
    clone.seed(5)
    env.seed(5)
    assert env.reset()["obs"].tolist() == clone.reset()["obs"].tolist()
    assert clone.step(PASS).obs["to_play"] == 1


# ---- the one-ply connect-four heuristic -----------------------------------------------------------------------------
def position(moves: List[int]):
    env = make("connect_four")
    obs = env.reset()
    for column in moves:
        obs = env.step(column).obs
    return env, obs


def heuristic_moves(obs, seeds=range(8)) -> set:
    return {one_ply_connect_four(obs, np.random.default_rng(s)) for s in seeds}


@pytest.mark.parametrize(
    "moves, seat, want",
    [
        ([0, 0, 1, 1, 2, 2], 0, 3),  # a horizontal win on the bottom row (seat 1 has three above it: no threat yet)
        ([0, 6, 1, 6, 2], 1, 3),  # seat 1 blocks the bottom row
        ([0, 6, 1, 6, 2, 6], 0, 3),  # win beats block: seat 1 threatens column 6 (vertical)
        ([0, 6, 0, 6, 0, 6, 3], 1, 6),  # win beats block for seat 1 too (own and opponent planes by seat)
        ([6, 0, 5, 0, 6, 0], 0, 0),  # seat 0 blocks a vertical three
        ([0, 1, 1, 2, 2, 3, 2, 3, 3, 5], 0, 3),  # a diagonal win, though seat 1 threatens column 4 on the bottom row
        ([6, 5, 5, 4, 4, 3, 4, 3, 3, 1], 0, 3),  # the mirrored (anti-)diagonal win, seat 1 threatens column 2
    ],
    ids=[
        "win",
        "block_as_seat_1",
        "win_over_block",
        "win_over_block_as_seat_1",
        "block_vertical",
        "diagonal_win",
        "antidiagonal_win",
    ],
)
def test_the_heuristic_wins_else_blocks(moves, seat, want):
    env, obs = position(moves)
    assert int(obs["to_play"]) == seat
    assert heuristic_moves(obs) == {want}
    assert one_ply_connect_four(env.state, np.random.default_rng(0)) == want  # a pyspiel state works the same
    ts = env.step(want)
    if ts.done:  # a winning move: OpenSpiel itself says the mover won
        assert ts.info["outcome"][seat] == 1


def test_the_heuristic_takes_every_win_open_spiel_sees():
    rng = np.random.default_rng(1)
    env, checked = make("connect_four"), 0
    for _ in range(40):
        for _, ts in random_game(env, rng):
            if ts.done:
                break
            state, seat = env.state, int(ts.obs["to_play"])
            winning = set()
            for column in state.legal_actions():
                child = state.child(column)
                if child.is_terminal() and child.returns()[seat] == 1:
                    winning.add(column)
            if winning:
                assert heuristic_moves(ts.obs, range(4)) <= winning
                checked += 1
    assert checked >= 20


def test_without_a_threat_the_heuristic_plays_uniformly_among_legal_moves():
    env, obs = position([3] * 6)  # column 3 full, no threats
    rng = np.random.default_rng(0)
    counts = np.bincount([one_ply_connect_four(obs, rng) for _ in range(1200)], minlength=7)
    assert counts[3] == 0 and all(130 <= c <= 270 for i, c in enumerate(counts) if i != 3), counts  # 200 +- 5 sigma
    assert one_ply_connect_four(obs, np.random.default_rng(9)) == one_ply_connect_four(obs, np.random.default_rng(9))


def test_the_heuristic_beats_a_random_player_from_either_seat():
    env, rng = make("connect_four"), np.random.default_rng(0)
    for seat in (0, 1):
        wins = 0
        for _ in range(60):
            obs = env.reset()
            while True:
                mover = int(obs["to_play"])
                action = (
                    one_ply_connect_four(obs, rng) if mover == seat else rng.choice(np.flatnonzero(obs["action_mask"]))
                )
                ts = env.step(action)
                obs = ts.obs
                if ts.done:
                    wins += ts.info["outcome"][seat] == 1
                    break
        assert wins >= 48, f"seat {seat}: {wins}/60"  # measured: 97.5% and 95% over 200 games


def test_the_heuristic_refuses_a_finished_game():
    env, _ = position([0, 1, 0, 1, 0, 1])
    ts = env.step(0)
    assert ts.done
    with pytest.raises(ValueError, match="no legal move"):
        one_ply_connect_four(ts.obs)


def test_swap_planes_shows_seat_1_its_own_stones_first_and_the_heuristic_reads_both_layouts():
    plain = OpenSpielEnv({"game": "connect_four"})
    swapped = OpenSpielEnv({"game": "connect_four", "swap_planes": [0, 1]})
    for env in (plain, swapped):
        env.seed(0)
        env.reset()
        env.step(3)  # seat 0 drops a stone in the middle column: seat 1 to move
    a, b = plain.step(0).obs, swapped.step(0).obs  # seat 1 answers in column 0: seat 0 to move (no swap)
    assert np.array_equal(a["obs"], b["obs"])
    obs_plain, obs_swapped = plain.step(3).obs, swapped.step(3).obs  # seat 1 to move again
    p, q = obs_plain["obs"].reshape(3, 6, 7), obs_swapped["obs"].reshape(3, 6, 7)
    assert p[0].sum() == 2 and p[1].sum() == 1  # plain: player 0's stones first
    assert np.array_equal(q[0], p[1]) and np.array_equal(q[1], p[0]) and np.array_equal(q[2], p[2])
    # seat 1 (one stone, column 0) faces three of seat 0's in column 3 after one more pair of moves: it must block
    for env in (plain, swapped):
        env.step(1)
        obs = env.step(3).obs
        assert int(obs["to_play"]) == 1 and one_ply_connect_four(obs) == 3
    with pytest.raises(ValueError, match="swap_planes"):
        OpenSpielEnv({"game": "connect_four", "swap_planes": [0, 0]}).reset()
    with pytest.raises(ValueError, match="swap_planes"):
        OpenSpielEnv({"game": "kuhn_poker", "swap_planes": [0, 1]}).reset()
