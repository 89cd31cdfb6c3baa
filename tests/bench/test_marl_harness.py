"""The pure helpers of bench/marl.py: the recorded command, the last-3 final value, the table's rows."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import marl  # noqa: E402


def test_the_recorded_command_leaves_out_where_records_go_and_what_is_printed():
    argv = ["--part", "lbf", "--out", "/tmp/trial", "--verbose", "--seeds", "1", "--out=/x", "--set", "a=1"]
    assert marl.command_line(argv) == "python bench/marl.py --part lbf --seeds 1 --set a=1"


def record(seed, values, algo="mappo", part="lbf"):
    curve = [{"env_step": 1000 * (i + 1), "mean_reward": v, "normalized_return": v} for i, v in enumerate(values)]
    return dict(part=part, algo=algo, lib="nervex", seed=seed, env_steps=1000 * len(values), curve=curve,
                collect_fps=100.0 * (seed + 1), train_fps=50.0)  # fmt: skip


def test_final_value_is_the_mean_of_the_last_three_evaluations():
    assert marl.final_value(record(0, [0.0, 0.3, 0.6, 0.9])) == pytest.approx(0.6)
    assert marl.final_value(record(0, [0.5])) == pytest.approx(0.5)


def test_a_table_row_per_algorithm_with_every_seed_and_the_target():
    lines = marl.part_lines(marl.PARTS["lbf"], [record(1, [0.2, 0.8, 0.9, 1.0]), record(0, [0.7, 0.8, 0.9])], None)
    row = next(line for line in lines if line.startswith("| mappo |"))
    # seeds sorted; finals 0.80 (seed 0) and 0.90 (seed 1); median env steps 3500; target 0.95; median collect fps 150
    assert row == ("| mappo | nervex | 0,1 | 3500 | 0.85 (0.80, 0.90) | 0.85 (0.80, 0.90) | >= 0.95 | 150 | 50 |")
