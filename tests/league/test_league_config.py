"""The ``league:`` section: defaults, and errors that name the key at fault."""

from __future__ import annotations

import pytest

from nervex.config import ConfigError
from nervex.league import DEFAULT_LEAGUE_CONFIG, League, MemoryStore, check_league_section, resolve_league_config


def test_defaults_resolve_to_alphastar():
    cfg = resolve_league_config(None)
    assert cfg["players"] == [{"name": "main", "kind": "main"}] and cfg["matchmaking"] == "alphastar"
    assert cfg["main_mix"] == {"pfsp": 0.5, "self_play": 0.35, "verification": 0.15}
    assert cfg == resolve_league_config(DEFAULT_LEAGUE_CONFIG)
    partial = resolve_league_config({"snapshot": {"every_steps": 500}})
    assert partial["snapshot"] == {"win_rate": 0.7, "min_steps": 0, "every_steps": 500}


@pytest.mark.parametrize(
    "cfg, message",
    [
        ({"main_mx": {}}, "unknown key 'league.main_mx'; did you mean 'main_mix'"),
        ({"payoff": {"decy": 0.9}}, "unknown key 'league.payoff.decy'; did you mean 'decay'"),
        (
            {"players": [{"name": "a", "kind": "main_exploit"}]},
            "'league.players\\[0\\].kind'.*did you mean 'main_exploiter'",
        ),
        ({"players": [{"name": "a", "knd": "main"}]}, "unknown key 'league.players\\[0\\].knd'; did you mean 'kind'"),
        ({"players": [{"name": "a"}, {"name": "a"}]}, "player 'a' is listed twice"),
        ({"players": [{"name": "a@1"}]}, "league.players\\[0\\].name"),
        ({"players": [{"name": "e", "kind": "main_exploiter"}]}, "no main player"),
        ({"players": []}, "non-empty list"),
        ({"matchmaking": "alpha_star"}, "'league.matchmaking'.*did you mean 'alphastar'"),
        ({"main_mix": {"pfsp": 0.5, "self_play": 0.3}}, "'league.main_mix' shares must sum to 1.*sum 0.95"),
        ({"main_mix": {"pfsp": -0.1}}, "'league.main_mix.pfsp' must be a number in \\[0, 1\\]"),
        ({"snapshot": {"win_rate": 1.5}}, "'league.snapshot.win_rate' must be a number in \\[0, 1\\], got 1.5"),
        ({"snapshot": {"every_steps": 0}}, "'league.snapshot.every_steps' must be an integer in \\[1, "),
        ({"snapshot": {"every_steps": 10.5}}, "'league.snapshot.every_steps' must be an integer"),
        ({"keep_history": True}, "'league.keep_history' must be an integer"),
        ({"league_exploiter_reset_prob": float("nan")}, "'league.league_exploiter_reset_prob'"),
        ({"pfsp_weighting": "square"}, "did you mean 'squared'"),
        ({"payoff": {"decay": 0.5, "min_games": 8}}, "'league.payoff.min_games'.*never reached"),
        ({"rating": {"kind": "trueskill"}}, "'league.rating.kind' is 'trueskill'"),
        ({"payoff": 0.99}, "'league.payoff' expects a mapping"),
    ],
)
def test_config_errors_name_the_key(cfg, message):
    with pytest.raises(ConfigError, match=message):
        League(MemoryStore(), cfg)


def test_a_store_must_agree_with_the_configured_players():
    store = MemoryStore()
    League(store, {"players": [{"name": "main"}, {"name": "me", "kind": "main_exploiter"}]})
    with pytest.raises(ConfigError, match="holds active player 'me'"):
        League(store, {"players": [{"name": "main"}]})
    with pytest.raises(ConfigError, match="'me' is a league_exploiter in the config but a main_exploiter"):
        League(store, {"players": [{"name": "main"}, {"name": "me", "kind": "league_exploiter"}]})


def test_check_league_section_names_the_file_and_leaves_eval_to_the_trainer():
    check_league_section({"league": {"eval": {"freq": 100}, "matchmaking": "pfsp"}})
    check_league_section({})
    with pytest.raises(ConfigError, match="unknown key 'league.machmaking' in x.yaml; did you mean 'matchmaking'"):
        check_league_section({"league": {"machmaking": "pfsp"}}, " in x.yaml")
