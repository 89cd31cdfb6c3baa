"""nervex plot: the statistics (IQM, bootstrap band, grid) against hand-computed values, and the command on three
short real CartPole DQN runs (band contains every run, IQM equals a hand computation from their eval.csv)."""

import csv
import os

import numpy as np
import pytest
import scipy.stats
import yaml

from nervex.tools import curves
from nervex.tools.plot import compute_groups, main
from nervex.tools.runs import find_run_dirs, group_runs, read_run, read_runs, strip_run_name

CONFIG = "app_zoo/classic_control/cartpole/config/cartpole_dqn.yaml"
TINY = [
    "max_env_step=1100",
    "evaluator.eval_freq=250",  # evaluations after the first collection (eval_at_start) and at 264, 520, 776, 1032
    "evaluator.eval_at_start=true",
    "evaluator.n_episode=3",
    "evaluator.stop_val=1000",
    "env.evaluator_env_num=3",
    "env.collector_env_num=4",
    "policy.learn.learning_starts=200",
    "policy.learn.update_per_collect=1",
    "policy.learn.batch_size=32",
    "policy.model.hidden_sizes=[32]",
    "replay_buffer.maxlen=2000",
]


# ---- IQM -------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "scores, expected",
    [
        ([9.0, 1.0, 2.0], (1 + 2 + 9) / 3),  # n=3: floor(0.75) = 0 dropped, the plain mean
        ([10.0, 1.0, 3.0, 2.0], (2 + 3) / 2),  # n=4: 1 dropped at each end
        ([5.0, 1.0, 100.0, 3.0, 2.0], (2 + 3 + 5) / 3),  # n=5: floor(1.25) = 1 each end: 1 and 100 go
        ([8.0, 1.0, 7.0, 2.0, 6.0, 3.0, 5.0, 100.0], (3 + 5 + 6 + 7) / 4),  # n=8: 2 each end
    ],
)
def test_iqm_hand_picked(scores, expected):
    assert curves.iqm(scores) == pytest.approx(expected)


def test_iqm_is_scipy_trim_mean_as_rliable_uses_it():
    rng = np.random.default_rng(0)
    for n in range(1, 14):
        x = rng.normal(size=n) * 10
        assert curves.iqm(x) == pytest.approx(scipy.stats.trim_mean(x, 0.25)), n


def test_iqm_of_nothing_is_an_error():
    with pytest.raises(ValueError, match="no scores"):
        curves.iqm([])


# ---- band and grid ---------------------------------------------------------------------------------------------------
def test_band_of_three_runs_is_their_min_and_max():
    values = np.array([[0.0, 5.0, 1.0, 2.0], [3.0, 1.0, 1.0, 9.0], [1.0, 2.0, 4.0, 0.0]])
    mean, low, high = curves.mean_band(values)
    np.testing.assert_allclose(mean, [4 / 3, 8 / 3, 2.0, 11 / 3])
    # 1/27 of the 2000 resamples draw the lowest run three times, more than the 2.5% below the band's edge
    np.testing.assert_array_equal(low, values.min(axis=0))
    np.testing.assert_array_equal(high, values.max(axis=0))


def test_band_of_many_runs_is_about_the_normal_interval():
    values = np.random.default_rng(1).normal(10.0, 2.0, size=(40, 3))
    mean, low, high = curves.mean_band(values, ci=95, n_resamples=4000, seed=3)
    half = 1.96 * values.std(axis=0) / np.sqrt(40)  # the normal approximation the percentile band approaches
    np.testing.assert_allclose(high - mean, half, rtol=0.2)
    np.testing.assert_allclose(mean - low, half, rtol=0.2)
    narrow = curves.mean_band(values, ci=50, n_resamples=4000, seed=3)
    assert np.all(narrow[2] - narrow[1] < (high - low) / 2)
    again = curves.mean_band(values, ci=95, n_resamples=4000, seed=3)
    for a, b in zip(again, (mean, low, high)):
        np.testing.assert_array_equal(a, b)


def test_bad_coverage_is_an_error():
    with pytest.raises(ValueError, match=r"\(0, 100\)"):
        curves.mean_band(np.zeros((2, 2)), ci=100)


def test_grid_covers_the_common_range_and_each_runs_points():
    a = (np.array([0.0, 100.0, 200.0]), np.array([0.0, 10.0, 20.0]))
    b = (np.array([50.0, 150.0, 250.0]), np.array([5.0, 15.0, 35.0]))
    grid = curves.common_grid([a[0], b[0]], n_points=3)
    np.testing.assert_array_equal(grid, [50.0, 100.0, 125.0, 150.0, 200.0])
    g = curves.group_curve("g", [a, b], ["a", "b"], n_points=3)
    np.testing.assert_allclose(g.values, [[5, 10, 12.5, 15, 20], [5, 10, 12.5, 15, 25]])  # b: 15 + 20 / 2 at 200
    held = curves.common_grid([a[0], b[0]], n_points=3, hold_last=True)
    np.testing.assert_array_equal(held, [50.0, 100.0, 150.0, 200.0, 250.0])
    np.testing.assert_allclose(curves.interpolate(*a, held, hold_last=True), [5, 10, 15, 20, 20])
    np.testing.assert_allclose(curves.interpolate(*a, held), [5, 10, 15, 20, np.nan])


def test_runs_that_do_not_overlap_are_an_error():
    with pytest.raises(ValueError, match="no common x range"):
        curves.common_grid([np.array([0.0, 10.0]), np.array([20.0, 30.0])])


def test_final_score_is_the_mean_of_the_last_evaluations():
    assert curves.final_score([1.0, 2.0, 4.0, 8.0], last=3) == pytest.approx(14 / 3)
    assert curves.final_score([6.0], last=3) == 6.0


# ---- run directories made by hand ------------------------------------------------------------------------------------
def _fake_run(root, name, seed, lr=0.002, rows=((0, 10.0), (100, 20.0), (200, 30.0)), system=None):
    run_dir = root / name
    run_dir.mkdir(parents=True)
    cfg = {"exp_name": None, "seed": seed, "env": {"env_type": "cartpole", "env_id": "CartPole-v1"}}
    cfg["policy"] = {"policy_type": "dqn", "learn": {"learning_rate": lr}}
    if system is not None:
        cfg["system"] = system
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg))
    lines = ["env_step,train_iter,mean_reward,wall_time"] + [f"{x},0,{y},{x / 100}" for x, y in rows]
    (run_dir / "eval.csv").write_text("\n".join(lines) + "\n")
    return str(run_dir)


def test_two_configs_make_two_groups_labelled_by_what_differs(tmp_path):
    for seed in (0, 1):
        _fake_run(tmp_path, f"CartPole-v1__dqn__{seed}__20261128-0900{seed}0", seed, lr=0.002)
        _fake_run(tmp_path, f"CartPole-v1__dqn__{seed}__20261128-0901{seed}0", seed, lr=0.001)
    runs = read_runs(find_run_dirs([str(tmp_path)]))
    groups = group_runs(runs, "config")
    assert [(label, len(members)) for label, members in groups] == [
        ("CartPole-v1 dqn (policy.learn.learning_rate=0.002)", 2),
        ("CartPole-v1 dqn (policy.learn.learning_rate=0.001)", 2),
    ]
    assert {r.config["policy"]["learn"]["learning_rate"] for r in groups[0][1]} == {0.002}
    by_name = group_runs(runs, "name")  # the folder names do not tell the two configs apart
    assert [(label, len(members)) for label, members in by_name] == [("CartPole-v1__dqn", 4)]
    assert len(group_runs(runs, "none")) == 4
    bare = tmp_path / "other" / "bare__s7"  # no config.yaml: grouped by its name
    bare.mkdir(parents=True)
    (bare / "eval.csv").write_text("env_step,mean_reward\n0,1\n")
    mixed = group_runs(read_runs(find_run_dirs([str(tmp_path)])), "config")
    assert [label for label, _ in mixed][-1] == "bare"


def test_parallel_run_dirs_group_despite_per_process_keys(tmp_path):
    dirs = [
        _fake_run(
            tmp_path,
            f"CartPole-v1__dqn__{seed}__{hash_}__20261128-091156",
            seed,
            system={"coordinator": {"port": 9000 + seed, "lease_s": 30.0}, "storage": {"root": f"/mnt/{seed}"}},
        )
        for seed, hash_ in ((0, "1f2e3d4c"), (1, "a0b1c2d3"))
    ]
    os.makedirs(os.path.join(dirs[0], "logs"))
    for group_by in ("config", "name"):
        groups = compute_groups(dirs, group_by=group_by, n_resamples=50)
        assert [len(g.runs) for g in groups] == [2], group_by
    (other,) = compute_groups([_fake_run(tmp_path, "x__0", 0, system={"coordinator": {"lease_s": 5.0}})])
    assert other.curve.label == "CartPole-v1 dqn, parallel"
    serial = _fake_run(tmp_path, "y__0", 0)
    assert [g.curve.label for g in compute_groups([serial, dirs[0]], n_resamples=50)] == [
        "CartPole-v1 dqn",
        "CartPole-v1 dqn, parallel",
    ]


@pytest.mark.parametrize(
    "name, seed, expected",
    [
        ("CartPole-v1__dqn__3__20261128-091156", 3, "CartPole-v1__dqn"),
        ("CartPole-v1__dqn__3__1f2e3d4c__20261128-091156", 3, "CartPole-v1__dqn"),
        ("sweep_lr0.001__seed3", 3, "sweep_lr0.001"),
        ("sweep_lr0.001_s3", None, "sweep_lr0.001"),
        ("CartPole-v1__dqn__13__20261128-091156", 3, "CartPole-v1__dqn__13"),  # not this run's seed
    ],
)
def test_strip_run_name(name, seed, expected):
    assert strip_run_name(name, seed) == expected


def test_a_resumed_run_keeps_its_later_rows_and_adds_up_wall_time(tmp_path):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    rows = ["env_step,mean_reward,wall_time", "100,1,10", "200,2,20", "300,3,30", "200,5,1", "300,6,11"]
    (run_dir / "eval.csv").write_text("\n".join(rows) + "\n")
    by_step = read_run(str(run_dir))
    np.testing.assert_array_equal(by_step.x, [100, 200, 300])
    np.testing.assert_array_equal(by_step.y, [1, 5, 6])
    assert by_step.config is None
    by_time = read_run(str(run_dir), x="wall_time")
    np.testing.assert_array_equal(by_time.x, [10, 20, 30, 31, 41])


def test_errors_name_the_directory(tmp_path, capsys):
    empty = tmp_path / "empty_run"
    empty.mkdir()
    (empty / "config.yaml").write_text("seed: 0\n")
    assert main([str(empty), "--out", str(tmp_path / "c.png")]) == 2
    assert f"{empty}: no eval.csv" in capsys.readouterr().err
    (empty / "eval.csv").write_text("env_step,mean_reward\n")
    assert main([str(empty), "--out", str(tmp_path / "c.png")]) == 2
    assert "eval.csv: no evaluation yet" in capsys.readouterr().err
    good = _fake_run(tmp_path, "good__0", 0)
    assert main([str(empty), good, "--out", str(tmp_path / "c.png")]) == 0  # several: the empty one is skipped
    assert f"skipping {empty}" in capsys.readouterr().err
    assert main([str(tmp_path / "nope"), "--out", str(tmp_path / "c.png")]) == 2
    assert "nope: no such directory" in capsys.readouterr().err
    assert main([good, "--out", str(tmp_path / "c.pdf")]) == 2
    assert "expected a .png or .svg file" in capsys.readouterr().err
    assert main([good, "--metric", "score", "--out", str(tmp_path / "c.png")]) == 2
    assert "no column 'score'" in capsys.readouterr().err


def test_hold_last_extends_a_group_to_its_longest_run(tmp_path):
    short = _fake_run(tmp_path, "a__0", 0, rows=((0, 10.0), (100, 200.0)))  # stopped at the threshold
    long = _fake_run(tmp_path, "a__1", 1, rows=((0, 20.0), (100, 40.0), (200, 60.0)))
    (common,) = compute_groups([short, long], n_resamples=50)
    assert common.curve.grid[-1] == 100.0
    (held,) = compute_groups([short, long], n_resamples=50, hold_last=True)
    assert held.curve.grid[-1] == 200.0
    np.testing.assert_allclose(held.curve.mean[-1], (200.0 + 60.0) / 2)
    assert main([short, long, "--hold-last", "--out", str(tmp_path / "c.png")]) == 0


def test_svg_output(tmp_path):
    dirs = [_fake_run(tmp_path, f"r__{s}", s, rows=((0, s), (100, 2.0 * s))) for s in range(3)]
    out = tmp_path / "figs" / "c.svg"
    from nervex.entry.cli import main as nervex_main  # `nervex plot ...` as typed

    assert nervex_main(["plot"] + dirs + ["--out", str(out), "--x", "wall_time", "--no-runs", "--title", "three"]) == 0
    text = out.read_text()
    assert text.startswith("<?xml") and "<svg" in text
    assert (tmp_path / "figs" / "c_summary.csv").exists()


# ---- three short real runs -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_runs(tmp_path_factory):
    """Three seeds of CartPole DQN, 1,100 env steps each (about 3 s a run), evaluated five times."""
    from nervex.config import apply_overrides, read_config
    from nervex.entry import SerialTrainer
    from nervex.entry.builder import compile_config

    root = tmp_path_factory.mktemp("runs")
    run_dirs = []
    for seed in range(3):
        cfg = compile_config(apply_overrides(read_config(CONFIG), TINY))
        trainer = SerialTrainer(cfg, seed=seed, run_root=str(root))
        try:
            trainer.run(progress=False)
        finally:
            trainer.close()
        run_dirs.append(trainer.run_dir)
    return root, run_dirs


def _eval_rows(run_dir):
    with open(os.path.join(run_dir, "eval.csv"), newline="") as f:
        return [(float(r["env_step"]), float(r["mean_reward"])) for r in csv.DictReader(f)]


def test_plot_of_three_real_runs(real_runs, tmp_path, capsys):
    root, run_dirs = real_runs
    out = tmp_path / "c.png"
    assert main(run_dirs + ["--out", str(out)]) == 0
    import matplotlib.image

    with open(out, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(str(out))
    assert image.shape[0] > 300 and image.shape[1] > 500 and image[..., :3].std() > 0.01  # not a blank canvas

    (group,) = compute_groups([str(root)])  # the parent folder stands for the three runs, one config
    assert sorted(group.curve.run_names) == sorted(os.path.basename(d) for d in run_dirs)
    c = group.curve
    rows = {os.path.basename(d): _eval_rows(d) for d in run_dirs}
    assert all(len(r) == 5 for r in rows.values())
    for name, values in zip(c.run_names, c.values):
        x, y = np.array(rows[name]).T
        np.testing.assert_allclose(values, np.interp(c.grid, x, y))  # each run's curve, interpolated
        assert np.all(c.low <= values + 1e-9) and np.all(values <= c.high + 1e-9)  # inside the band
        at_evals = np.isin(c.grid, x)
        np.testing.assert_allclose(values[at_evals], y[np.isin(x, c.grid)])  # exact at its evaluations
    np.testing.assert_allclose(c.low, c.values.min(axis=0))  # 3 runs at 95%: the band is [min, max]
    np.testing.assert_allclose(c.high, c.values.max(axis=0))

    # IQM by hand: final score = mean of the last 3 evaluations; 3 runs: floor(0.25 * 3) = 0 trimmed each end, so
    # the IQM is the mean of the three final scores, the median the middle one
    finals = sorted((r[-3][1] + r[-2][1] + r[-1][1]) / 3 for r in rows.values())
    iqm_by_hand = (finals[0] + finals[1] + finals[2]) / 3
    assert group.summary.iqm == pytest.approx(iqm_by_hand)
    assert group.summary.median == pytest.approx(finals[1])
    assert group.summary.iqm_low == pytest.approx(finals[0])  # 1/27 of the resamples draw the lowest run 3 times
    assert group.summary.iqm_high == pytest.approx(finals[2])
    with open(tmp_path / "c_summary.csv", newline="") as f:
        (row,) = list(csv.DictReader(f))
    assert row["group"] == "CartPole-v1 dqn" and row["runs"] == "3"
    assert float(row["iqm"]) == pytest.approx(iqm_by_hand)
    assert f"{iqm_by_hand:.2f} [{finals[0]:.2f}, {finals[2]:.2f}]" in capsys.readouterr().out
