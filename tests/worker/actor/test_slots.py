"""Player slots: the ``actor.slots`` config, one forward per slot per step, turn-based transitions per (env, seat) with
the rewards in between summed, episode results per slot with outcomes, and the evaluator's exact win/draw/loss counts.

Every expected number follows from ``TurnEnv``'s schedule: move ``t`` rewards the seats ``[t, -t]``, the last move
adds the outcome, and only action ``t % 3`` is legal at move ``t + 1``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import gymnasium as gym
import numpy as np
import pytest

from nervex.config import ConfigError
from nervex.envs import BaseEnvInfo
from nervex.policy import CollectSpec
from nervex.policy.common_policy import standard_transition
from nervex.policy.modes import CollectMode
from nervex.rl_utils import Adder
from nervex.worker.actor import SerialActor, SerialEvaluator
from nervex.worker.actor.env_manager import BaseEnvManager
from nervex.worker.actor.slots import assign_seats, parse_slots

from .envs import ClockEnv, TurnEnv


def legal_action(obs: Any) -> int:
    """The first legal action (a ``callable`` slot's function); 0 without a mask."""
    return int(np.flatnonzero(obs["action_mask"])[0]) if isinstance(obs, dict) else 0


class ScriptedPolicy:
    """A collect and eval mode that plays the legal action, records every forward's keys, and keeps 1-step samples
    from a real Adder."""

    def __init__(self) -> None:
        self.calls: List[List[int]] = []
        self.resets: List[Optional[List[int]]] = []
        self.loaded: List[Dict[str, Any]] = []
        self.adder = Adder(kind="nstep", nstep=1, gamma=0.9)

    def forward(self, data_id: List[int], obs: Dict[int, Any], **setting: Any) -> Dict[int, Dict[str, Any]]:
        self.calls.append(list(data_id))
        return {k: {"action": legal_action(obs[k])} for k in data_id}

    def reset(self, data_id: Optional[List[int]]) -> None:
        self.resets.append(data_id)

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.loaded.append(state)

    @property
    def collect_mode(self) -> CollectMode:
        return CollectMode(self.forward, standard_transition, self.adder, None, self.reset, self.load_state_dict)


def turn_actor(slots: Optional[Dict[str, Any]], env_cfgs: List[Dict[str, Any]], **kwargs: Any) -> SerialActor:
    manager = BaseEnvManager(TurnEnv, env_cfgs, len(env_cfgs))
    policy = kwargs.pop("policy", ScriptedPolicy())
    return SerialActor({"slots": slots}, manager, policy.collect_mode, **kwargs)


VS_RANDOM = {"main": {"kind": "learn", "seats": [0]}, "opponent": {"kind": "random", "seats": [1]}}


# ---- config -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "slots, message",
    [
        ({"main": {"kind": "lern", "seats": [0]}}, "key 'actor.slots.main.kind' is 'lern'; did you mean 'learn'?"),
        ({"main": {"kind": "learn", "seat": [0]}}, "unknown key 'actor.slots.main.seat' for a slot of kind 'learn'; did you mean 'seats'?"),
        ({"main": {"kind": "learn", "path": "x.pt"}}, "unknown key 'actor.slots.main.path' for a slot of kind 'learn'; valid: kind, seats"),
        ({"op": {"kind": "random", "seats": [0]}}, "key 'actor.slots' has no learning slot (op); give one slot kind: learn"),
        ({"main": {"kind": "learn", "seats": []}}, "key 'actor.slots.main.seats' expects 'all' or a non-empty list"),
        ({"main": {"kind": "learn"}, "me": {"kind": "callable", "fn": "nofunction"}}, "key 'actor.slots.me.fn' must name a function as 'module:function'"),
    ],
)  # fmt: skip
def test_a_malformed_slot_is_an_error_that_names_the_key(slots, message):
    with pytest.raises(ConfigError) as error:
        parse_slots(slots)
    assert message in str(error.value)


TURN_INFO = TurnEnv().info()


@pytest.mark.parametrize(
    "slots, message",
    [
        ({"main": {"kind": "learn", "seats": [0]}}, "no slot acts for seat(s) ['p1']"),
        ({"main": {"kind": "learn", "seats": [0, 1]}, "op": {"kind": "random", "seats": ["p2"]}}, "names seat 'p2'; the env's seats are 0..1 or the ids ['p0', 'p1']"),
        ({"main": {"kind": "learn", "seats": [0, "p1"]}, "op": {"kind": "random", "seats": [1]}}, "seat 'p1' already belongs to slot 'main'"),
    ],
)  # fmt: skip
def test_every_seat_belongs_to_exactly_one_slot(slots, message):
    with pytest.raises(ConfigError) as error:
        assign_seats(parse_slots(slots), TURN_INFO)
    assert message in str(error.value)


def test_a_simultaneous_envs_agents_are_not_split_across_slots():
    box = gym.spaces.Box(-1, 1, (2, 3))
    info = BaseEnvInfo(2, box, gym.spaces.MultiDiscrete([2, 2]), agent_ids=("a", "b"))
    assert assign_seats(parse_slots(None), info) == ("main", "main")
    with pytest.raises(ConfigError, match="act simultaneously; one slot must act for all of them"):
        assign_seats(parse_slots(VS_RANDOM), info)


def test_a_single_agent_actor_has_one_learning_slot_keyed_by_env_id():
    policy = ScriptedPolicy()
    actor = SerialActor({}, BaseEnvManager(ClockEnv, [{}, {}], 2), policy.collect_mode)
    try:
        assert actor.seating.seat_slots == ("main",) and [s.name for s in actor.seating.learning] == ["main"]
        samples = actor.collect(CollectSpec("sample", 6), {})
        assert len(samples) == 6 and actor.env_step == 6
        assert policy.calls == [[0, 1]] * 3  # one forward over both envs per step
        assert actor.seating.describe() == "slots: main (learn) seats [0]"
    finally:
        actor.close()


def test_the_seating_line_states_the_team_reduction_of_a_slot_of_several_seats():
    """What the run's log says of slots: their kinds and seats and, when a slot holds several seats, the reduction."""
    from nervex.worker.actor.seating import Seating
    from nervex.worker.actor.slots import LearnSlot, RandomSlot

    space, rng = gym.spaces.Discrete(3), np.random.default_rng(0)
    team = LearnSlot("team", ScriptedPolicy().collect_mode, space, rng)
    seating = Seating({"team": team, "other": RandomSlot("other", space, rng)}, ["team", "other", "team"], True, "mean")
    assert seating.describe() == (
        "slots: team (learn) seats [0, 2]; other (random) seats [1]; turn-based; "
        "a slot's reward and return are the mean over its seats (env team_reward)"
    )


# ---- turn-based transitions -----------------------------------------------------------------------------------------
def test_learning_seat_transitions_sum_the_rewards_until_its_next_decision():
    policy = ScriptedPolicy()
    actor = turn_actor(VS_RANDOM, [{"env_tag": 0.0}, {"env_tag": 1.0}], policy=policy)
    try:
        samples = actor.collect(CollectSpec("episode", 2), {})
        assert actor.env_step == 10 and actor.episode_count == 2
        # seat 0 decides at t = 0, 2, 4: moves 1+2, 3+4, then 5 with the win (+1)
        per_env = {tag: [s for s in samples if s["obs"]["obs"][0] == tag] for tag in (0.0, 1.0)}
        for env_samples in per_env.values():
            assert [float(s["reward"][0]) for s in env_samples] == [3.0, 7.0, 6.0]
            assert [int(s["obs"]["obs"][1]) for s in env_samples] == [0, 2, 4]
            assert [int(s["next_obs"]["obs"][1]) for s in env_samples] == [2, 4, 5]
            assert [bool(s["done"]) for s in env_samples] == [False, False, True]
            assert [int(s["action"]) for s in env_samples] == [0, 2, 1]  # t % 3 at t = 0, 2, 4
        assert len(samples) == 6  # the learning seat's decisions only
        # one forward per step, for the slot whose seat is to play; keys env_id * 2 + seat
        assert policy.calls == [[0, 2]] * 3
        stats = actor.stats()
        assert stats["rollout/ep_rew_mean"] == 16.0  # 1 + 2 + 3 + 4 + 5 + 1
        assert (stats["rollout/win_rate"], stats["rollout/wins"], stats["rollout/draws"], stats["rollout/losses"]) == (
            1.0, 2.0, 0.0, 0.0,
        )  # fmt: skip
    finally:
        actor.close()


def test_one_learning_slot_for_both_seats_keeps_a_trajectory_per_seat():
    policy = ScriptedPolicy()
    actor = turn_actor(None, [{"winners": [-1]}], policy=policy)
    try:
        samples = actor.collect(CollectSpec("episode", 1), {})
        by_seat = {seat: [s for s in samples if s["obs"]["to_play"] == seat] for seat in (0, 1)}
        assert [float(s["reward"][0]) for s in by_seat[0]] == [3.0, 7.0, 5.0]  # a draw adds 0
        assert [float(s["reward"][0]) for s in by_seat[1]] == [-5.0, -9.0]
        assert [bool(s["done"]) for s in by_seat[1]] == [False, True]
        assert policy.calls == [[0], [1], [0], [1], [0]]
        # a slot of both seats: the team's return (15 - 15), an outcome only where its seats share one (a draw)
        stats = actor.stats()
        assert (stats["rollout/ep_rew_mean"], stats["rollout/draws"], stats["rollout/win_rate"]) == (0.0, 1.0, 0.0)
    finally:
        actor.close()


class Results:
    def __init__(self) -> None:
        self.results: List[Any] = []
        self.ends: List[tuple] = []

    def on_episode_result(self, result: Any) -> None:
        self.results.append(result)

    def on_episode_end(self, env_id: int, episode_return: float, episode_len: int) -> None:
        self.ends.append((env_id, episode_return, episode_len))


def test_an_episode_ends_with_returns_and_outcomes_per_slot():
    callbacks = Results()
    actor = turn_actor(VS_RANDOM, [{"winners": [1, -1, 0]}], callbacks=callbacks)
    try:
        actor.collect(CollectSpec("episode", 3), {})
        assert [r.returns for r in callbacks.results] == [
            {"main": 14.0, "opponent": -14.0},
            {"main": 15.0, "opponent": -15.0},
            {"main": 16.0, "opponent": -16.0},
        ]
        assert [r.outcomes for r in callbacks.results] == [
            {"main": -1, "opponent": 1},
            {"main": 0, "opponent": 0},
            {"main": 1, "opponent": -1},
        ]
        assert callbacks.ends == [(0, 14.0, 5), (0, 15.0, 5), (0, 16.0, 5)]
        stats = actor.stats()
        assert (stats["rollout/wins"], stats["rollout/draws"], stats["rollout/losses"]) == (1.0, 1.0, 1.0)
        assert stats["rollout/win_rate"] == pytest.approx(1 / 3)
    finally:
        actor.close()


def test_the_warm_up_and_the_random_slot_take_legal_actions_only():
    # TurnEnv raises on an illegal action; only t % 3 is legal, so a uniform draw over all 3 would fail at once
    actor = turn_actor(VS_RANDOM, [{}, {}], seed=3)
    try:
        samples = actor.collect(CollectSpec("sample", 40), {}, random_action=True)
        assert actor.env_step == 40
        assert all(int(s["action"]) == int(s["obs"]["obs"][1]) % 3 for s in samples)
    finally:
        actor.close()


def test_a_callable_slot_plays_its_function():
    slots = {
        "main": {"kind": "learn", "seats": [1]},
        "script": {"kind": "callable", "seats": [0], "fn": f"{__name__}:legal_action"},
    }
    policy = ScriptedPolicy()
    actor = turn_actor(slots, [{}], policy=policy)
    try:
        samples = actor.collect(CollectSpec("episode", 1), {})
        assert [float(s["reward"][0]) for s in samples] == [-5.0, -10.0]  # seat 1 decides at t = 1, 3; loses (-1)
        assert policy.calls == [[1], [1]]
    finally:
        actor.close()


def test_a_snapshot_slot_needs_weights_and_an_opponent_replaces_the_act_only_seats():
    opponent = ScriptedPolicy()
    slots = {"main": {"kind": "learn", "seats": [0]}, "snap": {"kind": "snapshot", "seats": [1]}}
    actor = turn_actor(slots, [{}], policy_factory=lambda: opponent)
    try:
        with pytest.raises(RuntimeError, match=r"slot 'snap' \(kind snapshot\) has no weights"):
            actor.collect(CollectSpec("episode", 1), {})
        actor.load_slot("snap", {"model": 1})
        actor.reset()
        actor.collect(CollectSpec("episode", 1), {})
        assert opponent.loaded == [{"model": 1}] and opponent.calls == [[1], [1]]
        actor.load_opponent({"model": 2})  # a parallel task's opponent: a fresh snapshot slot at seat 1
        assert actor.seating.seat_slots == ("main", "task_opponent")
        assert opponent.loaded[-1] == {"model": 2}
        actor.load_opponent(None)
        assert actor.seating.seat_slots == ("main", "snap")
        with pytest.raises(ValueError, match="only a snapshot slot loads a state dict"):
            actor.load_slot("main", {})
    finally:
        actor.close()


def test_a_rollout_flushes_each_learning_seat_and_drops_a_decision_still_open():
    policy = ScriptedPolicy()
    actor = turn_actor(VS_RANDOM, [{"episode_len": 9}], policy=policy)
    try:
        samples = actor.collect(CollectSpec("rollout", 4), {})
        # moves 1-4: seat 0 decided at t = 0 (closed at t = 2) and t = 2 (closed at t = 4); nothing else open
        assert [float(s["reward"][0]) for s in samples] == [3.0, 7.0]
        samples = actor.collect(CollectSpec("rollout", 2), {})
        # moves 5-6: seat 0 decided at t = 4, closed at t = 6
        assert [float(s["reward"][0]) for s in samples] == [11.0]
        samples = actor.collect(CollectSpec("rollout", 1), {})  # move 7: seat 0's decision at t = 6 is still open
        assert samples == []
    finally:
        actor.close()


# ---- the evaluator ------------------------------------------------------------------------------------------------
def test_the_evaluator_counts_wins_draws_and_losses_exactly():
    manager = BaseEnvManager(TurnEnv, [{"winners": [0, -1, 1]}, {"winners": [0, 0, -1]}], 2, episode_num=3)
    policy = ScriptedPolicy()
    evaluator = SerialEvaluator({"n_episode": 6, "stop_val": 16.0}, manager, policy, slots=VS_RANDOM, seed=1)
    try:
        result = evaluator.eval()
        assert result["eval/n_episode"] == 6
        assert (result["eval/wins"], result["eval/draws"], result["eval/losses"]) == (3, 2, 1)
        assert result["eval/win_rate"] == 0.5
        assert result["eval/mean_reward"] == pytest.approx((16 + 15 + 14 + 16 + 16 + 15) / 6)
        assert result["stop"] is False
        assert all(call in ([0, 2], [0], [2]) for call in policy.calls)  # the eval mode plays seat 0 only
    finally:
        evaluator.close()
