"""bench/league.py: nervex's side of the league benchmark (a run's curve, its first point below a target, the report)."""

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("scipy")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import league  # noqa: E402


def test_a_league_run_records_its_curve_and_reaches_the_matrix_target():
    out = league.nervex_league("zero_sum_2x2", 0, steps=6000, eval_every=500, stop_below=0.02)
    curve = out["curve"]
    assert curve[0]["env_steps"] == 0 and curve[0]["wall_secs"] == 0.0  # the untrained main player, off the clock
    assert [p["env_steps"] for p in curve] == sorted(p["env_steps"] for p in curve)
    assert curve[-1]["exploitability"] < 0.02 <= max(p["main"] for p in curve)  # a pure network is exploitable
    first = league.first_below(curve, 0.02)
    assert first is not None and first["env_steps"] == curve[-1]["env_steps"] < 6000  # stopped at the target
    assert curve[-1]["episodes"] * 2 == curve[-1]["env_steps"]  # a matrix game is two moves


def test_the_report_tables_kuhn_records(tmp_path):
    point = dict(env_steps=0, episodes=0, wall_secs=0.0, exploitability=0.3, fp=0.3, main=0.3, history=0.0)
    later = dict(point, env_steps=5000, episodes=2000, wall_secs=12.5, exploitability=0.04)
    for lib, curve in (("nervex", [point, later]), ("open_spiel_nfsp", [point, dict(later, exploitability=0.2)])):
        record = dict(game="kuhn_poker", lib=lib, seed=0, curve=curve)
        (tmp_path / f"kuhn_poker__{lib}__seed0.json").write_text(json.dumps(record))
    table = league.report(league.load_records(str(tmp_path)), plot=False)
    assert "| nervex | 0 | 12 | 2,000 | 0.0400 | 12.5 / 2,000 |" in table
    assert "| open_spiel_nfsp | 0 | 12 | 2,000 | 0.2000 | not reached |" in table
