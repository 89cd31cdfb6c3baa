"""simple_spread's baselines: the assignment and the heuristic's moves by hand, coverage on a placed world, the
heuristic against random on fixed seeds (numbers measured), the gap-closed normalization."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mpe2")
pytest.importorskip("scipy")

from app_zoo.multiagent.mpe.envs import (  # noqa: E402
    gap_closed,
    make_spread_env,
    play_spread,
    spread_assignment,
    spread_coverage,
    spread_fixed_action,
    spread_heuristic_action,
    spread_nearest_action,
)


def two_agent_obs() -> dict:
    """N = 2 rows of 12: vel, pos, landmarks relative (2 x 2), other agent relative, comm."""
    rows = np.zeros((2, 12), np.float32)
    rows[0, 0:2] = [0.5, 0.0]  # agent 0 moves +x at 0.5: it coasts 0.15 further
    rows[0, 4:8] = [0.0, 0.1, 0.12, 0.0]  # L0 at distance 0.10, L1 at 0.12
    rows[1, 4:8] = [0.0, -0.11, 0.9, 0.0]  # L0 at 0.11, L1 at 0.90
    return {"obs": rows}


def test_the_assignment_minimizes_the_total_distance_not_each_agents():
    # nearest landmark of both agents is L0; the assignment gives agent 0 L1 (0.12 + 0.11 < 0.10 + 0.90)
    assert spread_assignment(two_agent_obs()).tolist() == [1, 0]


def test_the_heuristic_steers_with_the_coasting_distance_in_mind():
    # agent 0: L1 is 0.12 ahead along +x, but coasting carries it 0.3 * 0.5 = 0.15: it brakes (-x, action 1);
    # agent 1: L0 is 0.11 along -y (action 3)
    assert spread_heuristic_action(two_agent_obs()).tolist() == [1, 3]


def test_the_reference_policies_pick_their_landmarks_by_hand():
    # nearest: both agents steer to L0 (agent 0: L0 is (0, 0.1) but it coasts 0.15 along +x, so it brakes: -x,
    # action 1; agent 1: 0.11 along -y, action 3); fixed: agent 0 to L0 (action 1), agent 1 to L1 (+x, action 2)
    assert spread_nearest_action(two_agent_obs()).tolist() == [1, 3]
    assert spread_fixed_action(two_agent_obs()).tolist() == [1, 2]


def test_a_layout_other_than_simple_spreads_is_refused():
    with pytest.raises(ValueError, match="6 \\* N"):
        spread_heuristic_action({"obs": np.zeros((3, 14))})


def test_coverage_on_a_placed_world():
    env = make_spread_env()
    env.seed(0)
    env.reset()
    world = env.parallel_env.unwrapped.world
    landmarks = [lm.state.p_pos for lm in world.landmarks]
    world.agents[0].state.p_pos = landmarks[0] + np.array([0.05, 0.0])
    world.agents[1].state.p_pos = landmarks[1].copy()
    world.agents[2].state.p_pos = landmarks[1] + np.array([0.0, 0.5])
    dist2 = min(np.linalg.norm(landmarks[2] - a.state.p_pos) for a in world.agents)
    stats = spread_coverage(env.parallel_env)
    assert stats["coverage"] == pytest.approx(2 / 3)
    assert stats["landmark_dist"] == pytest.approx((0.05 + 0.0 + dist2) / 3)


def test_the_adapter_reports_coverage_at_the_end_of_an_episode():
    env = make_spread_env()
    env.reset()
    for _ in range(25):
        ts = env.step(np.zeros(3, np.int64))
    assert ts.done and set(ts.info["episode_stats"]) == {"coverage", "landmark_dist"}
    assert ts.info["episode_stats"] == spread_coverage(env.parallel_env)


def test_the_heuristic_beats_random_by_a_wide_margin():
    # measured on seed 0, 10 episodes of 25 steps, team return = sum over the 3 agents and the steps
    heuristic, random = play_spread("heuristic", 10, seed=0), play_spread("random", 10, seed=0)
    assert heuristic["team_return"] == pytest.approx(-25.03, abs=0.01)
    assert random["team_return"] == pytest.approx(-80.46, abs=0.01)
    assert heuristic["coverage"] == pytest.approx(26 / 30) and random["coverage"] == pytest.approx(2 / 30)
    nearest, fixed = play_spread("nearest", 10, seed=0), play_spread("fixed", 10, seed=0)
    assert random["team_return"] < nearest["team_return"] < fixed["team_return"] < heuristic["team_return"]


def test_an_unknown_reference_policy_is_refused():
    with pytest.raises(ValueError, match="'fixed'"):
        play_spread("greedy", 1)


def test_gap_closed():
    baselines = {"random": -80.0, "heuristic": -20.0}
    assert gap_closed(-50.0, baselines) == 0.5 and gap_closed(-20.0, baselines) == 1.0
    with pytest.raises(ValueError, match="does not beat random"):
        gap_closed(-50.0, {"random": -20.0, "heuristic": -20.0})
