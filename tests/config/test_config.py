"""Config reading, merging and validation: each error message is checked."""

import os
import subprocess
import sys
import textwrap

import pytest

from nervex.config import ConfigError, apply_overrides, read_config, validate_merge
from nervex.entry import compile_config

CARTPOLE = "app_zoo/classic_control/cartpole/config/cartpole_dqn.yaml"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write(tmp_path, text, name="exp.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


BASE = """
env:
  env_type: cartpole
policy:
  policy_type: dqn
"""


def test_shipped_config_compiles():
    cfg = compile_config(read_config(os.path.join(ROOT, CARTPOLE)))
    assert cfg.policy.policy_type == "dqn"
    assert cfg.policy.learn.batch_size == 64
    assert cfg.policy.model_type is None and "model_type" not in cfg.policy.model  # the policy's default model
    assert cfg.env.env_id == "CartPole-v1"
    assert cfg.evaluator.stop_val == 195.0
    # defaults the YAML leaves out are present
    assert cfg.learner.hook.log_show_after_iter == 500


def test_missing_file_names_path(tmp_path):
    missing = str(tmp_path / "nope.yaml")
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        read_config(missing)


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    path = write(tmp_path, "env:\n  env_type: cartpole\npolicy: [unclosed\n")
    with pytest.raises(ConfigError, match=r"exp\.yaml:\d+:\d+"):
        read_config(path)


def test_top_level_must_be_mapping(tmp_path):
    with pytest.raises(ConfigError, match="mapping"):
        read_config(write(tmp_path, "- a\n- b\n"))


def test_typo_key_suggests_nearest(tmp_path):
    path = write(tmp_path, BASE + "  lern:\n    batch_size: 32\n")
    with pytest.raises(ConfigError) as err:
        compile_config(read_config(path))
    msg = str(err.value)
    assert "unknown key 'policy.lern'" in msg
    assert "in exp.yaml" in msg
    assert "did you mean 'policy.learn'?" in msg


def test_nested_typo_and_top_level_typo(tmp_path):
    with pytest.raises(
        ConfigError, match=r"unknown key 'policy.learn.bach_size'.*did you mean 'policy.learn.batch_size'"
    ):
        compile_config(read_config(write(tmp_path, BASE + "  learn:\n    bach_size: 32\n")))
    with pytest.raises(ConfigError, match=r"unknown key 'evaluater'.*did you mean 'evaluator'"):
        compile_config(read_config(write(tmp_path, BASE + "evaluater:\n  stop_val: 100\n")))


def test_wrong_type_names_key_expected_and_given(tmp_path):
    path = write(tmp_path, BASE + "  learn:\n    batch_size: big\n")
    with pytest.raises(ConfigError, match=r"key 'policy.learn.batch_size' in exp.yaml expects a number.*str 'big'"):
        compile_config(read_config(path))
    path = write(tmp_path, BASE + "  priority: 1\n")
    with pytest.raises(ConfigError, match=r"key 'policy.priority' in exp.yaml expects a bool.*int 1"):
        compile_config(read_config(path))
    path = write(tmp_path, BASE + "  learn:\n    batch_size: 64.5\n")
    with pytest.raises(ConfigError, match="expects an integer"):
        compile_config(read_config(path))


def test_numbers_in_scientific_notation_accepted(tmp_path):
    # YAML 1.1 reads 1e5 (no dot) as a string; a numeric key must still take it
    path = write(tmp_path, BASE + "replay_buffer:\n  maxlen: 1e5\n  alpha: 1\nmax_env_step: 100000\n")
    cfg = compile_config(read_config(path))
    assert cfg.replay_buffer.maxlen == 100000 and isinstance(cfg.replay_buffer.maxlen, int)
    assert cfg.replay_buffer.alpha == 1.0 and isinstance(cfg.replay_buffer.alpha, float)
    assert cfg.max_env_step == 100000


def test_unknown_policy_lists_registered_and_suggests(tmp_path):
    path = write(tmp_path, "env:\n  env_type: cartpole\npolicy:\n  policy_type: dqm\n")
    with pytest.raises(ConfigError) as err:
        compile_config(read_config(path))
    msg = str(err.value)
    assert "unknown policy 'dqm'" in msg and "registered: " in msg and "dqn" in msg
    assert "did you mean 'dqn'?" in msg and "policy.policy_type" in msg


def test_unknown_env_type_suggests(tmp_path):
    path = write(tmp_path, "env:\n  env_type: cartpol\npolicy:\n  policy_type: dqn\n")
    with pytest.raises(ConfigError, match=r"unknown env 'cartpol'.*did you mean 'cartpole'"):
        compile_config(read_config(path))


def test_missing_policy_type(tmp_path):
    with pytest.raises(ConfigError, match="policy.policy_type.*required"):
        compile_config(read_config(write(tmp_path, "env:\n  env_type: cartpole\n")))


def test_model_kwargs_checked_against_model_signature(tmp_path):
    path = write(tmp_path, BASE + "  model:\n    hiden_sizes: [64]\n")
    with pytest.raises(
        ConfigError, match=r"unknown key 'policy.model.hiden_sizes'.*did you mean 'policy.model.hidden_sizes'"
    ):
        compile_config(read_config(path))


def test_overrides_are_validated_like_the_file(tmp_path):
    cfg = read_config(write(tmp_path, BASE))
    out = compile_config(apply_overrides(cfg, ["policy.learn.batch_size=128", "seed=7"]))
    assert out.policy.learn.batch_size == 128 and out.seed == 7
    with pytest.raises(ConfigError, match="unknown key 'policy.learn.batch'"):
        compile_config(apply_overrides(cfg, ["policy.learn.batch=1"]))


def test_free_form_section_accepts_any_key():
    out = validate_merge({"a": 1, "kwargs": {}}, {"kwargs": {"anything": 3}})
    assert out == {"a": 1, "kwargs": {"anything": 3}}


def test_compile_is_idempotent():
    cfg = compile_config(read_config(os.path.join(ROOT, CARTPOLE)))
    again = compile_config(dict(cfg))
    assert again == cfg


@pytest.mark.parametrize(
    "yaml_text, message",
    [
        (
            "  learn:\n    learning_rate: -0.001\n",
            r"key 'policy.learn.learning_rate' in exp.yaml must be > 0, got -0.001",
        ),
        ("  learn:\n    batch_size: 0\n", r"key 'policy.learn.batch_size' in exp.yaml must be >= 1, got 0"),
        ("  discount_factor: 1.5\n", r"key 'policy.discount_factor' in exp.yaml must be > 0 and <= 1, got 1.5"),
        ("  learn:\n    loss: l1\n", r"key 'policy.learn.loss' in exp.yaml must be one of 'mse', 'huber', got 'l1'"),
        ("replay_buffer:\n  beta: 2\n", r"key 'replay_buffer.beta' in exp.yaml must be >= 0 and <= 1, got 2.0"),
        ("env:\n  collector_env_num: 0\n", r"key 'env.collector_env_num' in exp.yaml must be >= 1, got 0"),
        ("max_env_step: -5\n", r"key 'max_env_step' in exp.yaml must be >= 1, got -5"),
    ],
)
def test_values_out_of_range_name_the_dotted_key(tmp_path, yaml_text, message):
    text = BASE + yaml_text if yaml_text.startswith("  ") else BASE + yaml_text
    if yaml_text.startswith("env:"):
        text = "env:\n  env_type: cartpole\n  collector_env_num: 0\npolicy:\n  policy_type: dqn\n"
    with pytest.raises(ConfigError, match=message):
        compile_config(read_config(write(tmp_path, text)))


def test_renamed_keys_say_where_they_went(tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"'policy.learn.train_iteration' in exp.yaml was renamed to 'policy.learn.update_per_collect'",
    ):
        compile_config(read_config(write(tmp_path, BASE + "  learn:\n    train_iteration: 4\n")))
    with pytest.raises(ConfigError, match=r"'policy.model.model_type' in exp.yaml was renamed to 'policy.model_type'"):
        compile_config(read_config(write(tmp_path, BASE + "  model:\n    model_type: fc_discrete_net\n")))


def test_replay_buffer_section_is_checked_against_the_buffer_actually_built(tmp_path):
    """With priority off the uniform ReplayBuffer is built: a prioritized-only key is an error, not dropped."""
    text = BASE + "  priority: false\nreplay_buffer:\n  alpha: 0.7\n"
    with pytest.raises(
        ConfigError, match=r"unknown key 'replay_buffer.alpha' in exp.yaml; valid keys under 'replay_buffer'"
    ):
        compile_config(read_config(write(tmp_path, text)))
    ok = compile_config(read_config(write(tmp_path, BASE + "  priority: false\nreplay_buffer:\n  maxlen: 500\n")))
    assert "alpha" not in ok.replay_buffer and ok.replay_buffer.maxlen == 500
    prioritized = compile_config(read_config(write(tmp_path, BASE + "replay_buffer:\n  alpha: 0.7\n")))
    assert prioritized.replay_buffer.alpha == 0.7


def test_on_policy_config_has_no_replay_buffer(tmp_path):
    text = "env:\n  env_type: cartpole\npolicy:\n  policy_type: ppo\nreplay_buffer:\n  maxlen: 100\n"
    with pytest.raises(
        ConfigError, match=r"section 'replay_buffer' in exp.yaml does not apply: policy 'ppo' is on-policy"
    ):
        compile_config(read_config(write(tmp_path, text)))
    cfg = compile_config(read_config(write(tmp_path, "env:\n  env_type: cartpole\npolicy:\n  policy_type: ppo\n")))
    assert "replay_buffer" not in cfg and cfg.policy.on_policy is True
    with pytest.raises(ConfigError, match=r"'policy.on_policy' in exp.yaml is False but PPOPolicy is on-policy"):
        compile_config(
            read_config(
                write(tmp_path, "env:\n  env_type: cartpole\npolicy:\n  policy_type: ppo\n  on_policy: false\n")
            )
        )


def test_compile_config_with_explicit_parts_imports_no_torch_or_env():
    """nervex.config validates against the parts it is given; it imports no policy, env or torch module itself."""
    code = """
import sys
from nervex.config import ConfigParts, Field, compile_config, ConfigError
parts = ConfigParts(sections=dict(policy=dict(policy_type='', learn=dict(lr=Field(1e-3, gt=0))), env=dict(env_id='x')))
cfg = compile_config({'policy': {'policy_type': 'mine', 'learn': {'lr': 0.01}}, 'seed': 3}, parts)
assert cfg.policy.learn.lr == 0.01 and cfg.seed == 3 and cfg.env.env_id == 'x'
try:
    compile_config({'policy': {'learn': {'lr': 0}}}, parts)
except ConfigError as e:
    assert "key 'policy.learn.lr' must be > 0" in str(e), e
else:
    raise AssertionError('no error')
assert 'torch' not in sys.modules and 'gymnasium' not in sys.modules, [m for m in ('torch', 'gymnasium') if m in sys.modules]
print('ok')
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_policy_import_names_load_a_users_policy_module(tmp_path):
    (tmp_path / "my_policy_mod.py").write_text(
        "from nervex.policy import DQNPolicy, register_policy\n"
        "class MyDQN(DQNPolicy):\n    pass\n"
        "register_policy('my_dqn_from_import_names', MyDQN)\n"
    )
    text = "env:\n  env_type: cartpole\npolicy:\n  policy_type: my_dqn_from_import_names\n  import_names: [my_policy_mod]\n"
    cfg = compile_config(read_config(write(tmp_path, text)))  # found next to the config file
    assert cfg.policy.policy_type == "my_dqn_from_import_names"
    bad = text.replace("[my_policy_mod]", "[no_such_mod_xyz]")
    with pytest.raises(ConfigError, match=r"key 'policy.import_names\[0\]': cannot import module 'no_such_mod_xyz'"):
        compile_config(read_config(write(tmp_path, bad, "bad.yaml")))


def test_env_import_names_train_a_users_env_from_the_command_line(tmp_path):
    (tmp_path / "my_env_mod.py").write_text(
        "from nervex.envs import GymEnv\n"
        "from nervex.utils import ENV_REGISTRY\n"
        "@ENV_REGISTRY.register('my_short_cartpole')\n"
        "class ShortCartPole(GymEnv):\n"
        "    config = dict(GymEnv.config, env_id='CartPole-v1', max_episode_steps=50)\n"
    )
    text = (
        "max_env_step: 600\nenv:\n  env_type: my_short_cartpole\n  import_names: [my_env_mod]\n  manager_type: base\n"
        "policy:\n  policy_type: dqn\n  learn:\n    learning_starts: 100\nevaluator:\n  eval_freq: 200\n  stop_val: 1000\n"
    )
    path = write(tmp_path, text)
    out = subprocess.run(
        [sys.executable, "-m", "nervex", "-c", path, "--run-root", str(tmp_path / "runs"), "--no-progress"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "max_env_step 600 reached" in out.stdout
    (resolved,) = (tmp_path / "runs").glob("*/config.yaml")
    env = read_config(str(resolved)).env
    # the defaults of the user's class (GymEnv's own max_episode_steps is null) filled the resolved config
    assert env.env_type == "my_short_cartpole" and env.max_episode_steps == 50
