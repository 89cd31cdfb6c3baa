"""The serial league trainer: a league config trains every learning player in one process, to a measured result."""

from __future__ import annotations

import csv
import os

import pytest

from nervex.config import ConfigError, read_config
from nervex.entry import compile_config
from nervex.entry.cli import main as cli_main
from nervex.entry.league_entry import LeagueTrainer

pytest.importorskip("scipy")
RPS = "app_zoo/games/matrix/config/rps_league.yaml"
ZERO_SUM_2X2 = "app_zoo/games/matrix/config/zero_sum_2x2_league.yaml"
KUHN = "app_zoo/games/poker/config/kuhn_league.yaml"


def rows(path: str):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_a_league_reaches_the_target_and_writes_its_tables(tmp_path):
    cfg = read_config(ZERO_SUM_2X2)
    with LeagueTrainer(cfg, seed=0, exp_name="game", run_root=str(tmp_path)) as trainer:
        trainer.run(progress=False)
        figures, history = trainer.last_eval, trainer.league.history("main")
        assert trainer.stop_reason == "league/exploitability < 0.02"
        assert trainer.env_step < 20000 and len(trainer.league.history("main")) >= 2
        # the reported mixture is each seat's Nash over the history; the current main player is a pure strategy
        assert figures["league/exploitability"] < 0.02
        assert figures["league/exploitability_main"] > 0.3  # a pure strategy of a game whose Nash is mixed
        weights = list(trainer.mixture.values())
        assert sum(w[0] for w in weights) == pytest.approx(1.0) and sum(w[1] for w in weights) == pytest.approx(1.0)
        # every game against a snapshot was counted: the main player's games in the table add up to its actors'
        # episodes against snapshots (self-play games count nothing)
        counted = sum(trainer.league.payoff.stats("main", h).total for h in history)
        played = sum(a.episode_count for a in trainer.players["main"].actors)
        assert 0 < counted <= played
    run = tmp_path / "game"
    assert len(history) == len(os.listdir(run / "league" / "snapshots"))
    payoff = rows(str(run / "league" / "payoff.csv"))
    assert {r["home"] for r in payoff} >= {"main"} and {r["away"] for r in payoff} <= {"main", *history}
    for r in payoff:
        wins, draws, losses, games = (float(r[k]) for k in ("wins", "draws", "losses", "games"))
        assert wins + draws + losses == pytest.approx(games)
    assert rows(str(run / "league" / "ratings.csv"))
    assert rows(str(run / "players" / "main" / "eval.csv"))[0]["seat0/win_rate"] != ""


@pytest.mark.slow
def test_rps_league_reaches_the_target(tmp_path):
    with LeagueTrainer(read_config(RPS), seed=0, exp_name="rps", run_root=str(tmp_path)) as trainer:
        trainer.run(progress=False)
        assert trainer.stop_reason == "league/exploitability < 0.02" and trainer.env_step < 20000
        assert trainer.last_eval["league/exploitability_main"] == pytest.approx(1.0)  # a pure strategy of RPS


@pytest.mark.slow
def test_kuhn_league_is_exploitability_measured_and_falls(tmp_path):
    cfg = read_config(KUHN)
    cfg["max_env_step"] = 20000
    with LeagueTrainer(cfg, seed=1, exp_name="kuhn", run_root=str(tmp_path)) as trainer:
        first = trainer.evaluate()
        trainer.run(progress=False)
        last = trainer.last_eval
    # the untrained main player alone: a pure strategy of Kuhn poker is exploitable
    assert first["league/exploitability_main"] > 0.1
    assert 0.0 <= last["league/exploitability"] < first["league/exploitability_main"]
    # a snapshot once 2,000 env steps passed since the last; collects of 8 x 32 steps reach that at 2,016
    assert last["league/history"] == 9


def test_a_league_config_is_checked_at_compile_time():
    cfg = read_config(RPS)
    cfg["league"]["matchmakin"] = "nash"
    with pytest.raises(ConfigError, match="matchmakin.*matchmaking"):
        compile_config(cfg)
    cfg = read_config(RPS)
    cfg["league"]["players"] = [{"name": "main", "kind": "boss"}]
    with pytest.raises(ConfigError, match="boss"):
        compile_config(cfg)


def test_a_league_needs_a_two_seat_game(tmp_path):
    cfg = read_config("app_zoo/classic_control/cartpole/config/cartpole_dqn.yaml")
    cfg["league"] = {"players": [{"name": "main", "kind": "main"}]}
    with pytest.raises(ValueError, match="two-seat turn-based game"):
        LeagueTrainer(cfg, seed=0, run_root=str(tmp_path))


def test_cli_trains_a_league_config(tmp_path, capsys):
    config = "app_zoo/games/matrix/config/zero_sum_2x2_league.yaml"
    code = cli_main(["-m", "serial", "-c", config, "--run-root", str(tmp_path), "--exp-name", "cli", "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0 and "league/exploitability=" in out and "run_dir=" in out


def test_the_parallel_mode_refuses_a_league_config_with_the_way_to_train_it():
    from nervex.entry import compile_parallel_config

    with pytest.raises(ConfigError, match="parallel mode does not train a league yet.*nervex -m serial"):
        compile_parallel_config(read_config(RPS))
