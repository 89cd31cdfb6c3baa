"""mpe2's ``simple_spread_v3`` helpers: the random and assignment-heuristic baselines, coverage, the gap closed.

simple_spread (N agents, N landmarks, 25 steps by default): every agent's reward is ``(1 - local_ratio)`` times the
shared coverage term (minus the sum over landmarks of the nearest agent's distance) plus ``local_ratio`` times its
own collision penalty (-1 per agent it touches); ``local_ratio = 0.5`` by default. The *team return* here is the sum
over agents and steps of those rewards (``team_reward: sum``, as the MPE literature reports it: the shared term is
counted N times).

The baselines the benchmark's normalization needs: ``measure_spread_baselines`` plays a uniform random policy and the
assignment heuristic (``spread_heuristic_action``) on the same seeded episodes and returns their mean team returns;
``gap_closed(x, baselines)`` is ``(x - random) / (heuristic - random)``.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence

import numpy as np
from scipy.optimize import linear_sum_assignment

from nervex.envs import PettingZooParallelEnv, team_value

SPREAD_ENV_ID = "mpe2.simple_spread_v3"
CAPTURE_RADIUS = 0.1  # mpe2's own threshold for an occupied landmark (its benchmark_data, terminate_on_success)
STOP_HORIZON = 0.3  # how far an MPE agent coasts with no action: dt * sum_k (1 - damping)^k = 0.1 * 3
DEAD_ZONE = 0.02  # closer than this (after coasting) along both axes: no action
# discrete MPE actions: 0 none, 1 -x, 2 +x, 3 -y, 4 +y
_MOVES = {(0, -1): 1, (0, 1): 2, (1, -1): 3, (1, 1): 4}


def spread_agent_num(obs: Mapping[str, np.ndarray]) -> int:
    """The agent count of a fully observed simple_spread observation (rows of ``6 N`` values, N rows).

    Raises:
        ValueError: the rows are not simple_spread's layout (partial observability changes it).
    """
    rows = np.asarray(obs["obs"])
    n = rows.shape[-2]
    if rows.shape[-1] != 6 * n:
        raise ValueError(
            f"spread heuristic: observation rows of width {rows.shape[-1]} for {n} agents; simple_spread's full "
            f"observation has 6 * N = {6 * n} (self vel 2, self pos 2, landmarks 2N, others 2(N-1), comm 2(N-1))"
        )
    return n


def spread_assignment(obs: Mapping[str, np.ndarray]) -> np.ndarray:
    """Each agent's landmark under the minimum-total-distance assignment (Hungarian algorithm), ``(N,)`` int64.

    Agent ``i``'s row holds the landmarks' positions relative to it (``obs[i, 4 + 2j : 6 + 2j]``), so the cost
    matrix ``cost[i, j] = |landmark_j - agent_i|`` is read off the observation.
    """
    n = spread_agent_num(obs)
    rel = np.asarray(obs["obs"], np.float64)[:, 4 : 4 + 2 * n].reshape(n, n, 2)
    agents, landmarks = linear_sum_assignment(np.linalg.norm(rel, axis=-1))
    target = np.empty(n, np.int64)
    target[agents] = landmarks
    return target


def steer(rows: np.ndarray, agent: int, landmark: int) -> int:
    """The discrete move that takes ``agent`` to ``landmark``: it aims at the landmark minus where the agent would coast
    to (``STOP_HORIZON * velocity``) and moves along the axis with the larger remaining offset (none within
    ``DEAD_ZONE``)."""
    offset = rows[agent, 4 + 2 * landmark : 6 + 2 * landmark] - STOP_HORIZON * rows[agent, 0:2]
    axis = int(np.argmax(np.abs(offset)))
    return _MOVES[(axis, int(np.sign(offset[axis])))] if abs(offset[axis]) > DEAD_ZONE else 0


def spread_heuristic_action(obs: Mapping[str, np.ndarray]) -> np.ndarray:
    """The assignment heuristic: every agent steers (``steer``) to its assigned landmark (``spread_assignment``).

    Returns:
        ``(N,)`` int64 discrete actions.
    """
    rows = np.asarray(obs["obs"], np.float64)
    return np.array([steer(rows, i, j) for i, j in enumerate(spread_assignment(obs))], np.int64)


def spread_nearest_action(obs: Mapping[str, np.ndarray]) -> np.ndarray:
    """A reference without coordination: every agent steers to its own nearest landmark (agents may share one)."""
    n = spread_agent_num(obs)
    rows = np.asarray(obs["obs"], np.float64)
    nearest = np.linalg.norm(rows[:, 4 : 4 + 2 * n].reshape(n, n, 2), axis=-1).argmin(axis=1)
    return np.array([steer(rows, i, int(j)) for i, j in enumerate(nearest)], np.int64)


def spread_fixed_action(obs: Mapping[str, np.ndarray]) -> np.ndarray:
    """A reference convention: agent ``i`` steers to landmark ``i`` (every agent sees the landmarks in one order, so a
    shared policy that sees its agent id can learn it; no landmark is left empty, but the pairing is not the
    shortest)."""
    n = spread_agent_num(obs)
    rows = np.asarray(obs["obs"], np.float64)
    return np.array([steer(rows, i, i) for i in range(n)], np.int64)


SPREAD_POLICIES = {
    "heuristic": spread_heuristic_action,
    "nearest": spread_nearest_action,
    "fixed": spread_fixed_action,
}


def spread_coverage(parallel_env: Any) -> Dict[str, float]:
    """``coverage``: the fraction of landmarks with an agent within ``CAPTURE_RADIUS`` (0.1, mpe2's own); and
    ``landmark_dist``: the mean over landmarks of the nearest agent's distance -- both at the episode's end.

    The ``episode_stats`` function of a simple_spread config (``app_zoo.multiagent.mpe.envs:spread_coverage``).
    """
    world = parallel_env.unwrapped.world
    agents = np.stack([a.state.p_pos for a in world.agents])
    landmarks = np.stack([lm.state.p_pos for lm in world.landmarks])
    nearest = np.linalg.norm(landmarks[:, None, :] - agents[None, :, :], axis=-1).min(axis=1)
    return {"coverage": float((nearest < CAPTURE_RADIUS).mean()), "landmark_dist": float(nearest.mean())}


def make_spread_env(env_kwargs: Optional[Mapping[str, Any]] = None) -> PettingZooParallelEnv:
    """simple_spread through the ParallelEnv adapter, team return summed, with coverage as episode stats."""
    return PettingZooParallelEnv(
        {
            "env_id": SPREAD_ENV_ID,
            "env_kwargs": dict(env_kwargs or {}),
            "team_reward": "sum",
            "episode_stats": f"{__name__}:spread_coverage",
        }
    )


def play_spread(
    policy: str, episodes: int, seed: int = 0, env_kwargs: Optional[Mapping[str, Any]] = None
) -> Dict[str, float]:
    """Play ``episodes`` episodes of ``policy`` (``'random'`` or a name in ``SPREAD_POLICIES``: ``'heuristic'``,
    ``'nearest'``, ``'fixed'``) from ``seed``.

    The env is seeded once with ``seed`` (episode ``k`` is the same layout for every policy); random actions come
    from ``np.random.default_rng(seed)``.

    Returns:
        ``team_return`` (mean over episodes of the sum over agents and steps), ``coverage`` and ``landmark_dist``
        (means of the episode-end figures).

    Raises:
        ValueError: an unknown policy or ``episodes < 1``.
    """
    if policy != "random" and policy not in SPREAD_POLICIES or episodes < 1:
        raise ValueError(
            f"play_spread: policy must be 'random' or one of {sorted(SPREAD_POLICIES)} and episodes >= 1, got "
            f"{policy!r}, {episodes}"
        )
    env = make_spread_env(env_kwargs)
    nvec = env.info().act_space.nvec
    rng = np.random.default_rng(seed)
    env.seed(seed)
    totals: Dict[str, list] = {"team_return": [], "coverage": [], "landmark_dist": []}
    try:
        for _ in range(episodes):
            obs, done = env.reset(), False
            while not done:
                action = rng.integers(nvec) if policy == "random" else SPREAD_POLICIES[policy](obs)
                obs, _, done, info = env.step(action)
            totals["team_return"].append(team_value(info["episode_return"], "sum"))
            for key in ("coverage", "landmark_dist"):
                totals[key].append(info["episode_stats"][key])
    finally:
        env.close()
    return {key: float(np.mean(values)) for key, values in totals.items()}


def measure_spread_baselines(
    episodes: int = 100,
    seed: int = 0,
    env_kwargs: Optional[Mapping[str, Any]] = None,
    policies: Sequence[str] = ("random", "heuristic"),
) -> Dict[str, float]:
    """Mean team returns (sum over agents) of ``policies`` on the same episodes: by default the random policy and the
    assignment heuristic, the two ends of the benchmark's "fraction of the gap closed" (``'nearest'`` and
    ``'fixed'`` are reference points between them).

    Returns:
        ``{policy: team_return}``.
    """
    return {p: play_spread(p, episodes, seed, env_kwargs)["team_return"] for p in policies}


def gap_closed(team_return: float, baselines: Mapping[str, float]) -> float:
    """``(team_return - random) / (heuristic - random)``: 0 = random, 1 = the assignment heuristic.

    Raises:
        ValueError: the heuristic does not beat random (no gap to close).
    """
    gap = baselines["heuristic"] - baselines["random"]
    if not gap > 0:
        raise ValueError(
            f"gap_closed: the heuristic ({baselines['heuristic']}) does not beat random ({baselines['random']})"
        )
    return (team_return - baselines["random"]) / gap


__all__ = [
    "SPREAD_POLICIES",
    "steer",
    "spread_heuristic_action",
    "spread_nearest_action",
    "spread_fixed_action",
    "spread_assignment",
    "spread_coverage",
    "make_spread_env",
    "play_spread",
    "measure_spread_baselines",
    "gap_closed",
]
