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

    Each transition goes to the policy's Adder (``collect_mode.adder``), which owns the trajectories and returns
    the train samples each transition completes (n-step transitions, GAE rollouts, sequences). The actor only
    provides what needs the policy's forward: a truncated transition gets ``next_<field>`` from one batched
    ``collect_mode.bootstrap`` call before it reaches the Adder, and so does the last transition of an on-policy
    rollout before the Adder is flushed.

    - unit ``sample`` (off-policy): ``n`` env steps; the samples the Adder emitted meanwhile (incomplete windows
      carry into the next call);
    - unit ``rollout`` (on-policy): exactly ``n`` steps of every env, then every env's Adder buffer is flushed;
      nothing carries over (an env whose process crashed keeps only the steps since its restart);
    - unit ``episode``: until ``n`` episodes ended; on-policy collection restarts the envs at each call.

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
        self._adder = collect_mode.adder
        self._episode_buffer: Dict[int, List[Transition]] = defaultdict(list)
        self._pending: Dict[int, Tuple[Any, Dict[str, Any]]] = {}
        # per env: its last transition and the observation after it (a rollout's end bootstraps from it)
        self._last: Dict[int, Tuple[Transition, Any]] = {}
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
        self._adder.reset()
        self._episode_buffer.clear()
        self._pending.clear()
        self._last.clear()
        self._policy.reset(None)
        self._action_space()
        self._started = True
        for env_id in self._env.ready_obs:
            self._adder.add_first(env_id)
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
            steps += self._record_step(self._step(setting, random_action), samples)
        return samples

    def _collect_rollout(self, n: int, setting: Dict[str, Any]) -> List[Transition]:
        counts = {env_id: 0 for env_id in range(self._env.env_num)}
        samples: List[Transition] = []
        while True:
            active = {env_id for env_id, count in counts.items() if count < n}
            if not active:
                break
            self._record_step(self._step(setting, False, only=active), samples, counts)
        # on-policy: nothing carries into the next rollout; a rollout cut mid-episode bootstraps from its last obs
        cut = [
            self._last[env_id]
            for env_id in sorted(counts)
            if env_id in self._last and not self._last[env_id][0]["done"]
        ]
        if cut and self._policy.bootstrap is not None:
            self._bootstrap(cut)
        for env_id in sorted(counts):
            samples.extend(self._adder.flush(env_id))
        return samples

    def _collect_episodes(
        self, n: int, setting: Dict[str, Any], random_action: bool, restart: bool
    ) -> List[Transition]:
        if restart:
            self.reset()  # every episode of this call starts under the current policy
        samples: List[Transition] = []
        episodes = self.episode_count
        while self.episode_count - episodes < n:
            self._record_step(self._step(setting, random_action), samples)
        return samples

    def _record_step(
        self,
        results: List[Tuple[int, Any, Dict[str, Any], Any]],
        samples: List[Transition],
        counts: Optional[Dict[int, int]] = None,
    ) -> int:
        """Record one env-manager step's timesteps, bootstrap its truncated transitions (one batched call), feed
        them to the Adder and append what it emits to ``samples``. Returns how many transitions were recorded."""
        recorded: List[Tuple[int, Transition, Any]] = []
        for env_id, obs, output, timestep in results:
            transition = self._record(env_id, obs, output, timestep)
            if transition is not None:
                recorded.append((env_id, transition, timestep))
                if counts is not None:
                    counts[env_id] += 1
        if self._policy.bootstrap is not None:
            truncated = [
                (transition, timestep.obs)
                for _, transition, timestep in recorded
                if timestep.info.get("truncated", False) and not timestep.info.get("terminated", False)
            ]
            if truncated:
                self._bootstrap(truncated)
        for env_id, transition, timestep in recorded:
            samples.extend(self._adder.add(env_id, transition))
            if timestep.done:
                self._adder.add_first(env_id)
        return len(recorded)

    # ---- one timestep ------------------------------------------------------------------------------------------
    def _record(self, env_id: int, obs: Any, output: Dict[str, Any], timestep: Any) -> Optional[Transition]:
        """Turn a timestep into a transition (None when the env crashed: nothing recorded)."""
        info = timestep.info
        if info.get("abnormal", False):
            # the env crashed and was restarted: its half-finished episode is dropped, never stitched to the next
            self.abnormal_episodes += 1
            self._adder.add_first(env_id)
            self._last.pop(env_id, None)
            self._episode_buffer.pop(env_id, None)
            self._policy.reset([env_id])
            self._callback("on_episode_start", env_id)
            return None
        transition = self._policy.process_transition(obs, output, timestep)
        self._last[env_id] = (transition, timestep.obs)
        if self._writer is not None:
            self._episode_buffer[env_id].append(transition)
        self.env_step += 1
        self._callback("on_episode_step", env_id, transition)
        if timestep.done:
            self._policy.reset([env_id])
            # a lost life (Atari's episodic life) is done for learning but the game goes on: no episode yet
            if "episode_return" in info:
                self._end_episode(env_id, info)
        return transition

    def _bootstrap(self, wanted: List[Tuple[Transition, Any]]) -> None:
        """Add ``next_<field>`` from one batched ``bootstrap`` forward to transitions whose next observation is not
        acted on: truncated ones, and the last one of a rollout cut before its episode's end."""
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
