"""Config reading, merging and validation: each error message is checked."""

import os
import textwrap

import pytest

from nervex.config import ConfigError, apply_overrides, compile_config, read_config, validate_merge

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
    assert cfg.policy.model.model_type == "fc_discrete_net"
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
