"""The SUMO envs on libsumo: backend, contract, seeding, baselines, the one-simulation rule, the PettingZoo shim
(skipped without pip install -e .[sumo])."""

from __future__ import annotations

import glob
import importlib.util
import os
import types
from typing import List, Tuple

import numpy as np
import pytest

# looked up, not imported: sumo_rl binds traci at import, and only app_zoo.sumo imports it on libsumo
if any(importlib.util.find_spec(name) is None for name in ("sumo", "libsumo", "sumo_rl")):
    pytest.skip("needs pip install -e .[sumo]", allow_module_level=True)

from app_zoo.sumo.envs import (  # noqa: E402 - after the importorskip
    LibsumoBusyError,
    LibsumoSlot,
    SumoEnv,
    SumoGridEnv,
    apply_agent_selector_shim,
    load_sumo_rl,
)
from app_zoo.sumo.envs.baselines import measure_baselines, play_episodes  # noqa: E402
from nervex.envs import check_env, create_env  # noqa: E402

SHORT = {"num_seconds": 100}  # 20 decisions of 5 s
CONFIG_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "..", "app_zoo", "sumo", "config")


@pytest.fixture(autouse=True)
def no_simulation_left():
    """Every test starts and ends with this process's libsumo slot free (a leak would fail the next test)."""
    assert LibsumoSlot.holder() is None
    yield
    assert LibsumoSlot.holder() is None, f"{LibsumoSlot.holder()} was not closed"


def rollout(cfg: dict, seed: int, actions: List[int]) -> Tuple[List[np.ndarray], List[float], dict]:
    env = SumoEnv(cfg)
    try:
        env.seed(seed)
        observations, rewards = [env.reset()], []
        for action in actions:
            ts = env.step(action)
            observations.append(ts.obs)
            rewards.append(ts.reward)
            if ts.done:
                return observations, rewards, ts.info
    finally:
        env.close()
    raise AssertionError("the episode did not end")


def test_sumo_rl_runs_on_libsumo():
    sumo_rl = load_sumo_rl()
    import libsumo
    import traci

    assert traci.isLibsumo() and traci.start is libsumo.start  # traci re-exports libsumo: no socket
    assert sumo_rl.environment.env.LIBSUMO is True
    env = SumoEnv(SHORT)
    try:
        env.reset()
        assert env.sumo_env.sumo is traci  # sumo-rl's connection is the libsumo module itself
    finally:
        env.close()


def test_agent_selector_shim_rebinds_only_sumo_rls_name():
    from pettingzoo.utils import AgentSelector

    load_sumo_rl()
    from sumo_rl.environment import env as env_module

    assert env_module.agent_selector is AgentSelector
    fake = types.ModuleType("fake_env")
    fake.agent_selector = types.ModuleType("pettingzoo.utils.agent_selector")
    fake.agent_selector.AgentSelector = AgentSelector
    assert apply_agent_selector_shim(fake) is True and fake.agent_selector is AgentSelector
    assert apply_agent_selector_shim(fake) is False  # already a class: left alone
    selector = fake.agent_selector(["1", "2"])
    assert selector.reset() == "1" and selector.next() == "2" and selector.is_last()


def test_spaces_time_limit_and_episode_figures():
    env = create_env({"env_type": "sumo", **SHORT})
    try:
        info = env.info()
        # 2 green phases + min-green flag + density and queue of 4 incoming lanes
        assert info.obs_space.shape == (11,) and info.obs_space.dtype == np.float32
        assert info.act_space.n == 2 and info.max_episode_steps == 20
        env.seed(0)
        obs = env.reset()
        assert obs.dtype == np.float32 and obs[:2].tolist() == [1.0, 0.0]  # green phase 0 at the start
        for step in range(1, 21):
            ts = env.step(step % 2)
            assert ts.done == (step == 20)
        assert ts.info["truncated"] and not ts.info["terminated"]
        assert ts.info["episode_len"] == 20 and isinstance(ts.reward, float)
        stats = ts.info["episode_stats"]
        assert set(stats) == {
            "mean_waiting_time",
            "total_waiting_time",
            "mean_stopped",
            "mean_speed",
            "vehicle_waiting_time",
            "vehicles",
        }
        assert stats["vehicles"] > 20 and stats["mean_speed"] > 0  # ~0.7 veh/s enter over 100 s
        with pytest.raises(RuntimeError, match="before reset"):
            env.step(0)
        env.reset()
        with pytest.raises(ValueError, match=r"outside Discrete\(2\)"):
            env.step(2)
    finally:
        env.close()


def test_check_env_contract_and_seeding():
    check_env(SumoEnv(SHORT), n_steps=45)  # two episode ends per rollout; same seed identical, another differs


def test_one_seed_reproduces_an_episode_and_another_differs():
    actions = [i // 3 % 2 for i in range(20)]
    obs_a, rew_a, info_a = rollout(SHORT, 7, actions)
    obs_b, rew_b, info_b = rollout(SHORT, 7, actions)
    _, rew_c, info_c = rollout(SHORT, 8, actions)
    assert all(np.array_equal(a, b) for a, b in zip(obs_a, obs_b)) and rew_a == rew_b
    assert info_a["episode_stats"] == info_b["episode_stats"]
    assert info_a["sumo_seed"] == int(np.random.default_rng(7).integers(2**31 - 1))
    samples = []
    for _ in range(2):
        env = SumoEnv(SHORT)
        env.seed(7)  # before the build: the action space is seeded when it is made
        samples.append([int(env.info().act_space.sample()) for _ in range(16)])
        env.close()
    assert samples[0] == samples[1]
    assert rew_c != rew_a and info_c["sumo_seed"] != info_a["sumo_seed"]


def test_later_episodes_draw_new_sumo_seeds():
    env = SumoEnv({"num_seconds": 10})
    try:
        env.seed(3)
        seeds = []
        for _ in range(3):
            env.reset()
            while not (ts := env.step(0)).done:
                pass
            seeds.append(ts.info["sumo_seed"])
    finally:
        env.close()
    rng = np.random.default_rng(3)
    assert seeds == [int(rng.integers(2**31 - 1)) for _ in range(3)]  # not sumo-rl's replay of its last seed


def test_fixed_time_baseline_is_reproducible_from_a_seed():
    # the routes are 'probability' flows: SUMO's seed decides every departure, so another seed changes the figures
    first, again, other = play_episodes({"num_seconds": 300}, [5, 5, 6], control="fixed")
    assert first == again
    assert other["sumo_seed"] != first["sumo_seed"] and other["vehicles"] != first["vehicles"]
    assert other["vehicle_waiting_time"] != first["vehicle_waiting_time"]


def test_actuated_baseline_runs_sumos_actuated_logic():
    phases = {}
    for control in ("fixed", "actuated"):
        env = SumoEnv({"num_seconds": 300, "control": control})
        try:
            env.seed(1)
            env.reset()
            lights = env.sumo_env.sumo.trafficlight
            assert lights.getProgram("t") == ("actuated" if control == "actuated" else "0")
            trace = []
            while not env.step(0).done:
                trace.append(lights.getPhase("t"))
            phases[control] = trace
        finally:
            env.close()

    # the static program holds each green 42 s (8-9 decisions of 5 s); the actuated one ends a green once the
    # light's detectors see a gap, well before 42 s on the 0.2 veh/s north-south road
    def green_runs(trace):
        runs, count = [], 0
        for prev, phase in zip(trace, trace[1:] + [-1]):
            count += 1
            if phase != prev:
                if prev in (0, 2):
                    runs.append(count)
                count = 0
        return runs[1:-1]  # whole runs only

    assert min(green_runs(phases["fixed"])) >= 8
    assert min(green_runs(phases["actuated"])) <= 4 and phases["actuated"] != phases["fixed"]


def test_vehicle_waiting_time_is_sumos_tripinfo_waiting_time(tmp_path):
    import xml.etree.ElementTree as ET

    env = SumoEnv({"num_seconds": 600, "control": "actuated"})
    try:
        env.sumo_env.additional_sumo_cmd += f" --tripinfo-output {tmp_path / 'trips.xml'}"
        env.seed(1)
        env.reset()
        while not env.step(0).done:
            pass
        waits = env.figures.vehicle_waits
    finally:
        env.close()  # SUMO writes the tripinfo file when the simulation closes
    trips = {
        t.get("id"): float(t.get("waitingTime")) for t in ET.parse(tmp_path / "trips.xml").getroot().iter("tripinfo")
    }
    assert len(trips) > 300 and len(waits) > len(trips)  # the vehicles still on the road have no tripinfo yet
    assert all(waits[veh] == wait for veh, wait in trips.items())  # every completed trip: SUMO's own figure


def test_baselines_measured_on_the_same_seeds():
    figures = measure_baselines({"num_seconds": 300}, [0, 1])
    assert [r["sumo_seed"] for r in figures["fixed"]] == [r["sumo_seed"] for r in figures["actuated"]]
    for fixed, actuated in zip(figures["fixed"], figures["actuated"]):
        assert actuated["vehicle_waiting_time"] < fixed["vehicle_waiting_time"]  # 42 s greens vs 0.2/0.5 veh/s


def test_a_second_simulation_in_one_process_is_refused():
    first = SumoEnv(SHORT)
    try:
        first.reset()
        second = SumoEnv(SHORT)
        with pytest.raises(LibsumoBusyError, match="one simulation per process.*manager_type: subprocess"):
            second.reset()
        grid = SumoGridEnv({"num_seconds": 50})
        with pytest.raises(LibsumoBusyError, match=r"SumoEnv#\d+\(scenario='single-intersection'\) already holds"):
            grid.info()
        first.step(0)  # the first simulation is untouched
    finally:
        first.close()
    second.reset()  # free again once the first env is closed
    second.close()


@pytest.mark.parametrize(
    "cfg, match",
    [
        ({"control": "manual"}, "'control' must be one of"),
        ({"delta_time": 2, "yellow_time": 2}, "must exceed yellow_time"),
        ({"scenario": "3x3grid"}, "'scenario' must be one of"),
        ({"num_seconds": 0}, r"'num_seconds' must be an int in \[1, 1e7\]"),
        ({"min_gren": 5}, "did you mean 'min_green'"),
    ],
)
def test_bad_config_is_named(cfg, match):
    with pytest.raises((ValueError, KeyError), match=match):
        SumoEnv(cfg)


def test_unknown_reward_fn_is_named_and_frees_the_slot():
    with pytest.raises(ValueError, match="unknown reward_fn 'wait'; sumo-rl's rewards"):
        SumoEnv({"reward_fn": "wait"}).info()


def test_a_net_of_several_lights_is_sent_to_the_grid_env():
    with pytest.raises(ValueError, match="the net has 4 traffic lights; SumoEnv drives one"):
        SumoEnv({"scenario": "2x2grid"}).info()  # the autouse fixture checks the slot was freed


def test_grid_through_the_pettingzoo_parallel_adapter():
    env = SumoGridEnv({"num_seconds": 50})
    try:
        info = env.info()
        assert info.agent_ids == ("1", "2", "5", "6") and info.act_space.nvec.tolist() == [4, 4, 4, 4]
        assert info.max_episode_steps == 10 and env.global_state_source == "concat_obs"
        env.seed(0)
        obs = env.reset()
        assert obs["obs"].shape == (4, 21) and obs["action_mask"].all()
        for step in range(1, 11):
            ts = env.step(np.array([step % 4, 0, 1, 2]))
            assert ts.reward.shape == (4,) and ts.done == (step == 10)
        assert ts.info["truncated"] and ts.info["episode_stats"]["vehicles"] > 0
    finally:
        env.close()


def test_grid_passes_pettingzoo_parallel_api_test():
    from pettingzoo.test import parallel_api_test

    from nervex.envs import to_parallel_env

    env = SumoGridEnv({"num_seconds": 100})
    try:
        parallel_api_test(to_parallel_env(env), num_cycles=25)
    finally:
        env.close()


@pytest.mark.parametrize("name", ["single_intersection_dqn", "single_intersection_ppo", "grid2x2_mappo"])
def test_shipped_configs_compile(name):
    from nervex.config import read_config
    from nervex.entry.builder import compile_config

    cfg = compile_config(read_config(os.path.join(CONFIG_DIR, f"{name}.yaml")))
    assert cfg.env.manager_type == "subprocess"
    # one env per worker process: the libsumo rule
    assert cfg.env.manager.worker_num >= max(cfg.env.collector_env_num, cfg.env.evaluator_env_num)


def test_dqn_config_trains_in_subprocess_workers(tmp_path):
    from nervex.config import apply_overrides, read_config
    from nervex.entry import SerialTrainer

    over = ["env.num_seconds=50", "max_env_step=200", "evaluator.eval_freq=150", "learner.hook.log_show_after_iter=0"]
    cfg = apply_overrides(read_config(os.path.join(CONFIG_DIR, "single_intersection_dqn.yaml")), over)
    with SerialTrainer(cfg, seed=0, run_root=str(tmp_path)) as trainer:
        result = trainer.run(progress=False)
    assert result["env_step"] == 200 and result["train_iter"] > 150  # one gradient step per env step after 32
    assert result["rollout/episodes"] >= 10  # 10-decision episodes
    (eval_csv,) = glob.glob(str(tmp_path / "*" / "eval.csv"))
    header, row = open(eval_csv).read().splitlines()[:2]
    columns = dict(zip(header.split(","), row.split(",")))
    assert float(columns["vehicle_waiting_time"]) > 0 and float(columns["n_episode"]) == 2


def test_grid_baselines_run_every_light_and_ignore_actions():
    figures = {}
    for control in ("fixed", "actuated"):
        env = SumoGridEnv({"num_seconds": 100, "control": control})
        try:
            env.seed(2)
            env.reset()
            lights = env.parallel_env.unwrapped.env.sumo.trafficlight
            programs = {lights.getProgram(tl) for tl in env.info().agent_ids}
            assert programs == {"actuated" if control == "actuated" else "0"}
            while not (ts := env.step(np.array([3, 3, 3, 3]))).done:
                pass
            figures[control] = ts.info["episode_stats"]
        finally:
            env.close()
    assert figures["fixed"] != figures["actuated"]
