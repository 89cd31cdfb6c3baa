"""Serial actor (collector): steps an env manager with a policy's collect mode and returns train samples."""

from __future__ import annotations

import time
from collections import defaultdict, deque
from typing import Any, Callable, Deque, Dict, List, Optional

import numpy as np


class SerialActor:
    """Collects train samples in the main process.

    Each env has a trajectory cache; a transition goes into its env's cache, and when the episode ends or the
    cache holds ``collect_mode.traj_len`` transitions, the policy turns the cache into train samples (n-step
    returns, GAE... through its Adder).

    Args:
        cfg: The compiled ``actor`` section.
        env_manager: A started or startable env manager (``BaseEnvManager`` / ``SubprocessEnvManager``).
        collect_mode: ``policy.collect_mode``.
        callbacks: Optional object with ``on_episode_start(env_id)``, ``on_episode_step(env_id, transition)``,
            ``on_episode_end(env_id, episode_return, episode_len)`` (any may be missing).
        data_writer: Optional object with ``write(list_of_transitions)``; every finished trajectory goes there
            (the ``save_data`` option for offline RL).
    """

    config: Dict[str, Any] = dict(
        save_data="",  # directory: write every collected trajectory there for offline RL
        ep_info_window=100,  # episodes averaged into rollout/ep_rew_mean
    )

    def __init__(
        self,
        cfg: Dict[str, Any],
        env_manager: Any,
        collect_mode: Any,
        callbacks: Optional[Any] = None,
        data_writer: Optional[Any] = None,
    ) -> None:
        self._cfg = cfg
        self._env = env_manager
        self._policy = collect_mode
        self._callbacks = callbacks
        self._writer = data_writer
        self._traj_len = max(1, int(collect_mode.traj_len))
        self._traj_cache: Dict[int, Deque[Dict[str, Any]]] = defaultdict(deque)
        self._episode_buffer: Dict[int, List[Dict[str, Any]]] = defaultdict(list)
        self._pending: Dict[int, Any] = {}
        self.env_step = 0
        self.episode_count = 0
        self.abnormal_episodes = 0
        self.episode_returns: Deque[float] = deque(maxlen=int(cfg.get("ep_info_window", 100)))
        self.episode_lens: Deque[int] = deque(maxlen=int(cfg.get("ep_info_window", 100)))
        self.collect_time = 0.0
        self._started = False

    def _callback(self, name: str, *args: Any) -> None:
        fn: Optional[Callable[..., Any]] = getattr(self._callbacks, name, None)
        if fn is not None:
            fn(*args)

    def reset(self) -> None:
        """Restart every env and forget unfinished trajectories."""
        self._env.reset()
        self._traj_cache.clear()
        self._episode_buffer.clear()
        self._pending.clear()
        self._policy.reset()
        self._started = True
        for env_id in self._env.ready_obs:
            self._callback("on_episode_start", env_id)

    def generate_data(self, n_sample: int, setting: Optional[Dict[str, Any]] = None) -> List[Dict[str, Any]]:
        """Step the envs until at least ``n_sample`` train samples are ready.

        Args:
            n_sample: How many train samples to return at least.
            setting: Keyword arguments for the collect forward (e.g. ``{'eps': 0.1}``).

        Returns:
            The train samples (dicts of NumPy arrays and scalars).
        """
        if not self._started:
            self.reset()
        setting = setting or {}
        samples: List[Dict[str, Any]] = []
        start = time.perf_counter()
        while len(samples) < n_sample:
            if self._env.done:
                raise RuntimeError("the collector env manager has played all its episodes (env.episode_num)")
            obs = self._env.ready_obs
            data_id = list(obs.keys())
            output = self._policy.forward(data_id, obs, **setting)
            for env_id in data_id:
                # in async mode a timestep may answer an action sent in an earlier call: remember what it saw
                self._pending[env_id] = (obs[env_id], output[env_id])
            timesteps = self._env.step({env_id: output[env_id]["action"] for env_id in data_id})
            for env_id, timestep in timesteps.items():
                env_obs, env_output = self._pending.pop(env_id)
                self._handle_timestep(env_id, env_obs, env_output, timestep, samples)
        self.collect_time += time.perf_counter() - start
        return samples

    def _handle_timestep(
        self, env_id: int, obs: Any, output: Dict[str, Any], timestep: Any, samples: List[Dict[str, Any]]
    ) -> None:
        if timestep.info.get("abnormal", False):
            # the env crashed and was restarted: its half-finished episode is dropped, never stitched to the next
            self.abnormal_episodes += 1
            self._traj_cache[env_id].clear()
            self._episode_buffer.pop(env_id, None)
            self._policy.reset([env_id])
            self._callback("on_episode_start", env_id)
            return
        transition = self._policy.process_transition(obs, output, timestep)
        cache = self._traj_cache[env_id]
        cache.append(transition)
        if self._writer is not None:
            self._episode_buffer[env_id].append(transition)
        self.env_step += 1
        self._callback("on_episode_step", env_id, transition)
        if timestep.done or len(cache) >= self._traj_len:
            samples.extend(self._policy.get_train_sample(cache))
        if timestep.done:
            cache.clear()
            self._policy.reset([env_id])
            # a lost life (Atari's episodic life) is done for learning but the game goes on: no episode yet
            if "episode_return" in timestep.info:
                self._end_episode(env_id, timestep.info)

    def _end_episode(self, env_id: int, info: Dict[str, Any]) -> None:
        self.episode_count += 1
        episode_return = float(info["episode_return"])
        episode_len = int(info.get("episode_len", 0))
        self.episode_returns.append(episode_return)
        self.episode_lens.append(episode_len)
        if self._writer is not None:
            self._writer.write(self._episode_buffer.pop(env_id, []))
        self._callback("on_episode_end", env_id, episode_return, episode_len)
        self._callback("on_episode_start", env_id)

    def stats(self) -> Dict[str, float]:
        """SB3-style rollout figures over the last ``ep_info_window`` episodes."""
        out: Dict[str, float] = {"rollout/episodes": float(self.episode_count)}
        if self.episode_returns:
            out["rollout/ep_rew_mean"] = float(np.mean(self.episode_returns))
            out["rollout/ep_len_mean"] = float(np.mean(self.episode_lens))
        if self.abnormal_episodes:
            out["rollout/abnormal_episodes"] = float(self.abnormal_episodes)
        # the env manager's failure counters (restarts, timeouts, crashes...), as env/<name>
        for key, value in (getattr(self._env, "stats", None) or {}).items():
            out[f"env/{key}"] = float(value)
        return out

    def close(self) -> None:
        if self._writer is not None and hasattr(self._writer, "close"):
            self._writer.close()
        self._env.close()
