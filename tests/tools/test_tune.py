"""``nervex -m tune``: the score, the space file's checks, and a real study of CartPole DQN (prune, resume, retry)."""

from __future__ import annotations

import csv
import os
import socket
import subprocess
import sys

import pytest

optuna = pytest.importorskip("optuna")

from nervex.config import read_config  # noqa: E402
from nervex.entry.builder import compile_config  # noqa: E402
from nervex.entry.cli import main  # noqa: E402
from nervex.tools.search_space import SpaceError, load_space  # noqa: E402
from nervex.tools.trial_runner import curve_score, seed_score  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CARTPOLE_DQN = os.path.join(ROOT, "app_zoo/classic_control/cartpole/config/cartpole_dqn.yaml")
SHIPPED_SPACE = os.path.join(ROOT, "app_zoo/classic_control/cartpole/config/cartpole_dqn_space.yaml")
LR, TARGET = "policy.learn.learning_rate", "policy.learn.target_update_freq"
SPACE = f"{LR}: {{type: loguniform, low: 1.0e-6, high: 1.0e-2}}\n{TARGET}: {{type: choice, choices: [10, 100]}}\n"
# a budget where lr 2e-3 learns visibly within 4 evaluation rounds and lr 1e-6 does not learn at all
TINY = [
    "max_env_step=1200",
    "evaluator.eval_freq=300",
    "evaluator.n_episode=5",
    "policy.model.hidden_sizes=[64, 64]",
    "policy.learn.learning_starts=200",
    "policy.command.eps.decay=1000",
]


def _sets(items):
    return [arg for item in items for arg in ("--set", item)]


# ---- the score --------------------------------------------------------------------------------------------------
def test_curve_score_by_hand():
    # (0..500: 10) + (500..1000: trapezoid 10 -> 195 capped) + (1000..2000: 195 held)
    assert curve_score([(500, 10.0), (1000, 200.0)], horizon=2000, cap=195) == pytest.approx(
        (500 * 10 + 500 * (10 + 195) / 2 + 1000 * 195) / 2000
    )
    # a point beyond the horizon is cut at it: the value at 2000 interpolates 100 -> 300 to 200
    assert curve_score([(1000, 100.0), (3000, 300.0)], horizon=2000) == pytest.approx(
        (1000 * 100 + 1000 * (100 + 200) / 2) / 2000
    )
    # the first evaluation is held back to step 0
    assert curve_score([(1000, 50.0)], horizon=1000) == pytest.approx(50.0)


def test_seed_score_last_is_capped():
    curve = [(300, 20.0), (600, 210.0)]
    assert seed_score(curve, "last", horizon=1200, cap=195) == 195
    assert seed_score(curve[:1], "last", horizon=1200, cap=195) == 20
    with pytest.raises(ValueError, match="unknown objective 'best'"):
        seed_score(curve, "best", horizon=1200, cap=195)


# ---- the space file ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cartpole():
    user = read_config(CARTPOLE_DQN)
    return user, compile_config(user)


@pytest.mark.parametrize(
    "text, message",
    [
        ("policy.learn.learning_rate: {type: logunifrom, low: 1.0e-4, high: 1.0e-2}", "did you mean 'loguniform'"),
        ("policy.learn.learning_rate: {type: uniform, low: 0.01, high: 0.001}", "low must be below high"),
        ("policy.learn.learning_rate: {type: loguniform, low: 0, high: 0.01}", "a log scale needs low > 0"),
        (
            "policy.learn.learning_rat: {type: loguniform, low: 1.0e-4, high: 1.0e-2}",
            "did you mean 'policy.learn.learning_rate'",
        ),
        ("policy.learn.batch_size: {type: uniform, low: 32, high: 128}", "use type 'int'"),
        ("policy.learn.double: {type: int, low: 0, high: 1}", "search it with type 'choice'"),
        ("env.collector_env_num: {type: int, low: 0, high: 4}", "the value 0 is refused by the config"),
        ("policy.learn.loss: {type: choice, choices: [mse, hubber]}", "the value 'hubber' is refused"),
        ("seed: {type: int, low: 0, high: 9}", "cannot be searched"),
        ("policy.learn: {type: choice, choices: [1, 2]}", "is a section"),
        ("policy.learn.learning_rate: {type: uniform, low: 1.0e-4, high: 0.01, log: true, step: 0.001}", "log scale"),
        ("policy.learn.batch_size: {type: int, low: 32, high: 128, stp: 32}", "'stp' does not apply to type 'int'"),
        ("policy.learn.batch_size: {type: choice, choices: [32, 32]}", "repeated choices 32"),
    ],
)
def test_bad_space_files_are_refused_naming_key_and_file(tmp_path, cartpole, text, message):
    path = tmp_path / "my_space.yaml"
    path.write_text(text + "\n")
    user, compiled = cartpole
    with pytest.raises(SpaceError) as info:
        load_space(path, user, compiled, compile_config)
    assert message in str(info.value)
    assert "my_space.yaml" in str(info.value)
    assert text.split(":")[0] in str(info.value)


def test_shipped_space_loads_and_a_list_choice_comes_back_as_a_list(cartpole):
    user, compiled = cartpole
    params = {p.key: p for p in load_space(SHIPPED_SPACE, user, compiled, compile_config)}
    assert LR in params and params[LR].log
    sizes = params["policy.model.hidden_sizes"]
    trial = optuna.trial.FixedTrial({"policy.model.hidden_sizes": "[64, 64]"})
    assert sizes.suggest(trial) == [64, 64]


def test_cli_refuses_a_bad_space_before_any_trial(tmp_path, capsys):
    space = tmp_path / "space.yaml"
    space.write_text("policy.learn.batch_sise: {type: int, low: 32, high: 128}\n")
    code = main(["-m", "tune", "-c", CARTPOLE_DQN, "--space", str(space), "--trials", "2", "--run-root", str(tmp_path)])
    assert code == 2
    err = capsys.readouterr().err
    assert (
        "key 'policy.learn.batch_sise' in space.yaml does not exist in the compiled config of cartpole_dqn.yaml" in err
    )
    assert "did you mean 'policy.learn.batch_size'?" in err
    assert not (tmp_path / "tune").exists()


# ---- a real study -----------------------------------------------------------------------------------------------
def _tune(tmp_path, storage, trials, *extra):
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    args = ["-m", "tune", "-c", CARTPOLE_DQN, "--space", str(space), "--trials", str(trials), "--seeds", "2"]
    args += ["--storage", storage, "--study-name", "t", "--run-root", str(tmp_path / "runs"), "--no-progress"]
    args += ["--startup-trials", "1", "--warmup-evals", "2", *_sets(TINY), *extra]
    return main(args)


def _rows(tmp_path):
    with open(tmp_path / "runs/tune/t/trials.csv", newline="") as f:
        return list(csv.DictReader(f))


def _dead_pid():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_study_prunes_resumes_retries_and_its_best_config_trains(tmp_path, capsys):
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    study = optuna.create_study(study_name="t", storage=storage, direction="maximize")
    study.enqueue_trial({LR: 0.002, TARGET: 10})  # learns: the one complete trial the pruner needs
    study.enqueue_trial({LR: 1e-6, TARGET: 10})  # does not learn: pruned at evaluation round 2

    assert _tune(tmp_path, storage, 4) == 0
    study = optuna.load_study(study_name="t", storage=storage)
    states = [t.state.name for t in study.trials]
    assert len(states) == 4 and set(states) <= {"COMPLETE", "PRUNED"}
    assert states[:2] == ["COMPLETE", "PRUNED"]
    first = study.trials[0]
    scores = first.user_attrs["seed_scores"]
    assert list(scores) == ["0", "1"]
    assert first.value == pytest.approx(sum(scores.values()) / 2, abs=1e-3)
    assert first.value > 2 * study.trials[1].value  # 2e-3 learned, 1e-6 stayed at an untrained policy's ~9
    rows = _rows(tmp_path)
    assert [r["state"] for r in rows] == states
    assert rows[1]["note"] == "pruned after evaluation round 2" and rows[1][LR] == "1e-06"
    assert float(rows[0]["score_seed_1"]) == pytest.approx(scores["1"], abs=1e-3)

    best_path = str(tmp_path / "runs/tune/t/best_config.yaml")
    best = compile_config(read_config(best_path))
    assert best.policy.learn.learning_rate == pytest.approx(study.best_trial.params[LR])
    assert best.max_env_step == 1200 and best.policy.model.hidden_sizes == [64, 64]  # the --set values stay

    # a tuner killed during trial 4 left it RUNNING: the resume fails it, runs its values again, and counts 5
    study.enqueue_trial({LR: 1e-6, TARGET: 100})  # values that the pruner stops early: a cheap retry
    stale = study.ask()
    stale.suggest_float(LR, 1e-6, 1e-2, log=True)
    stale.suggest_categorical(TARGET, [10, 100])
    stale.set_user_attr("owner", f"{socket.gethostname()}:{_dead_pid()}")
    before = [(t.state, t.value) for t in study.trials[:4]]
    capsys.readouterr()
    assert _tune(tmp_path, storage, 5) == 0
    out = capsys.readouterr().out
    assert "trial 4 was left RUNNING" in out and "4 of 5 trials finished" in out
    study = optuna.load_study(study_name="t", storage=storage)
    assert [(t.state, t.value) for t in study.trials[:4]] == before
    assert len(study.trials) == 6
    assert study.trials[4].state.name == "FAIL" and study.trials[5].params == study.trials[4].params
    assert study.trials[5].user_attrs["retry_of"] == 4
    assert "abandoned" in _rows(tmp_path)[4]["note"]

    # run again with the study complete: nothing new; with other seeds: refused
    assert _tune(tmp_path, storage, 5) == 0
    assert len(optuna.load_study(study_name="t", storage=storage).trials) == 6
    assert _tune(tmp_path, storage, 6, "--seeds", "3") == 2
    assert "was run with other settings (seeds: stored [0, 1], now [0, 1, 2])" in capsys.readouterr().err

    code = main(["-m", "serial", "-c", best_path, "--set", "max_env_step=500", "--run-root", str(tmp_path / "serial")])
    assert code == 0
    assert os.path.exists(tmp_path / "serial" / os.listdir(tmp_path / "serial")[0] / "eval.csv")


def test_a_trial_that_raises_fails_alone(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("env.env_id: {type: choice, choices: [NoSuchEnv-v0]}\n")
    code = main(
        ["-m", "tune", "-c", CARTPOLE_DQN, "--space", str(space), "--trials", "1", "--seeds", "1"]
        + ["--run-root", str(tmp_path), *_sets(TINY)]
    )
    assert code == 0  # the study finished: its one trial failed
    with open(tmp_path / "tune/cartpole_dqn/trials.csv", newline="") as f:
        (row,) = list(csv.DictReader(f))
    assert row["state"] == "FAIL" and "NoSuchEnv-v0" in row["note"]
    assert not (tmp_path / "tune/cartpole_dqn/best_config.yaml").exists()
