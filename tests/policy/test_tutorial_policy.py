"""The nerveX tutorial's DQNPolicy (tutorial_dqn.py, pasted as written) trains from a tutorial-layout YAML."""

import importlib
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from nervex.config import read_config
from nervex.entry import compile_config
from nervex.utils import POLICY_REGISTRY

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
YAML = os.path.join(HERE, "tutorial_dqn.yaml")


def test_tutorial_policy_trains_cartpole_to_195_from_its_yaml(tmp_path):
    # run from another folder: policy.import_names finds tutorial_dqn.py next to the YAML
    out = subprocess.run(
        [sys.executable, "-m", "nervex", "-c", YAML, "--run-root", str(tmp_path), "--no-progress"],
        capture_output=True,
        text=True,
        cwd=str(tmp_path),
        env={**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")},
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    match = re.search(r"done: evaluation mean ([\d.]+) >= stop_val 195", out.stdout)
    assert match and float(match.group(1)) >= 195, out.stdout + out.stderr[-2000:]
    assert "policy 'dqn' now refers to tutorial_dqn.DQNPolicy" in out.stderr
    assert "DQNPolicy declares no `config` defaults" in out.stderr


@pytest.fixture
def tutorial_policy_registered():
    """Import the tutorial module (it registers 'dqn'); give the built-in 'dqn' back afterwards."""
    import nervex.policy

    before = POLICY_REGISTRY.get("dqn")
    with pytest.warns(UserWarning, match="now refers to"):
        if "tests.policy.tutorial_dqn" in sys.modules:
            tutorial = importlib.reload(sys.modules["tests.policy.tutorial_dqn"])
        else:
            import tests.policy.tutorial_dqn as tutorial
    yield tutorial
    POLICY_REGISTRY.register("dqn", before, force=True)
    assert POLICY_REGISTRY.get("dqn") is nervex.policy.DQNPolicy


def test_tutorial_settings_reach_collect_mode_as_attributes(tutorial_policy_registered):
    from nervex.policy import create_policy

    tutorial = tutorial_policy_registered
    cfg = read_config(YAML)
    cfg.policy.import_names = []  # already imported (as tests.policy.tutorial_dqn)
    with pytest.warns(UserWarning, match="declares no `config`"):
        cfg = compile_config(cfg)
    policy = create_policy(cfg.policy)
    assert isinstance(policy, tutorial.DQNPolicy)
    setting = policy.command_mode.get_setting_collect({"learner_step": 0, "env_step": 0, "train_iter": 0})
    assert setting == {"eps": pytest.approx(0.95)}
    obs = {i: np.random.default_rng(i).normal(size=4).astype(np.float32) for i in range(3)}
    out = policy.collect_mode.forward([0, 1, 2], obs, eps=0.0)  # batched for it, split after
    assert policy._eps == 0.0 and set(out) == {0, 1, 2} and out[2]["logit"].shape == (2,)
    greedy = policy.eval_mode.forward([0, 1, 2], obs)
    assert [int(out[i]["action"]) for i in range(3)] == [int(greedy[i]["action"]) for i in range(3)]
