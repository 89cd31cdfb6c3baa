"""sumo-rl's 2x2 grid (four lights, one agent each) as a cooperative nervex env (registered as ``'sumo_grid'``)."""

from __future__ import annotations

import itertools
import warnings
from typing import Any, Dict, Mapping, Optional, Tuple

from nervex.envs import PettingZooParallelEnv
from nervex.utils import ENV_REGISTRY

from .backend import SCENARIOS
from .common import SUMO_KEYS, EpisodeFigures, EpisodeSeeds, SumoBuild, check_sumo_keys

_instance_ids = itertools.count()


def _parallel_base() -> type:
    from pettingzoo.utils.wrappers import BaseParallelWrapper

    return BaseParallelWrapper


class _SumoParallel:
    """sumo-rl's PettingZoo ``parallel_env`` with a fresh SUMO seed per episode, the episode figures, the slot.

    Mixed into PettingZoo's ``BaseParallelWrapper`` when built (PettingZoo is imported only then).
    """

    def __init__(self, build: SumoBuild) -> None:
        env = build.sumo_rl.parallel_env(**build.kwargs())
        super().__init__(env)
        self.build = build
        self.seeds = EpisodeSeeds()
        self.figures = EpisodeFigures()
        self.sumo_seed: Optional[int] = None

    def reset(self, seed: Optional[int] = None, options: Optional[dict] = None) -> Tuple[dict, dict]:
        if seed is not None:
            self.seeds.seed(seed)
        self.sumo_seed = self.seeds.next()
        out = self.env.reset(seed=self.sumo_seed, options=options)
        self.build.select_program(self.env.unwrapped.env)
        self.figures = EpisodeFigures()
        return out

    def step(self, actions: Dict[str, Any]) -> Tuple[dict, dict, dict, dict, dict]:
        out = self.env.step(actions)  # under control fixed/actuated sumo-rl ignores the actions
        first = next(iter(out[4].values()), None)
        if first:
            self.figures.add(first, self.env.unwrapped.env.sumo)  # every agent's info carries the same system_* figures
        return out

    def close(self) -> None:
        try:
            self.env.close()
        finally:
            self.build.release()


@ENV_REGISTRY.register("sumo_grid")
class SumoGridEnv(PettingZooParallelEnv):
    """Several SUMO traffic lights, one agent each, in the cooperative layout of ``PettingZooParallelEnv``.

    Config keys: ``env_id`` is the scenario (``'2x2grid'``: four lights, 0.1 veh/s on each of four through routes);
    ``env_kwargs`` must stay empty (every sumo-rl argument this env passes is a key below); ``team_reward``,
    ``max_episode_steps``, ``episode_stats`` as ``PettingZooParallelEnv``; the SUMO keys as
    :class:`~app_zoo.sumo.envs.sumo_env.SumoEnv` (``control: fixed/actuated`` run the baselines, ignoring actions).

    Rewards: each light's ``reward_fn`` (per agent). ``info['episode_stats']`` at the end: the network's
    ``mean_waiting_time``, ``total_waiting_time``, ``mean_stopped`` and ``mean_speed``, means over decision steps.
    Seeding as ``SumoEnv`` (episode ``k`` after ``seed(s)``: the ``k``-th draw of ``default_rng(s)``); one libsumo
    simulation per process.
    """

    config: Dict[str, Any] = dict(
        env_id="2x2grid", env_kwargs={}, team_reward="sum", max_episode_steps=None, episode_stats=None, **SUMO_KEYS
    )

    def __init__(self, cfg: Optional[Mapping[str, Any]] = None) -> None:
        super().__init__(cfg)
        if self._cfg["env_id"] not in SCENARIOS:
            raise ValueError(
                f"SumoGridEnv config key 'env_id' must be one of {sorted(SCENARIOS)}, got {self._cfg['env_id']!r}"
            )
        if self._cfg["env_kwargs"]:
            raise ValueError(
                f"SumoGridEnv config key 'env_kwargs' must be empty; its SUMO settings are keys of their own: "
                f"{sorted(SUMO_KEYS)}"
            )
        self._keys = check_sumo_keys(self._cfg, "SumoGridEnv")
        self._who = f"SumoGridEnv#{next(_instance_ids)}(scenario={self._cfg['env_id']!r})"

    def _make(self) -> Any:
        build = SumoBuild(self._who, self._cfg["env_id"], self._keys)
        try:
            cls = type("SumoParallelEnv", (_SumoParallel, _parallel_base()), {})
            return cls(build)
        except BaseException:
            build.release()
            raise

    def _build(self) -> Any:
        with warnings.catch_warnings():  # PettingZoo's conversion warns that sumo-rl declares no render_mode
            warnings.filterwarnings("ignore", message=".*render_mode.*")
            env = super()._build()
        decisions = -(-self._keys["num_seconds"] // self._keys["delta_time"])
        self._info = self._info._replace(max_episode_steps=self._cfg["max_episode_steps"] or decisions)
        return env

    def episode_stats(self) -> Dict[str, float]:
        """The network's traffic figures over the episode, then a config's own ``episode_stats`` function's."""
        return {**self._env.figures.means(), **super().episode_stats()}

    def __repr__(self) -> str:
        return self._who


__all__ = ["SumoGridEnv"]
