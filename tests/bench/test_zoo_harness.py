"""The pure helpers of bench/zoo.py and bench/zoo_sb3.py: zoo settings, medians, ratios, table, CI, docs markers."""

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import zoo  # noqa: E402
import zoo_sb3  # noqa: E402

# These read the installed Stable-Baselines3 / rl_zoo3 (the [bench] extra, not a test dependency): skipped without them.
needs_sb3 = pytest.mark.skipif(
    not importlib.util.find_spec("stable_baselines3"), reason="stable-baselines3 absent (pip install -e .[bench])"
)
needs_zoo = pytest.mark.skipif(
    not importlib.util.find_spec("rl_zoo3"), reason="rl_zoo3 absent (pip install -e .[bench])"
)


# ---- zoo settings ---------------------------------------------------------------------------------------------------
def test_parse_schedule_numbers_pass_through():
    assert zoo_sb3.parse_schedule("clip_range", 0.2) == 0.2
    assert zoo_sb3.parse_schedule("learning_rate", 1e-3) == 1e-3


def test_parse_schedule_lin_is_progress_times_value():
    f = zoo_sb3.parse_schedule("learning_rate", "lin_0.001")
    assert f(1.0) == pytest.approx(0.001)
    assert f(0.5) == pytest.approx(0.0005)
    assert f(0.0) == 0.0


def test_parse_schedule_lin_keeps_zoo_length_in_a_longer_run():
    # a run twice the zoo's n_timesteps: the zoo's schedule is over by half-way and stays at 0
    f = zoo_sb3.parse_schedule("clip_range", "lin_0.2", stretch=2.0)
    assert f(1.0) == pytest.approx(0.2)
    assert f(0.75) == pytest.approx(0.1)
    assert f(0.5) == 0.0
    assert f(0.1) == 0.0


def test_parse_schedule_lin_in_a_shorter_run_stops_part_way():
    f = zoo_sb3.parse_schedule("learning_rate", "lin_0.001", stretch=0.5)
    assert f(0.0) == pytest.approx(0.0005)  # the run ends half-way through the zoo's schedule


@pytest.mark.parametrize("value", ["exp_0.1", "lin_fast", "0.2x", None])
def test_parse_schedule_rejects_other_forms(value):
    with pytest.raises(ValueError, match="lin_<number>"):
        zoo_sb3.parse_schedule("learning_rate", value)


@needs_sb3
def test_eval_zoo_expr_sees_dict_nn_th_only():
    import torch

    kwargs = zoo_sb3.eval_zoo_expr("dict(net_arch=[256, 256], activation_fn=nn.ReLU, optimizer_class=th.optim.Adam)")
    assert kwargs == dict(net_arch=[256, 256], activation_fn=torch.nn.ReLU, optimizer_class=torch.optim.Adam)
    with pytest.raises(NameError):
        zoo_sb3.eval_zoo_expr("__import__('os').getcwd()")
    with pytest.raises(NameError):
        zoo_sb3.eval_zoo_expr("open('setup.py')")


@needs_sb3
def test_normalize_kwargs():
    assert zoo_sb3.normalize_kwargs(False, 0.99) is None
    assert zoo_sb3.normalize_kwargs(True, 0.999) == {"gamma": 0.999}
    assert zoo_sb3.normalize_kwargs(True, None) == {}
    assert zoo_sb3.normalize_kwargs("dict(norm_obs=True, norm_reward=False)", 0.98) == {
        "norm_obs": True,
        "norm_reward": False,
        "gamma": 0.98,
    }


@needs_zoo
def test_prepare_dqn_cartpole_keeps_zoo_exploration_length():
    setup = zoo_sb3.prepare("dqn", "CartPole-v1", learn_timesteps=100_000)
    assert setup.n_timesteps == 50_000
    assert setup.n_envs == 1
    # 0.16 of the zoo's 50k = 8k steps = 0.08 of a 100k run
    assert setup.model_kwargs["exploration_fraction"] == pytest.approx(0.08)
    assert setup.model_kwargs["policy_kwargs"] == {"net_arch": [256, 256]}
    assert "n_timesteps" not in setup.model_kwargs and "n_envs" not in setup.model_kwargs


@needs_zoo
def test_prepare_ppo_cartpole_and_inverted_pendulum():
    ppo = zoo_sb3.prepare("ppo", "CartPole-v1", learn_timesteps=100_000)
    assert ppo.n_envs == 8 and ppo.normalize is None
    assert ppo.model_kwargs["learning_rate"](0.5) == pytest.approx(0.0005)
    assert ppo.model_kwargs["clip_range"](1.0) == pytest.approx(0.2)
    inv = zoo_sb3.prepare("ppo", "InvertedPendulum-v2", learn_timesteps=300_000)
    assert inv.normalize == {"gamma": 0.999}
    assert inv.model_kwargs["n_steps"] == 32


@needs_zoo
def test_prepare_rejects_what_it_does_not_build():
    with pytest.raises(NotImplementedError, match="frame_stack"):
        zoo_sb3.prepare("ppo", "atari", learn_timesteps=1000)
    with pytest.raises(KeyError, match="no 'NoSuchEnv-v0' entry"):
        zoo_sb3.prepare("ppo", "NoSuchEnv-v0", learn_timesteps=1000)


@needs_zoo
def test_every_row_has_a_zoo_entry_or_sb3_settings():
    for row in zoo.ROWS.values():
        if row.sb3_settings is None:
            policy = "MlpLstmPolicy" if row.sb3_algo == "ppo_lstm" else "MlpPolicy"
            assert zoo_sb3.read_zoo_hyperparams(row.sb3_algo, row.zoo_entry)["policy"] == policy, row.name
    assert zoo.ROWS["inverted_pendulum_ppo"].zoo_entry == "InvertedPendulum-v2"
    # the zoo has no InvertedPendulum entry for TD3 or SAC: those rows train SB3's defaults
    for name in ("inverted_pendulum_td3", "inverted_pendulum_sac"):
        assert zoo.ROWS[name].zoo_entry is None
        with pytest.raises(KeyError):
            zoo_sb3.read_zoo_hyperparams(zoo.ROWS[name].sb3_algo, zoo.ROWS[name].env_id)
    assert zoo.ROWS["cartpole_a2c"].budget_of("sb3") == 500_000
    assert zoo.ROWS["cartpole_a2c"].budget_of("nervex") == 100_000
    assert zoo.ROWS["cartpole_rainbow"].algo == "Rainbow vs DQN" and zoo.ROWS["cartpole_dqn"].algo == "DQN"
    assert zoo.ROWS["cartpole_no_vel_r2d2"].algo == "R2D2 vs RecurrentPPO"
    assert zoo_sb3.sb3_algos()["ppo_lstm"].__name__ == "RecurrentPPO"


# ---- rows without a zoo entry: SB3's defaults with stated settings ---------------------------------------------------
def test_sb3_settings_row_has_no_zoo_entry_and_excludes_zoo_key():
    row = zoo.Row("x_td3", "Pendulum-v1", "x.yaml", -200, 10_000, "td3", sb3_settings={"learning_starts": 1000})
    assert row.zoo_entry is None and row.sb3_source == "SB3 `TD3` defaults"
    assert zoo.Row("x_td3", "Pendulum-v1", "x.yaml", -200, 10_000, "td3").zoo_entry == "Pendulum-v1"
    with pytest.raises(ValueError, match="not both"):
        zoo.Row("x", "Pendulum-v1", "x.yaml", -200, 10_000, "td3", zoo_key="Pendulum-v1", sb3_settings={})


def test_prepare_sb3_defaults_takes_only_the_stated_settings():
    setup = zoo_sb3.prepare("td3", None, 50_000, {"noise_type": "normal", "noise_std": 0.1, "learning_starts": 1000})
    assert setup.zoo_key is None and setup.n_timesteps == 50_000 and setup.n_envs == 1 and setup.normalize is None
    assert setup.model_kwargs == {
        "policy": "MlpPolicy",
        "noise_type": "normal",
        "noise_std": 0.1,
        "learning_starts": 1000,
    }
    assert setup.notes == [
        "SB3 trains with its TD3 defaults except noise_type normal, noise_std 0.1, learning_starts 1000"
    ]
    assert zoo_sb3.prepare("sac", None, 50_000, {}).notes == ["SB3 trains with its SAC defaults"]


def test_prepare_sb3_defaults_rejects_a_second_source_and_run_length_keys():
    with pytest.raises(ValueError, match="not both"):
        zoo_sb3.prepare("td3", "Pendulum-v1", 20_000, {"learning_starts": 1000})
    with pytest.raises(ValueError, match="n_timesteps"):
        zoo_sb3.prepare("td3", None, 20_000, {"n_timesteps": 5000})


@needs_sb3
@pytest.mark.parametrize(
    "name, net_arch, learning_rate, sigma",
    [("inverted_pendulum_td3", [400, 300], 1e-3, 0.1), ("inverted_pendulum_sac", [256, 256], 3e-4, None)],
)
def test_sb3_defaults_rows_build_sb3_defaults(name, net_arch, learning_rate, sigma):
    # Pendulum-v1 (same one-dimensional action as InvertedPendulum) so the test needs no MuJoCo
    model = zoo_sb3.build_model(zoo.ROWS[name].sb3_setup(100_000), "Pendulum-v1", seed=0)
    try:
        assert type(model).__name__ == zoo.ROWS[name].algo
        assert model.policy.net_arch == net_arch
        assert model.learning_rate == learning_rate
        assert (model.learning_starts, model.batch_size, model.gradient_steps) == (100, 256, 1)
        if sigma is None:
            assert model.action_noise is None
        else:
            np.testing.assert_allclose(model.action_noise._sigma, [sigma])
        assert zoo_sb3.key_hyperparams(model)["net_arch"] == f"SB3 default {net_arch}"
    finally:
        model.get_env().close()


# ---- medians, ratios, table -----------------------------------------------------------------------------------------
def test_median_counts_unreached_seeds_as_infinitely_slow():
    assert zoo.median_inf([5000, None, 3000]) == 5000
    assert zoo.median_inf([None, None, 1000]) == math.inf
    assert zoo.median_inf([1000, 2000]) == 1500
    assert zoo.median_inf([1000, None]) == math.inf  # the middle of an even count averages in the unreached seed


def test_ratio_text():
    assert zoo.ratio_text(10_000, 6_000, 100_000, 100_000) == "1.67x"
    assert zoo.ratio_text(math.inf, 5_000, 100_000, 100_000) == "> 20.00x"
    assert zoo.ratio_text(50_000, math.inf, 500_000, 100_000) == "< 0.50x"
    assert zoo.ratio_text(math.inf, math.inf, 1, 1) == "n/a"


@pytest.mark.parametrize(
    "steps, text", [(6000, "6k"), (12_500, "12.5k"), (1_000_000, "1M"), (999, "999"), (None, "-"), (math.inf, "-")]
)
def test_compact_steps(steps, text):
    assert zoo.compact_steps(steps) == text


def _record(lib, seed, steps, secs, budget=100_000):
    return dict(
        row="cartpole_dqn",
        lib=lib,
        seed=seed,
        reached=steps is not None,
        steps_to_threshold=steps,
        secs_to_threshold=secs,
        budget=budget,
    )


def test_table_line_and_header_have_the_same_columns():
    recs = {
        "nervex": [_record("nervex", 0, 6000, 3.0), _record("nervex", 1, 4000, 2.0), _record("nervex", 2, None, None)],
        "sb3": [_record("sb3", 0, 10_000, 6.0), _record("sb3", 1, 12_000, 9.0), _record("sb3", 2, 8000, 4.0)],
    }
    line = zoo.table_line(zoo.ROWS["cartpole_dqn"], {lib: zoo.summarize(r) for lib, r in recs.items()})
    assert line == (
        "| cartpole_dqn | CartPole-v1 DQN | 475 | 2/3 | 6,000 | 3.0 | 3/3 | 10,000 | 6.0 | 1.67x | 2.00x "
        "| 6k 4k - | 10k 12k 8k |"
    )
    table = zoo.render_table([line])
    header, sep, body = table.splitlines()
    assert header.count("|") == sep.count("|") == body.count("|") == 14


def test_time_capped_peer_bounds_the_seconds_ratio_and_leaves_steps_unknown():
    nervex = [_record("nervex", s, 20_000, 40.0) for s in range(3)]
    capped = dict(_record("sb3", 0, None, None), max_train_secs=600.0, total_env_steps=9_000)
    budget_spent = dict(_record("sb3", 1, None, None), max_train_secs=600.0, total_env_steps=100_000)
    reached = dict(_record("sb3", 2, 8_000, 500.0), max_train_secs=600.0, total_env_steps=8_000)
    assert zoo.time_capped(capped) and not zoo.time_capped(budget_spent) and not zoo.time_capped(reached)
    sb3 = zoo.summarize([capped, budget_spent, reached])
    assert sb3.secs_cap == 600.0 and math.isinf(sb3.median_secs)
    assert zoo.summary_ratios(zoo.summarize(nervex), sb3) == ("n/a (time cap)", "> 15.00x")
    # without a capped seed the step budget bounds the steps ratio as before, and seconds have no bound
    uncapped = zoo.summarize([budget_spent, budget_spent, reached])
    assert zoo.summary_ratios(zoo.summarize(nervex), uncapped) == ("> 5.00x", "n/a")


def test_table_line_with_one_library():
    line = zoo.table_line(zoo.ROWS["cartpole_dqn"], {"sb3": zoo.summarize([_record("sb3", 0, None, None)])})
    assert (
        line == "| cartpole_dqn | CartPole-v1 DQN | 475 | - | - | - | 0/1 | not reached | not reached | - | - | - | - |"
    )


# ---- curves ---------------------------------------------------------------------------------------------------------
def test_bootstrap_ci_two_seeds():
    values = np.array([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    mean, low, high = zoo.bootstrap_ci(values)
    np.testing.assert_allclose(mean, 0.5)
    # a quarter of the 2000 resamples draw seed 0 twice, a quarter seed 1 twice: the 2.5/97.5 percentiles are 0 and 1
    np.testing.assert_allclose(low, 0.0)
    np.testing.assert_allclose(high, 1.0)


def test_bootstrap_ci_is_fixed_and_collapses_on_equal_seeds():
    rng = np.random.default_rng(5)
    values = rng.normal(size=(5, 7))
    a, b = zoo.bootstrap_ci(values), zoo.bootstrap_ci(values)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    mean, low, high = a
    assert np.all(low <= mean) and np.all(mean <= high)
    assert np.all(low >= values.min(axis=0)) and np.all(high <= values.max(axis=0))
    same = np.tile(np.arange(4.0), (5, 1))
    for part in zoo.bootstrap_ci(same):
        np.testing.assert_allclose(part, np.arange(4.0))


def test_curves_on_grid_interpolates_and_holds_the_last_value():
    curve = {"env_step": [1000, 2000], "mean_reward": [10.0, 30.0]}
    grid = np.array([0.0, 500, 1000, 1500, 2000, 3000])
    out = zoo.curves_on_grid([curve], grid)
    np.testing.assert_allclose(out[0], [np.nan, np.nan, 10, 20, 30, 30])


# ---- docs markers ---------------------------------------------------------------------------------------------------
def test_marked_section_appended_when_absent():
    text = "# Benchmarks\n\nold text\n"
    out = zoo.replace_marked_section(text, "table v1")
    assert out == f"# Benchmarks\n\nold text\n\n{zoo.HEADING}\n\n<!-- zoo:begin -->\ntable v1\n<!-- zoo:end -->\n"


def test_marked_section_replaced_and_the_rest_untouched():
    text = "# B\n\nbefore\n\n## Zoo\n\n<!-- zoo:begin -->\nold\nlines\n<!-- zoo:end -->\n\n## Later\nafter\n"
    out = zoo.replace_marked_section(text, "new\n")
    assert out == "# B\n\nbefore\n\n## Zoo\n\n<!-- zoo:begin -->\nnew\n<!-- zoo:end -->\n\n## Later\nafter\n"
    assert zoo.replace_marked_section(out, "new") == out


@pytest.mark.parametrize(
    "text", ["x <!-- zoo:begin --> y", "x <!-- zoo:end --> y", "<!-- zoo:end --><!-- zoo:begin -->"]
)
def test_marked_section_rejects_broken_markers(text):
    with pytest.raises(ValueError, match="markers"):
        zoo.replace_marked_section(text, "body")


def test_find_keys():
    cfg = {
        "env": {"collector_env_num": 8},
        "policy": {"learn": {"batch_size": 64, "lr": 1}, "collect": {"n_sample": 8}},
    }
    assert zoo.find_keys(cfg, ("collector_env_num", "batch_size", "n_sample")) == {
        "env.collector_env_num": 8,
        "policy.learn.batch_size": 64,
        "policy.collect.n_sample": 8,
    }
