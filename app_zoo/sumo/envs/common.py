"""What the single-intersection env and the grid env share: config checks, sumo-rl's keyword arguments, the SUMO
seed of each episode and the per-episode traffic figures."""

from __future__ import annotations

import shutil
import tempfile
from typing import Any, Dict, Mapping, Optional

import numpy as np

from .backend import LibsumoSlot, load_sumo_rl, scenario_files
from .programs import ACTUATED_PROGRAM_ID, write_actuated_programs

CONTROLS = ("agent", "fixed", "actuated")
SEED_BOUND = 2**31 - 1  # SUMO's --seed is an int

# sumo-rl's system figures (``info`` of every step) -> the episode figure that averages them over decision steps
STEP_FIGURES = {
    "system_mean_waiting_time": "mean_waiting_time",
    "system_total_waiting_time": "total_waiting_time",
    "system_total_stopped": "mean_stopped",
    "system_mean_speed": "mean_speed",
}

SUMO_KEYS: Dict[str, Any] = dict(
    num_seconds=3600,
    delta_time=5,
    yellow_time=2,
    min_green=5,
    actuated_max_green=50,
    reward_fn="diff-waiting-time",
    control="agent",
    net_file=None,
    route_file=None,
)
"""Config keys of both SUMO envs (see :class:`~app_zoo.sumo.envs.sumo_env.SumoEnv` for their meaning)."""


def _int_key(cfg: Mapping[str, Any], key: str, low: int, where: str) -> int:
    value = cfg[key]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= 10**7:
        raise ValueError(f"{where} config key '{key}' must be an int in [{low}, 1e7], got {value!r}")
    return value


def check_sumo_keys(cfg: Mapping[str, Any], where: str) -> Dict[str, Any]:
    """The SUMO keys of ``cfg``, checked: ints in range, ``delta_time > yellow_time``, a known ``control``.

    Raises:
        ValueError: the first bad key, named with what would be right.
    """
    out = {key: cfg[key] for key in SUMO_KEYS}
    for key, low in (("num_seconds", 1), ("delta_time", 1), ("yellow_time", 0), ("min_green", 1)):
        out[key] = _int_key(cfg, key, low, where)
    out["actuated_max_green"] = _int_key(cfg, "actuated_max_green", out["min_green"], where)
    if out["delta_time"] <= out["yellow_time"]:
        raise ValueError(f"{where}: delta_time ({out['delta_time']}) must exceed yellow_time ({out['yellow_time']})")
    if out["num_seconds"] < out["delta_time"]:
        raise ValueError(f"{where}: num_seconds ({out['num_seconds']}) must be >= delta_time ({out['delta_time']})")
    if out["control"] not in CONTROLS:
        raise ValueError(f"{where} config key 'control' must be one of {CONTROLS}, got {out['control']!r}")
    if not isinstance(out["reward_fn"], str):
        raise ValueError(f"{where} config key 'reward_fn' must be a sumo-rl reward name, got {out['reward_fn']!r}")
    return out


class SumoBuild:
    """One env's SUMO resources: the libsumo slot, the temp dir of the actuated program, sumo-rl's kwargs.

    Args:
        who: A unique description of the env (what a second env's error names).
        scenario: A shipped scenario (``backend.SCENARIOS``).
        keys: The checked SUMO keys (:func:`check_sumo_keys`).
    """

    def __init__(self, who: str, scenario: str, keys: Mapping[str, Any]) -> None:
        self.who = who
        self.keys = dict(keys)
        self.sumo_rl = load_sumo_rl()
        reward_names = sorted(self.sumo_rl.TrafficSignal.reward_fns)
        if keys["reward_fn"] not in reward_names:
            raise ValueError(f"{who}: unknown reward_fn {keys['reward_fn']!r}; sumo-rl's rewards: {reward_names}")
        self.net_file, self.route_file = scenario_files(scenario, keys["net_file"], keys["route_file"])
        self._tmpdir: Optional[str] = None
        LibsumoSlot.acquire(who)

    def kwargs(self) -> Dict[str, Any]:
        """``SumoEnvironment``'s keyword arguments (the caller adds ``single_agent``)."""
        keys = self.keys
        extra = "--no-step-log"
        if keys["control"] == "actuated":
            self._tmpdir = tempfile.mkdtemp(prefix="nervex_sumo_")
            path = write_actuated_programs(self.net_file, self._tmpdir, keys["min_green"], keys["actuated_max_green"])
            extra += f" --additional-files {path}"
        return dict(
            net_file=self.net_file,
            route_file=self.route_file,
            use_gui=False,
            num_seconds=keys["num_seconds"],
            delta_time=keys["delta_time"],
            yellow_time=keys["yellow_time"],
            min_green=keys["min_green"],
            reward_fn=keys["reward_fn"],
            fixed_ts=keys["control"] != "agent",
            sumo_seed=0,  # every reset passes its own
            sumo_warnings=False,
            add_system_info=True,
            add_per_agent_info=False,
            additional_sumo_cmd=extra,
        )

    def select_program(self, sumo_env: Any) -> None:
        """After a reset: run the actuated program (``control: actuated``); check that SUMO really runs it."""
        if self.keys["control"] != "actuated":
            return
        lights = sumo_env.sumo.trafficlight
        for tl in sumo_env.ts_ids:
            lights.setProgram(tl, ACTUATED_PROGRAM_ID)
            logic = next(p for p in lights.getAllProgramLogics(tl) if p.programID == ACTUATED_PROGRAM_ID)
            if lights.getProgram(tl) != ACTUATED_PROGRAM_ID or logic.type != 3:  # 3 = TRAFFICLIGHT_TYPE_ACTUATED
                raise RuntimeError(f"{self.who}: SUMO did not switch light {tl} to the actuated program")

    def release(self) -> None:
        """Free the slot and the temp dir; safe to call twice."""
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None
        LibsumoSlot.release(self.who)


class EpisodeSeeds:
    """The SUMO seed of each episode: drawn from a generator that ``seed(s)`` reseeds (unseeded: from entropy).

    sumo-rl reuses its last seed when ``reset`` gets none, so every episode of a long run would replay the same
    traffic; here episode ``k`` after ``seed(s)`` gets the ``k``-th draw of ``default_rng(s)``.
    """

    def __init__(self) -> None:
        self._rng = np.random.default_rng()

    def seed(self, seed: int) -> None:
        self._rng = np.random.default_rng(int(seed))

    def next(self) -> int:
        return int(self._rng.integers(SEED_BOUND))


class EpisodeFigures:
    """An episode's traffic figures: means over its decision steps of sumo-rl's system figures
    (:data:`STEP_FIGURES`), and the mean waiting time per vehicle.

    ``vehicle_waiting_time`` is the mean, over every vehicle seen in the network at a decision step, of its
    accumulated waiting time (SUMO's ``getAccumulatedWaitingTime``: seconds below 0.1 m/s within sumo-rl's
    1000-second memory) at the last step it was seen; ``vehicles`` counts them. A vehicle is seen at least once
    after it crosses the light (the outgoing roads take longer than a decision to drive), so completed trips count
    their whole wait; vehicles still queued at the end count what they waited so far. Vehicles SUMO could not
    insert yet (a full entry lane) are not in the network and count in neither figure.
    """

    def __init__(self) -> None:
        self._sums = dict.fromkeys(STEP_FIGURES.values(), 0.0)
        self._steps = 0
        self._vehicle_wait: Dict[str, float] = {}

    def add(self, info: Mapping[str, Any], sumo: Any = None) -> None:
        """Add one decision step: its ``info`` (sumo-rl's system figures) and, given the simulation, each
        vehicle's accumulated waiting time."""
        for key, name in STEP_FIGURES.items():
            self._sums[name] += float(info[key])
        self._steps += 1
        if sumo is not None:
            vehicle = sumo.vehicle
            for veh in vehicle.getIDList():
                self._vehicle_wait[veh] = vehicle.getAccumulatedWaitingTime(veh)

    @property
    def vehicle_waits(self) -> Dict[str, float]:
        """Each vehicle seen so far -> its accumulated waiting time at the last step it was seen (a copy)."""
        return dict(self._vehicle_wait)

    def means(self) -> Dict[str, float]:
        """``mean_waiting_time``, ``total_waiting_time``, ``mean_stopped``, ``mean_speed`` (means over decision
        steps), ``vehicle_waiting_time`` and ``vehicles``; empty before the first step."""
        if not self._steps:
            return {}
        out = {name: total / self._steps for name, total in self._sums.items()}
        waits = self._vehicle_wait
        out["vehicle_waiting_time"] = sum(waits.values()) / len(waits) if waits else 0.0
        out["vehicles"] = float(len(waits))
        return out


__all__ = ["CONTROLS", "STEP_FIGURES", "SUMO_KEYS", "SumoBuild", "EpisodeSeeds", "EpisodeFigures", "check_sumo_keys"]
