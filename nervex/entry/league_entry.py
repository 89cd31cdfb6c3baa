"""Serial league training: every player of a ``league`` config trained in one process.

A config with a ``league`` section (``nervex -m serial -c league.yaml``) trains each learning player of the league
(main players, main exploiters, league exploiters) as the serial trainer trains one policy: its own policy, learner,
replay buffer and learn loop (``<run_dir>/players/<name>/``: ``eval.csv``, checkpoints, its TensorBoard events). One
iteration, per learning player in turn::

    match = league.choose(player)                     # self-play, PFSP over the history, an exploiter...
    actor = player.actors[seat]                       # the player's learning slot at seat 0 or 1 (alternating)
    actor.load_opponent(state of match's opponent)    # an act-only snapshot slot at the other seat
    samples = actor.collect(contract.collect, setting)
    league.record(player, opponent, outcome)          # each finished game into the payoff table and the ratings
    train on the samples (the learn loop, as serial mode)
    if league.snapshot_due(player, env_step): freeze a snapshot into the history (exploiters may reset)

Every ``league.eval.freq`` env steps (all players together) the league is evaluated: ``league/exploitability`` of the
main player's history mixed as fictitious play reports it (each snapshot with equal weight) and
``league/exploitability_main`` of the main player's current policy, where the game allows an exact computation
(matrix games; two-player zero-sum open_spiel games); the payoff table and ratings go to ``league/payoff.csv`` and
``league/ratings.csv``.
"""

from __future__ import annotations

import copy
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch
from easydict import EasyDict

from nervex.config import is_compiled, save_config
from nervex.policy import set_seed
from nervex.utils.log_helper import CsvWriter, ScalarWriter, build_logger, close_logger
from nervex.worker.actor.both_seats import SEATS, BothSeatsEvaluator
from nervex.worker.learner.loop import LearnLoop, Trained, train_scalar_name

from .builder import compile_config, make_buffer, make_env_managers, make_learner, make_policy


@dataclass
class LearningPlayer:
    """One learning player of the league: what the serial trainer holds for its one policy."""

    name: str
    policy: Any
    contract: Any
    learner: Any
    buffer: Any
    loop: LearnLoop
    actors: List[Any]
    initial_state: Dict[str, Any]
    collects: int = 0
    match: Any = None

    def snapshot(self) -> Dict[str, Any]:
        """Its current weights as an opponent loads them (model and extra state, copied)."""
        state = self.policy.state_dict()
        return copy.deepcopy({"model": state["model"], "extra": state.get("extra", {})})


class _Outcomes:
    """The actor callbacks of one player: each finished game's outcome goes to the league's payoff table."""

    def __init__(self, trainer: LeagueTrainer, player: str) -> None:
        self.trainer, self.player = trainer, player

    def on_episode_result(self, result: Any) -> None:
        outcome = result.outcomes.get(self.player)
        match = self.trainer.players[self.player].match
        if outcome is not None and match is not None:
            self.trainer.league.record(self.player, match.opponent, int(outcome))


class LeagueTrainer:
    """A whole league run in one process (see the module docstring).

    Args:
        cfg: A user config with a ``league`` section (compiled here) or a compiled one.
        seed: Overrides ``cfg.seed``; player ``i``'s network is initialised with ``seed + 1000 * i``.
        exp_name: Run directory name under ``run_root``.
        run_root: Parent folder of run directories.
    """

    def __init__(
        self, cfg: Mapping[str, Any], seed: Optional[int] = None, exp_name: Optional[str] = None, run_root: str = "runs"
    ) -> None:
        from nervex.league import League, MemoryStore
        from nervex.league.acting import env_game

        cfg = EasyDict(cfg if is_compiled(cfg) else compile_config(cfg))
        if seed is not None:
            cfg.seed = int(seed)
        self.cfg, self.seed = cfg, int(cfg.seed)
        set_seed(self.seed)
        if cfg.num_threads:
            torch.set_num_threads(int(cfg.num_threads))
        league_cfg = dict(cfg.league)  # resolved by compile_config: every key present, league.eval included
        self.eval_cfg = dict(league_cfg.pop("eval"))
        name = exp_name or cfg.exp_name or f"{cfg.env.get('game') or cfg.env.env_type}__league__{self.seed}"
        self.run_dir = os.path.join(run_root, f"{name}__{time.strftime('%Y%m%d-%H%M%S')}" if not exp_name else name)
        os.makedirs(os.path.join(self.run_dir, "league", "snapshots"), exist_ok=True)
        self.logger = build_logger(self.run_dir)
        self.scalar_writer = ScalarWriter(self.run_dir, cfg, self.logger)
        self.rng = np.random.default_rng(self.seed)
        self.league = League(MemoryStore(), league_cfg, rng=self.rng)
        self.snapshots: Dict[str, Dict[str, Any]] = {}  # a historical player's file (its snapshot name) -> its weights
        self.players: Dict[str, LearningPlayer] = {}
        self._managers: List[Any] = []
        self._writers: List[ScalarWriter] = []  # each learning player's
        self._closed = False
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        # the game whose exploitability is computed exactly (None: not computable, or league.eval.exploitability off)
        self._game = env_game(cfg.env) if self.eval_cfg["exploitability"] else None
        save_config(cfg, os.path.join(self.run_dir, "config.yaml"))
        self._payoff_csv = CsvWriter(
            os.path.join(self.run_dir, "league", "payoff.csv"),
            ["env_step", "home", "away", "games", "wins", "draws", "losses", "win_rate"],
        )
        self._ratings_csv = CsvWriter(
            os.path.join(self.run_dir, "league", "ratings.csv"), ["env_step", "player", "rating"]
        )
        self._last_eval_step = 0
        self.last_eval: Dict[str, float] = {}
        self.stopped, self.stop_reason = False, ""
        self._eval_mode: Any = None  # the eval-mode policy exploitability loads snapshots into
        self.mixture: Dict[str, Tuple[float, float]] = {}  # history id -> its Nash weight per seat (last evaluation)
        self._start = time.time()
        self.logger.info(f"run directory: {self.run_dir}; learning players: {', '.join(self.players)}")

    # ---- construction ------------------------------------------------------------------------------------------
    def _eval_policy(self) -> Any:
        """A fresh eval-mode policy of the config: what an opponent snapshot is loaded into."""
        return make_policy(self.cfg, self.env_info, enable_field=["eval"]).eval_mode

    def _build(self) -> None:
        from nervex.envs import create_env

        probe = create_env(self.cfg.env)
        self.env_info = probe.info()
        probe.close()
        if not getattr(self.env_info, "turn_based", False) or self.env_info.agent_num != 2:
            raise ValueError(
                f"a league needs a two-seat turn-based game (env '{self.cfg.env.env_type}' has "
                f"{self.env_info.agent_num} seat(s), turn_based={getattr(self.env_info, 'turn_based', False)})"
            )
        for index, name in enumerate(self.league.players()):
            self.players[name] = self._build_player(index, name)

    def _managers_for(self, index: int) -> Tuple[List[Any], List[Any]]:
        """Two collector env managers (the player at seat 0, at seat 1) and two evaluator ones."""
        collectors, evaluators = [], []
        for seat in SEATS:
            seed = self.seed + 10_000 * (2 * index + seat)
            collector, evaluator, _ = make_env_managers(self.cfg, seed)
            self._managers += [collector, evaluator]
            collectors.append(collector)
            evaluators.append(evaluator)
        return collectors, evaluators

    def _build_player(self, index: int, name: str) -> LearningPlayer:
        from nervex.worker.actor import SerialActor

        cfg = self.cfg
        torch.manual_seed(self.seed + 1000 * index)
        policy = make_policy(cfg, self.env_info)
        contract = type(policy).contract(policy.cfg)
        player_dir = os.path.join(self.run_dir, "players", name)
        os.makedirs(os.path.join(player_dir, "ckpt"), exist_ok=True)
        writer = ScalarWriter(player_dir)  # the player's own TensorBoard run (train/*, rollout/*, eval/*)
        self._writers.append(writer)
        learner = make_learner(cfg, policy, player_dir, self.logger, writer)
        collectors, evaluators = self._managers_for(index)
        actors = []
        for seat, manager in zip(SEATS, collectors):
            slots = {name: {"kind": "learn", "seats": [seat]}, "opponent": {"kind": "random", "seats": [1 - seat]}}
            actors.append(
                SerialActor(
                    {**dict(cfg.actor), "slots": slots},
                    manager,
                    policy.collect_mode,
                    callbacks=_Outcomes(self, name),
                    seed=self.seed + 2 * index + seat,
                    policy_factory=self._eval_policy,
                )
            )
        opponent = self.eval_cfg["opponent"]
        evaluator = BothSeatsEvaluator(cfg, evaluators, policy, name, opponent, self.seed + index, self._eval_policy)
        buffer = make_buffer(cfg, contract, self.seed + index)
        loop = LearnLoop(
            cfg,
            policy,
            learner,
            buffer,
            evaluator,
            run_dir=player_dir,
            logger=self.logger,
            scalar_writer=writer,
            seed=self.seed + index,
        )
        return LearningPlayer(name, policy, contract, learner, buffer, loop, actors, copy.deepcopy(policy.state_dict()))

    # ---- the loop ----------------------------------------------------------------------------------------------
    @property
    def env_step(self) -> int:
        """Env steps of every player together."""
        return sum(p.loop.env_step for p in self.players.values())

    def train(self) -> Dict[str, Any]:
        """One collect and learn phase of every learning player, then a league evaluation when due."""
        result: Dict[str, Any] = {}
        for player in self.players.values():
            result.update({f"{player.name}/{k}": v for k, v in self._train_player(player).items()})
        result["env_step"] = self.env_step
        if self.env_step - self._last_eval_step >= int(self.eval_cfg["freq"]):
            result.update(self.evaluate())
        if self.env_step >= int(self.cfg.max_env_step) and not self.stopped:
            self.stopped, self.stop_reason = True, f"max_env_step {self.cfg.max_env_step} reached"
        result["stop"] = self.stopped
        return result

    def _train_player(self, player: LearningPlayer) -> Dict[str, Any]:
        seat = player.collects % 2
        player.match = self.league.choose(player.name, seat=seat)
        actor = player.actors[seat]
        player.collects += 1
        actor.load_opponent(self._opponent_state(player))
        setting = player.policy.command_mode.get_setting_collect(player.loop.command_info())
        learn = player.contract.learn
        warmup = learn.random_warmup and player.loop.env_step < learn.learning_starts
        before = actor.env_step
        samples = actor.collect(player.contract.collect, setting, random_action=warmup)
        player.loop.env_step += actor.env_step - before
        trained = self._learn(player, samples)
        figures: Dict[str, Any] = {"env_step": player.loop.env_step, "train_iter": player.loop.train_iter}
        rollout = actor.stats()
        figures.update(rollout)
        figures.update({train_scalar_name(k): v for k, v in trained.figures.items()})
        if player.loop.eval_due():
            figures.update(player.loop.evaluate())
        player.loop.write_scalars(rollout)
        if self.league.snapshot_due(player.name, player.loop.env_step):
            self._freeze(player)
        return figures

    def _opponent_state(self, player: LearningPlayer) -> Dict[str, Any]:
        """The weights of the match's opponent: a historical snapshot's, an active player's current ones."""
        match = player.match
        if match.opponent_snapshot in self.snapshots:
            return self.snapshots[match.opponent_snapshot]
        if match.opponent in self.players:
            return self.players[match.opponent].snapshot()
        raise KeyError(f"the league chose opponent {match.opponent!r}, which has no weights here")

    def _learn(self, player: LearningPlayer, samples: List[Dict[str, Any]]) -> Trained:
        if player.contract.on_policy:
            return player.loop.train_rollout(samples)
        player.loop.store(samples)
        learn = player.contract.learn
        steps = learn.update_per_collect if player.loop.env_step >= learn.learning_starts else 0
        return player.loop.train_off_policy(steps)

    def _freeze(self, player: LearningPlayer) -> None:
        """Copy the player's weights into the league's history; reset it when the league says so."""
        step = player.loop.env_step
        state = player.snapshot()
        path = os.path.join(self.run_dir, "league", "snapshots", f"{player.name}@{step}.pt")
        torch.save(state, path)
        historical, reset = self.league.freeze(player.name, path, step)
        self.snapshots[path] = state
        for forgotten in self.league.forget_old_history(player.name):  # beyond league.keep_history
            self.snapshots.pop(forgotten, None)
            if os.path.exists(forgotten):
                os.remove(forgotten)
        if reset:
            player.policy.learn_mode.load_state_dict(copy.deepcopy(player.initial_state))
        self.logger.info(
            f"[league] {player.name} frozen at env_step={step} as {historical}{' (reset)' if reset else ''}"
        )

    # ---- league evaluation -------------------------------------------------------------------------------------
    def evaluate(self) -> Dict[str, float]:
        """Exploitability (where computable), the payoff table and the ratings; see the module docstring."""
        self._last_eval_step = step = self.env_step
        figures: Dict[str, float] = {"league/history": float(len(self.snapshots))}
        main = self.league.main_player()
        if self._game is not None and main in self.players:
            figures.update(self._exploitability(self._game, main))
        for row in self.league.to_rows():
            self._payoff_csv.write({"env_step": step, **row})
        for player_id, rating in self.league.ratings().items():
            self._ratings_csv.write({"env_step": step, "player": player_id, "rating": rating})
            if player_id in self.players:
                figures[f"league/rating/{player_id}"] = float(rating)
        self.scalar_writer.add_scalars(figures, step)
        self.last_eval = figures
        target = self.eval_cfg["stop_exploitability"]
        if target is not None and figures.get("league/exploitability", np.inf) < float(target):
            self.stopped, self.stop_reason = True, f"league/exploitability < {target}"
        shown = " ".join(f"{k}={v:.4g}" for k, v in figures.items())
        self.logger.info(f"[league] env_step={step} {shown}")
        return figures

    def _exploitability(self, game: Any, main: str) -> Dict[str, float]:
        """``league/exploitability`` (the main player's history as its meta-game's Nash mixture, as PSRO reports
        it), ``league/exploitability_fp`` (the uniform mixture, as fictitious play reports it) and
        ``league/exploitability_main`` (the current main player alone); the history's Nash weights are kept in
        ``self.mixture``."""
        from nervex.league.acting import greedy_action_probs
        from nervex.league.exploitability import exploitability
        from nervex.league.meta_game import seat_nash

        start = time.perf_counter()
        if self._eval_mode is None:
            self._eval_mode = self._eval_policy()
        mode = self._eval_mode  # one eval-mode policy, loaded with each snapshot as it is asked (cheaper than many)

        def strategy(state: Dict[str, Any]) -> Any:
            act = greedy_action_probs(mode)

            def probs(obs: np.ndarray, mask: np.ndarray, seat: np.ndarray) -> np.ndarray:
                mode.load_state_dict(state)
                return act(obs, mask, seat)

            return probs

        try:
            figures = {"league/exploitability_main": exploitability(game, strategy(self.players[main].snapshot()))}
            history = [h for h in self.league.history(main) if self.league.player(h).snapshot in self.snapshots]
            if history:
                strategies = [strategy(self.snapshots[self.league.player(h).snapshot]) for h in history]
                weights = seat_nash(game, strategies)  # (2, n): each seat's Nash mixture of the history's play
                self.mixture = {h: (float(w0), float(w1)) for h, w0, w1 in zip(history, *weights)}
                self.league.set_mixture(main, self.mixture)  # matchmaking 'nash' (PSRO) draws opponents by it
                figures["league/exploitability"] = exploitability(game, strategies, weights)
                figures["league/exploitability_fp"] = exploitability(game, strategies, [1.0] * len(strategies))
                figures["league/mixture_support"] = float((weights.max(axis=0) > 1e-6).sum())
        except ValueError as error:  # a game too large for an exact computation: say so once, then stop trying
            self.logger.warning(f"[league] exploitability not computed from now on: {error}")
            self._game = None
            return {}
        figures["league/exploitability_time"] = time.perf_counter() - start
        return figures

    def run(self, progress: Optional[bool] = None) -> Dict[str, Any]:
        """Train until ``max_env_step`` (all players) or ``league.eval.stop_exploitability``."""
        from tqdm import tqdm

        show = sys.stderr.isatty() if progress is None else progress
        result: Dict[str, Any] = {}
        with tqdm(total=int(self.cfg.max_env_step), disable=not show, unit="step", dynamic_ncols=True) as bar:
            while not self.stopped:
                result = self.train()
                bar.update(self.env_step - bar.n)
        if self._last_eval_step != self.env_step:
            self.evaluate()
        self.logger.info(f"league training stopped ({self.stop_reason}) at env_step={self.env_step}")
        return result

    def close(self) -> None:
        """Save each player's final checkpoint and close every env and log; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            for player in self.players.values():
                player.loop.finish()
                player.loop.close()
        finally:
            for manager in self._managers:
                manager.close()
            for writer in (getattr(self, "_payoff_csv", None), getattr(self, "_ratings_csv", None), *self._writers):
                if writer is not None:
                    writer.close()
            self.scalar_writer.close()
            close_logger(self.logger)

    def __enter__(self) -> LeagueTrainer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def league_pipeline(
    cfg: Mapping[str, Any],
    seed: int = 0,
    exp_name: Optional[str] = None,
    run_root: str = "runs",
    progress: Optional[bool] = None,
) -> LeagueTrainer:
    """Train a league config to its end; return the (closed) trainer, whose ``last_eval`` holds the final figures."""
    trainer = LeagueTrainer(cfg, seed=seed, exp_name=exp_name, run_root=run_root)
    try:
        trainer.run(progress=progress)
    finally:
        trainer.close()
    return trainer


__all__ = ["LeagueTrainer", "league_pipeline"]
