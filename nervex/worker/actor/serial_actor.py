"""Serial actor (collector): steps an env manager with a policy's collect mode and returns train samples."""

from __future__ import annotations

import copy
import time
from collections import defaultdict, deque
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

import gymnasium as gym
import numpy as np

from nervex.config import Field, compile_section
from nervex.policy.contract import CollectSpec

Transition = Dict[str, Any]


def action_clipper(space: Optional[gym.Space]) -> Callable[[Any], Any]:
    """A function that clips an action into a ``Box`` space's bounds (identity for other spaces).

    A Gaussian policy samples unbounded actions; the env gets them clipped, while the transition keeps what the
    policy sampled, so its log-probability stays right (as Stable-Baselines3 does).
    """
    if not isinstance(space, gym.spaces.Box) or not (np.isfinite(space.low).any() or np.isfinite(space.high).any()):
        return lambda action: action
    low, high = space.low, space.high

    def clip(action: Any) -> Any:
        return np.clip(action, low, high)

    return clip


class SerialActor:
    """Collects train samples in the main process, in the unit the policy's contract names (``CollectSpec``).

    Each env has a trajectory cache. A transition goes into its env's cache; the cache is handed to the policy's
    ``get_train_sample`` (n-step returns, GAE... through its Adder):

    - unit ``sample`` (off-policy): when the cache holds ``collect_mode.traj_len`` transitions or the episode ends;
      a cache not yet handed over carries into the next call;
    - unit ``rollout`` (on-policy): after exactly ``n`` steps of every env, every cache at once, after one batched
      ``collect_mode.bootstrap`` call has added ``next_value`` (etc.) to each truncated transition and to each
      cache's last one; nothing carries over (an env whose process crashed keeps only the steps since its restart);
    - unit ``episode``: at each episode's end; on-policy collection restarts the envs at each call.

    Args:
        cfg: The ``actor`` section.
        env_manager: A started or startable env manager (``BaseEnvManager`` / ``SubprocessEnvManager``).
        collect_mode: ``policy.collect_mode``.
        callbacks: Optional object with ``on_episode_start(env_id)``, ``on_episode_step(env_id, transition)``,
            ``on_episode_end(env_id, episode_return, episode_len)`` (any may be missing).
        data_writer: Optional object with ``write(list_of_transitions)``; every finished trajectory goes there
            (the ``save_data`` option for offline RL).
        seed: Seeds the uniformly random actions of a warm-up (``random_action``).
    """

    config: Dict[str, Any] = dict(
        save_data="",  # directory: write every collected trajectory there for offline RL
        ep_info_window=Field(100, ge=1),  # episodes averaged into rollout/ep_rew_mean
    )

    def __init__(
        self,
        cfg: Optional[Dict[str, Any]],
        env_manager: Any,
        collect_mode: Any,
        callbacks: Optional[Any] = None,
        data_writer: Optional[Any] = None,
        seed: int = 0,
    ) -> None:
        self._cfg = compile_section(SerialActor, cfg, "actor")
        self._env = env_manager
        self._policy = collect_mode
        self._callbacks = callbacks
        self._writer = data_writer
        self._seed = int(seed)
        self._traj_cache: Dict[int, Deque[Transition]] = defaultdict(deque)
        self._episode_buffer: Dict[int, List[Transition]] = defaultdict(list)
        self._pending: Dict[int, Tuple[Any, Dict[str, Any]]] = {}
        # transitions waiting for a bootstrap value: (transition, the observation after it)
        self._needs_value: Dict[int, List[Tuple[Transition, Any]]] = defaultdict(list)
        self._last_next_obs: Dict[int, Any] = {}
        self._last_done: Dict[int, bool] = {}
        self._act_space: Optional[gym.Space] = None
        self._clip: Optional[Callable[[Any], Any]] = None
        self.env_step = 0
        self.episode_count = 0
        self.abnormal_episodes = 0
        self.episode_returns: Deque[float] = deque(maxlen=int(self._cfg.ep_info_window))
        self.episode_lens: Deque[int] = deque(maxlen=int(self._cfg.ep_info_window))
        self.collect_time = 0.0
        self._started = False

    def _callback(self, name: str, *args: Any) -> None:
        fn: Optional[Callable[..., Any]] = getattr(self._callbacks, name, None)
        if fn is not None:
            fn(*args)

    def _action_space(self) -> gym.Space:
        if self._act_space is None:
            self._act_space = copy.deepcopy(self._env.env_info().act_space)
            self._act_space.seed(self._seed)
            self._clip = action_clipper(self._act_space)
        return self._act_space

    def reset(self) -> None:
        """Restart every env and forget unfinished trajectories."""
        self._env.reset()
        self._traj_cache.clear()
        self._episode_buffer.clear()
        self._pending.clear()
        self._needs_value.clear()
        self._last_done.clear()
        self._policy.reset(None)
        self._action_space()
        self._started = True
        for env_id in self._env.ready_obs:
            self._callback("on_episode_start", env_id)

    # ---- collecting --------------------------------------------------------------------------------------------
    def collect(
        self, spec: CollectSpec, setting: Optional[Dict[str, Any]] = None, random_action: bool = False
    ) -> List[Transition]:
        """Collect one unit of data (see the class docstring).

        Args:
            spec: What to collect: ``CollectSpec(unit, n)``.
            setting: Keyword arguments for the collect forward (e.g. ``{'eps': 0.1}``).
            random_action: Act uniformly at random from the env's action space (an off-policy warm-up).

        Returns:
            The train samples (dicts of NumPy arrays and scalars).
        """
        if not self._started:
            self.reset()
        setting = setting or {}
        start = time.perf_counter()
        if spec.unit == "sample":
            samples = self._collect_samples(spec.n, setting, random_action)
        elif spec.unit == "rollout":
            samples = self._collect_rollout(spec.n, setting)
        elif spec.unit == "episode":
            samples = self._collect_episodes(spec.n, setting, random_action, spec.restart_envs)
        else:
            raise ValueError(f"unknown collect unit '{spec.unit}'; valid: sample, rollout, episode")
        self.collect_time += time.perf_counter() - start
        return samples

    def generate_data(self, n_sample: int, setting: Optional[Dict[str, Any]] = None) -> List[Transition]:
        """Step the envs ``n_sample`` times in total (unit ``sample``) and return the samples that became ready."""
        return self.collect(CollectSpec("sample", n_sample), setting)

    def _step(
        self, setting: Dict[str, Any], random_action: bool, only: Optional[set] = None
    ) -> List[Tuple[int, Any, Dict[str, Any], Any]]:
        """One env-manager step: ``[(env_id, obs acted on, policy output, timestep)]``."""
        if self._env.done:
            raise RuntimeError("the collector env manager has played all its episodes (env.episode_num)")
        obs = self._env.ready_obs
        if only is not None:
            obs = {env_id: o for env_id, o in obs.items() if env_id in only}
        data_id = list(obs.keys())
        if random_action:
            space = self._action_space()
            output = {env_id: {"action": space.sample()} for env_id in data_id}
        else:
            output = self._policy.forward(data_id, obs, **setting)
        for env_id in data_id:
            # in async mode a timestep may answer an action sent in an earlier call: remember what it saw
            self._pending[env_id] = (obs[env_id], output[env_id])
        self._action_space()  # makes self._clip on the first step
        clip = self._clip
        timesteps = self._env.step({env_id: clip(output[env_id]["action"]) for env_id in data_id})
        return [(env_id, *self._pending.pop(env_id), timestep) for env_id, timestep in timesteps.items()]

    def _collect_samples(self, n: int, setting: Dict[str, Any], random_action: bool) -> List[Transition]:
        samples: List[Transition] = []
        steps = 0
        while steps < n:
            ready: List[int] = []
            for env_id, obs, output, timestep in self._step(setting, random_action):
                if self._record(env_id, obs, output, timestep):
                    steps += 1
                    cache = self._traj_cache[env_id]
                    if timestep.done or len(cache) >= self._policy.traj_len:
                        ready.append(env_id)
            self._hand_over(ready, samples)
        return samples

    def _collect_rollout(self, n: int, setting: Dict[str, Any]) -> List[Transition]:
        counts = {env_id: 0 for env_id in range(self._env.env_num)}
        while True:
            active = {env_id for env_id, count in counts.items() if count < n}
            if not active:
                break
            for env_id, obs, output, timestep in self._step(setting, False, only=active):
                if self._record(env_id, obs, output, timestep):
                    counts[env_id] += 1
        samples: List[Transition] = []
        self._hand_over(sorted(counts), samples, clear=True)  # on-policy: nothing carries into the next rollout
        return samples

    def _collect_episodes(
        self, n: int, setting: Dict[str, Any], random_action: bool, restart: bool
    ) -> List[Transition]:
        if restart:
            self.reset()  # every episode of this call starts under the current policy
        samples: List[Transition] = []
        episodes = self.episode_count
        while self.episode_count - episodes < n:
            ready: List[int] = []
            for env_id, obs, output, timestep in self._step(setting, random_action):
                if self._record(env_id, obs, output, timestep):
                    cache = self._traj_cache[env_id]
                    if timestep.done or (not restart and len(cache) >= self._policy.traj_len):
                        ready.append(env_id)
            self._hand_over(ready, samples)
        return samples

    # ---- one timestep ------------------------------------------------------------------------------------------
    def _record(self, env_id: int, obs: Any, output: Dict[str, Any], timestep: Any) -> bool:
        """Turn a timestep into a transition in its env's cache; False when the env crashed (nothing recorded)."""
        info = timestep.info
        if info.get("abnormal", False):
            # the env crashed and was restarted: its half-finished episode is dropped, never stitched to the next
            self.abnormal_episodes += 1
            self._traj_cache[env_id].clear()
            self._needs_value.pop(env_id, None)
            self._episode_buffer.pop(env_id, None)
            self._policy.reset([env_id])
            self._callback("on_episode_start", env_id)
            return False
        transition = self._policy.process_transition(obs, output, timestep)
        self._traj_cache[env_id].append(transition)
        self._last_next_obs[env_id] = timestep.obs
        self._last_done[env_id] = bool(timestep.done)
        if info.get("truncated", False) and not info.get("terminated", False):
            self._needs_value[env_id].append((transition, timestep.obs))
        if self._writer is not None:
            self._episode_buffer[env_id].append(transition)
        self.env_step += 1
        self._callback("on_episode_step", env_id, transition)
        if timestep.done:
            self._policy.reset([env_id])
            # a lost life (Atari's episodic life) is done for learning but the game goes on: no episode yet
            if "episode_return" in info:
                self._end_episode(env_id, info)
        return True

    def _hand_over(self, env_ids: List[int], samples: List[Transition], clear: bool = False) -> None:
        """Give the listed envs' trajectories to ``get_train_sample`` (after one batched bootstrap call); a finished
        episode's cache (or, with ``clear``, every listed cache) is emptied afterwards."""
        if not env_ids:
            return
        if self._policy.bootstrap is not None:
            self._bootstrap(env_ids)
        for env_id in env_ids:
            cache = self._traj_cache[env_id]
            if cache:
                samples.extend(self._policy.get_train_sample(cache))
            if clear or self._last_done.get(env_id, False):
                cache.clear()
            self._needs_value.pop(env_id, None)

    def _bootstrap(self, env_ids: List[int]) -> None:
        """Add ``next_<field>`` from one batched ``bootstrap`` forward to transitions whose next observation is not
        acted on: truncated ones, and the last one of a trajectory cut before its episode's end."""
        wanted: List[Tuple[Transition, Any]] = []
        for env_id in env_ids:
            cache = self._traj_cache[env_id]
            wanted.extend(self._needs_value.get(env_id, []))
            if cache and not self._last_done.get(env_id, False):
                wanted.append((cache[-1], self._last_next_obs[env_id]))
        if not wanted:
            return
        keys = list(range(len(wanted)))
        values = self._policy.bootstrap(keys, {k: next_obs for k, (_, next_obs) in zip(keys, wanted)})
        for k, (transition, _) in zip(keys, wanted):
            for field, value in values[k].items():
                transition[f"next_{field}"] = value

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
