"""Serial actor (collector): steps an env manager with its player slots and returns the learning slots' samples."""

from __future__ import annotations

import time
from collections import defaultdict, deque
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

import gymnasium as gym
import numpy as np

from nervex.config import Field, compile_section
from nervex.policy.contract import CollectSpec

from .figures import episode_figures, window_means
from .seating import EpisodeResult, Seating, build_seating
from .slots import LearnSlot, PolicySlot, Slot
from .turns import Decision, OpenDecisions, seat_timesteps

Transition = Dict[str, Any]
Step = Tuple[int, int, Any, Dict[str, Any], Any]
"""One env's part of an env-manager step: ``(env_id, acting seat, obs acted on, slot output, timestep)``."""
OPPONENT_SLOT = "task_opponent"
"""The snapshot slot ``SerialActor.load_opponent`` seats at every act-only seat (a parallel task's opponent)."""


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

    The actor acts for player slots (``actor.slots``, see ``nervex.worker.actor.slots``): each env-manager step
    makes one forward per slot over the envs whose acting seat the slot holds. Only the learning slots' transitions
    reach the policy's Adder (``collect_mode.adder``, keyed per env, or per (env, seat) in a turn-based env), which
    owns the trajectories and returns the train samples each transition completes (n-step transitions, GAE rollouts,
    sequences). In a turn-based env a learning seat's transition runs from its decision to its next one (or the
    episode's end), with its rewards of every step in between summed (``nervex.worker.actor.turns``). The actor only
    provides what needs the policy's forward: a truncated transition gets ``next_<field>`` from one batched
    ``collect_mode.bootstrap`` call before it reaches the Adder, and so does the last transition of an on-policy
    rollout before the Adder is flushed. A single-agent env has one seat and one learning slot. With independent
    learners (``independent: true``, ``nervex.worker.actor.agents``) every agent of a simultaneous-move env is a
    trajectory of its own, keyed ``env_id * agent_num + agent``; the units below still count env steps.

    - unit ``sample`` (off-policy): ``n`` env steps; the samples the Adder emitted meanwhile (incomplete windows
      carry into the next call);
    - unit ``rollout`` (on-policy): exactly ``n`` steps of every env, then every env's Adder buffer is flushed;
      nothing carries over (an env whose process crashed keeps only the steps since its restart; a turn-based
      seat's decision still waiting for its next observation is dropped);
    - unit ``episode``: until ``n`` episodes ended; on-policy collection restarts the envs at each call.

    Args:
        cfg: The ``actor`` section.
        env_manager: A started or startable env manager (``BaseEnvManager`` / ``SubprocessEnvManager``).
        collect_mode: ``policy.collect_mode``: the learning slots act with it.
        callbacks: Optional object with ``on_episode_start(env_id)``, ``on_episode_step(env_id, transition)``,
            ``on_episode_end(env_id, episode_return, episode_len)`` (the first learning slot's return) and
            ``on_episode_result(result: EpisodeResult)`` (any may be missing).
        data_writer: Optional object with ``write(list_of_transitions)``; every finished trajectory of a learning
            seat goes there (the ``save_data`` option for offline RL).
        seed: Seeds the random actions: the warm-up's (``random_action``) and the ``random`` slots'.
        policy_factory: Makes a fresh eval-mode policy (``policy.eval_mode``) for a ``snapshot`` slot.
    """

    config: Dict[str, Any] = dict(
        save_data="",  # directory: write every collected trajectory there for offline RL
        ep_info_window=Field(100, ge=1),  # episodes averaged into rollout/ep_rew_mean and rollout/win_rate
        slots=None,  # player slots {name: {kind, seats, ...}}; null: one learning slot for every seat
    )

    def __init__(
        self,
        cfg: Optional[Dict[str, Any]],
        env_manager: Any,
        collect_mode: Any,
        callbacks: Optional[Any] = None,
        data_writer: Optional[Any] = None,
        seed: int = 0,
        policy_factory: Optional[Callable[[], Any]] = None,
    ) -> None:
        self._cfg = compile_section(SerialActor, cfg, "actor")
        self._env = env_manager
        self._policy = collect_mode
        self._callbacks = callbacks
        self._writer = data_writer
        self._seed = int(seed)
        self._policy_factory = policy_factory
        self._adder = collect_mode.adder
        env_info = env_manager.env_info()
        self._clip = action_clipper(env_info.act_space)
        self.seating = build_seating(self._cfg.slots, env_info, self._learn_slot, self._seed, policy_factory)
        self._configured = self.seating  # load_opponent(None) seats the configured slots again
        self._decisions = OpenDecisions()
        self._episode_buffer: Dict[int, List[Transition]] = defaultdict(list)
        self._pending: Dict[int, Tuple[int, Any, Dict[str, Any]]] = {}
        # per trajectory key: its last transition and the observation after it (a rollout's end bootstraps from it)
        self._last: Dict[int, Tuple[Transition, Any]] = {}
        self.env_step = 0
        self.episode_count = 0
        self.abnormal_episodes = 0
        window = int(self._cfg.ep_info_window)
        self.episode_returns: Deque[float] = deque(maxlen=window)
        self.episode_lens: Deque[int] = deque(maxlen=window)
        self.episode_outcomes: Deque[int] = deque(maxlen=window)  # the first learning slot's, games only
        # team and per-agent returns (many agents), the env's episode stats (nervex.worker.actor.figures)
        self.episode_figures: Deque[Dict[str, float]] = deque(maxlen=window)
        self.outcome_counts: Dict[int, int] = {1: 0, 0: 0, -1: 0}  # since the actor was built
        self.collect_time = 0.0
        self._started = False

    def _learn_slot(self, name: str, rng: np.random.Generator, agent_spaces: Optional[Tuple[Any, ...]]) -> Slot:
        return LearnSlot(name, self._policy, self._env.env_info().act_space, rng, agent_spaces)

    def _callback(self, name: str, *args: Any) -> None:
        fn: Optional[Callable[..., Any]] = getattr(self._callbacks, name, None)
        if fn is not None:
            fn(*args)

    def reset(self) -> None:
        """Restart every env and forget unfinished trajectories."""
        self._env.reset()
        self._adder.reset()
        self._episode_buffer.clear()
        self._pending.clear()
        self._last.clear()
        self._decisions.drop()
        self.seating.reset(None)
        self._started = True
        for env_id in self._env.ready_obs:
            for _, key in self.seating.learning_keys(env_id):
                self._adder.add_first(key)
            self._callback("on_episode_start", env_id)

    # ---- slots -------------------------------------------------------------------------------------------------
    def load_slot(self, name: str, state: Dict[str, Any]) -> None:
        """Load a policy state dict into the snapshot slot ``name``.

        Raises:
            KeyError: no slot of that name; ValueError: the slot is not a snapshot slot.
        """
        slot = self.seating.slots.get(name)
        if slot is None:
            raise KeyError(f"no slot {name!r}; slots: {list(self.seating.slots)}")
        if not isinstance(slot, PolicySlot):
            raise ValueError(f"slot {name!r} is of kind {slot.kind!r}; only a snapshot slot loads a state dict")
        slot.load_state_dict(state)

    def load_opponent(self, state: Optional[Dict[str, Any]]) -> None:
        """Seat a snapshot slot (``OPPONENT_SLOT``) holding ``state`` at every act-only seat; None: the configured
        act-only slots play again. The change takes effect at the next step (mid-episode for unit ``sample``).

        Raises:
            ValueError: every seat belongs to a learning slot (no seat to give an opponent).
        """
        if state is None:
            self.seating = self._configured
            return
        configured = self._configured
        if all(slot.learns for slot in (configured.slot_of(s) for s in range(configured.seat_num))):
            raise ValueError(
                "a task names an opponent, but every seat of this env belongs to a learning slot "
                f"({dict(enumerate(configured.seat_slots))}); give the opponent's seats an act-only slot in actor.slots"
            )
        if self.seating is configured:
            slot = PolicySlot(OPPONENT_SLOT, "snapshot", self._snapshot_policy(), loaded=False)
            slots = {n: s for n, s in configured.slots.items() if s.learns}
            seat_slots = [n if configured.slots[n].learns else OPPONENT_SLOT for n in configured.seat_slots]
            self.seating = Seating(
                {**slots, OPPONENT_SLOT: slot},
                seat_slots,
                configured.turn_based,
                configured.team_reward,
                configured.seat_ids,
                configured.split,
            )
        self.load_slot(OPPONENT_SLOT, state)
        self.seating.reset(None)

    def _snapshot_policy(self) -> Any:
        if self._policy_factory is None:
            raise ValueError("an opponent snapshot needs a policy to load into: build the actor with policy_factory")
        return self._policy_factory()

    # ---- collecting --------------------------------------------------------------------------------------------
    def collect(
        self, spec: CollectSpec, setting: Optional[Dict[str, Any]] = None, random_action: bool = False
    ) -> List[Transition]:
        """Collect one unit of data (see the class docstring).

        Args:
            spec: What to collect: ``CollectSpec(unit, n)``.
            setting: Keyword arguments for the learning slots' collect forward (e.g. ``{'eps': 0.1}``).
            random_action: The learning slots act uniformly at random among legal actions (an off-policy warm-up).

        Returns:
            The learning slots' train samples (dicts of NumPy arrays and scalars).
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

    def _step(self, setting: Dict[str, Any], random_action: bool, only: Optional[set] = None) -> List[Step]:
        """One env-manager step, one forward per slot: ``[(env_id, seat, obs acted on, output, timestep)]``."""
        if self._env.done:
            raise RuntimeError("the collector env manager has played all its episodes (env.episode_num)")
        obs = self._env.ready_obs
        if only is not None:
            obs = {env_id: o for env_id, o in obs.items() if env_id in only}
        acted = self.seating.act(obs, setting, random_action)
        for env_id, (seat, output) in acted.items():
            # in async mode a timestep may answer an action sent in an earlier call: remember what it saw
            self._pending[env_id] = (seat, obs[env_id], output)
        timesteps = self._env.step({env_id: self._clip(acted[env_id][1]["action"]) for env_id in obs})
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
        self._last.clear()  # only this rollout's last transitions are bootstrapped at its end
        while True:
            active = {env_id for env_id, count in counts.items() if count < n}
            if not active:
                break
            self._record_step(self._step(setting, False, only=active), samples, counts)
        # on-policy: nothing carries into the next rollout; a rollout cut mid-episode bootstraps from its last obs
        keys = [key for env_id in sorted(counts) for _, key in self.seating.learning_keys(env_id)]
        cut = [self._last[key] for key in keys if key in self._last and not self._last[key][0]["done"]]
        if cut and self._policy.bootstrap is not None:
            self._bootstrap(cut)
        self._decisions.drop()  # a turn-based decision still waiting for its next observation is no transition yet
        for key in keys:
            samples.extend(self._adder.flush(key))
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
        self, results: List[Step], samples: List[Transition], counts: Optional[Dict[int, int]] = None
    ) -> int:
        """Record one env-manager step: the learning seats' transitions it completes, bootstrapped where truncated
        (one batched call), fed to the Adder, what it emits appended to ``samples``. Returns the env steps recorded
        (a crashed env's step is none)."""
        recorded: List[Tuple[int, Transition, Any]] = []
        steps = 0
        for env_id, seat, obs, output, timestep in results:
            if timestep.info.get("abnormal", False):
                self._drop_episode(env_id)
                continue
            steps += 1
            self.env_step += 1
            if counts is not None:
                counts[env_id] += 1
            for decided_seat, acted_on, acted, seat_timestep in self._completed(env_id, seat, obs, output, timestep):
                key = self.seating.key(env_id, decided_seat)
                recorded.append((key, self._record(env_id, key, acted_on, acted, seat_timestep), seat_timestep))
            if timestep.done:
                self.seating.reset([env_id])
                # a lost life (Atari's episodic life) is done for learning but the game goes on: no episode yet
                if "episode_return" in timestep.info:
                    self._end_episode(env_id, timestep.info)
        if self._policy.bootstrap is not None:
            truncated = [
                (transition, timestep.obs)
                for _, transition, timestep in recorded
                if timestep.info.get("truncated", False) and not timestep.info.get("terminated", False)
            ]
            if truncated:
                self._bootstrap(truncated)
        for key, transition, timestep in recorded:
            samples.extend(self._adder.add(key, transition))
            if timestep.done:
                self._adder.add_first(key)
        return steps

    # ---- one timestep ------------------------------------------------------------------------------------------
    def _completed(self, env_id: int, seat: int, obs: Any, output: Dict[str, Any], timestep: Any) -> List[Decision]:
        """The learning seats' decisions this env step completes: the step itself in a simultaneous (or
        single-agent) env, whose one slot learns; every alive agent's with independent learners
        (``AgentSplit.timesteps``); in a turn-based env those ``seat_timesteps`` closes."""
        seating = self.seating
        if seating.split is not None:
            return seating.split.timesteps(obs, output, timestep)
        if not seating.turn_based:
            return [(0, obs, output, timestep)]
        learning = tuple(s for s, _ in seating.learning_keys(env_id))
        next_seat = None if timestep.done else seating.acting_seat(timestep.obs)
        return seat_timesteps(
            self._decisions, env_id, seat, obs, output, timestep, learning, next_seat, seating.seat_num
        )

    def _record(self, env_id: int, key: int, obs: Any, output: Dict[str, Any], timestep: Any) -> Transition:
        """Turn a (seat) timestep into a transition of trajectory ``key``."""
        transition = self._policy.process_transition(obs, output, timestep)
        self._last[key] = (transition, timestep.obs)
        if self._writer is not None:
            self._episode_buffer[key].append(transition)
        self._callback("on_episode_step", env_id, transition)
        return transition

    def _drop_episode(self, env_id: int) -> None:
        """The env crashed and was restarted: its half-finished episode is dropped, never stitched to the next."""
        self.abnormal_episodes += 1
        for _, key in self.seating.learning_keys(env_id):
            self._adder.add_first(key)
            self._last.pop(key, None)
            self._episode_buffer.pop(key, None)
        self._decisions.drop(env_id)
        self.seating.reset([env_id])
        self._callback("on_episode_start", env_id)

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
        result: EpisodeResult = self.seating.result(env_id, info)
        episode_return = result.returns[self.seating.main]
        self.episode_returns.append(episode_return)
        self.episode_lens.append(result.length)
        self.episode_figures.append(episode_figures(result.agent_returns, result.stats))
        outcome = result.outcomes.get(self.seating.main)
        if outcome is not None:
            self.episode_outcomes.append(outcome)
            self.outcome_counts[outcome] += 1
        if self._writer is not None:
            for _, key in self.seating.learning_keys(env_id):
                self._writer.write(self._episode_buffer.pop(key, []))
        self._callback("on_episode_end", env_id, episode_return, result.length)
        self._callback("on_episode_result", result)
        self._callback("on_episode_start", env_id)

    def stats(self) -> Dict[str, float]:
        """SB3-style rollout figures over the last ``ep_info_window`` episodes (the first learning slot's return);
        for games, ``rollout/win_rate`` over that window and the ``rollout/wins``/``draws``/``losses`` since the
        actor was built; for many agents ``rollout/team_return_sum``, ``rollout/team_return_mean`` and
        ``rollout/return/<agent_id>``, and every ``info['episode_stats']`` entry as ``rollout/<name>``, over the
        window (``nervex.worker.actor.figures``)."""
        out: Dict[str, float] = {"rollout/episodes": float(self.episode_count)}
        if self.episode_returns:
            out["rollout/ep_rew_mean"] = float(np.mean(self.episode_returns))
            out["rollout/ep_len_mean"] = float(np.mean(self.episode_lens))
        out.update({f"rollout/{name}": value for name, value in window_means(self.episode_figures).items()})
        if self.episode_outcomes:
            out["rollout/win_rate"] = float(np.mean([o == 1 for o in self.episode_outcomes]))
            for name, outcome in (("wins", 1), ("draws", 0), ("losses", -1)):
                out[f"rollout/{name}"] = float(self.outcome_counts[outcome])
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
