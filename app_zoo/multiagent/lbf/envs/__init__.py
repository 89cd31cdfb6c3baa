"""Level-Based Foraging helpers: a scripted "go to the first food together and load" heuristic, and a baseline run.

Environment: ``env_type: lbforaging`` (``nervex.envs.LBForagingEnv``); its team return (``team_reward: sum``) is
EPyMARL's normalized return: 1.0 = all food collected.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

import numpy as np

from nervex.envs import LBForagingEnv, team_value

NONE, NORTH, SOUTH, WEST, EAST, LOAD = range(6)
_DELTAS = np.array([(0, 0), (-1, 0), (1, 0), (0, -1), (0, 1), (0, 0)])  # (row, col) change of each action


def _cells_beside(food: np.ndarray, foods: np.ndarray, field_size: int) -> list:
    row, col = int(food[0]), int(food[1])
    taken = {(int(r), int(c)) for r, c in foods[:, :2]}
    cells = [(row - 1, col), (row + 1, col), (row, col - 1), (row, col + 1)]
    return [c for c in cells if 0 <= c[0] < field_size and 0 <= c[1] < field_size and c not in taken]


def _step_toward(offset: np.ndarray, legal: np.ndarray) -> int:
    dy, dx = int(offset[0]), int(offset[1])
    moves = [(abs(dy), NORTH if dy < 0 else SOUTH), (abs(dx), WEST if dx < 0 else EAST)]
    for distance, move in sorted(moves, reverse=True):
        if distance and legal[move]:
            return move
    return NONE


def lbf_heuristic_action(obs: Mapping[str, np.ndarray], field_size: int = 8) -> np.ndarray:
    """Every agent walks to its own cell beside the first food still on the field and loads once there
    (``force_coop`` food needs all of them loading at once, so the first to arrive keeps loading).

    Reads each agent's own row: ``(row, col, level)`` per food (level 0 = eaten), then itself, then the others (full
    sight: the same food comes first for every agent). Cells beside the food go to the agents by index, each the
    nearest one left; a blocked move tries the other axis, else waits. A ``callable`` slot's function (8x8 maps).

    Returns:
        ``(N,)`` int64 LBF actions (legal under ``obs['action_mask']``).
    """
    rows, mask = np.asarray(obs["obs"]), np.asarray(obs["action_mask"])
    n = rows.shape[0]
    food_num = rows.shape[1] // 3 - n
    actions = np.zeros(n, np.int64)
    foods = rows[0, : 3 * food_num].reshape(food_num, 3)
    left = foods[foods[:, 2] > 0]
    if not left.size:
        return actions
    positions = rows[:, 3 * food_num : 3 * food_num + 2]  # each agent's own row starts its players with itself
    beside = np.abs(positions - left[0, :2]).sum(axis=1) == 1
    held = {(int(r), int(c)) for r, c in positions[beside]}
    free = [c for c in _cells_beside(left[0], left, field_size) if c not in held]
    for i in range(n):
        me = positions[i]
        if beside[i]:
            actions[i] = LOAD
            continue
        if not free:
            continue
        cell = min(free, key=lambda c: abs(c[0] - me[0]) + abs(c[1] - me[1]))
        free.remove(cell)
        actions[i] = _step_toward(np.asarray(cell) - me, mask[i])
        # LBF cancels every move into a cell two agents enter: the later agent waits a step
        if tuple(me + _DELTAS[actions[i]]) in {tuple(positions[j] + _DELTAS[actions[j]]) for j in range(i)}:
            actions[i] = NONE
    return actions


def play_lbf(policy: str, episodes: int, seed: int = 0, cfg: Optional[Mapping[str, Any]] = None) -> Dict[str, float]:
    """Mean ``normalized_return`` (team return, 1.0 = all food) and ``food_collected`` of ``'random'`` (uniform over
    legal actions) or ``'heuristic'`` over ``episodes`` episodes; the env seeded once with ``seed``.

    Raises:
        ValueError: an unknown policy or ``episodes < 1``.
    """
    if policy not in ("random", "heuristic") or episodes < 1:
        raise ValueError(f"play_lbf: policy must be 'random' or 'heuristic', episodes >= 1; got {policy!r}, {episodes}")
    from nervex.envs import sample_action

    env = LBForagingEnv(dict(cfg or {}))
    space = env.info().act_space
    rng = np.random.default_rng(seed)
    env.seed(seed)
    returns, food = [], []
    try:
        for _ in range(episodes):
            obs, done = env.reset(), False
            while not done:
                if policy == "heuristic":
                    action = lbf_heuristic_action(obs)
                else:
                    action = sample_action(space, obs["action_mask"], rng)
                obs, _, done, info = env.step(action)
            returns.append(team_value(info["episode_return"], "sum"))
            food.append(info["episode_stats"]["food_collected"])
    finally:
        env.close()
    return {"normalized_return": float(np.mean(returns)), "food_collected": float(np.mean(food))}


__all__ = ["lbf_heuristic_action", "play_lbf"]
