"""The baselines of the SUMO tasks, measured exactly as an agent is: the same env, routes, seeds and figures.

- ``fixed``: the net's own static program (sumo-rl's ``fixed_ts``; single intersection: 42 s green per direction,
  2 s yellow, whatever the traffic).
- ``actuated``: SUMO's actuated control of the same phases (green 5-50 s, extended while the induction loops SUMO
  places on the incoming lanes see vehicles arrive within 3 s; ``app_zoo.sumo.envs.programs``).

``play_episodes`` runs any controller (a baseline, or a policy's ``act(obs)``) for one episode per env seed, one env
at a time in this process (libsumo's one simulation per process).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np

from .sumo_env import SumoEnv

BASELINES = ("fixed", "actuated")


def play_episodes(
    env_cfg: Mapping[str, Any],
    seeds: Sequence[int],
    control: str = "agent",
    act: Optional[Callable[[np.ndarray], Any]] = None,
) -> List[Dict[str, Any]]:
    """One episode per env seed (``SumoEnv.seed(seed)`` then ``reset``); return each episode's figures.

    Args:
        env_cfg: ``SumoEnv`` config keys (pipeline keys such as ``manager_type`` are dropped).
        seeds: Env seeds; the SUMO seed of the episode is the first draw of ``default_rng(seed)``.
        control: ``'agent'`` (``act`` chooses) or a baseline of :data:`BASELINES` (actions are ignored).
        act: ``obs -> action`` for ``control='agent'``.

    Returns:
        Per episode: ``seed``, ``sumo_seed``, ``episode_return``, ``episode_len`` and the episode stats
        (``mean_waiting_time``, ``total_waiting_time``, ``mean_stopped``, ``mean_speed``).

    Raises:
        ValueError: ``control='agent'`` without ``act``.
    """
    from nervex.envs import ENV_PIPELINE_KEYS

    if control == "agent" and act is None:
        raise ValueError("play_episodes: control='agent' needs act(obs) -> action")
    cfg = {k: v for k, v in env_cfg.items() if k not in ENV_PIPELINE_KEYS}
    cfg["control"] = control
    out: List[Dict[str, Any]] = []
    for seed in seeds:
        env = SumoEnv(cfg)
        try:
            env.seed(int(seed))
            obs = env.reset()
            while True:
                timestep = env.step(act(obs) if act is not None and control == "agent" else 0)
                obs = timestep.obs
                if timestep.done:
                    break
        finally:
            env.close()
        info = timestep.info
        out.append(
            dict(
                seed=int(seed),
                sumo_seed=info["sumo_seed"],
                episode_return=info["episode_return"],
                episode_len=info["episode_len"],
                **info["episode_stats"],
            )
        )
    return out


def measure_baselines(env_cfg: Mapping[str, Any], seeds: Sequence[int]) -> Dict[str, List[Dict[str, Any]]]:
    """Both baselines on the same env seeds: ``{'fixed': [...], 'actuated': [...]}`` (see :func:`play_episodes`)."""
    return {control: play_episodes(env_cfg, seeds, control) for control in BASELINES}


__all__ = ["BASELINES", "play_episodes", "measure_baselines"]
