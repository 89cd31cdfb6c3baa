"""The config reference documents every key a compiled config has, so it cannot drift from the code."""

import os

from nervex.config import compile_config, read_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def flat_keys(cfg, prefix=""):
    for key, value in cfg.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict) and value and key not in ("model",):
            yield from flat_keys(value, path)
        else:
            yield path


def test_config_reference_covers_every_key():
    with open(os.path.join(ROOT, "docs", "config_reference.md"), encoding="utf-8") as f:
        text = f.read()
    cfg = compile_config(read_config(os.path.join(ROOT, "app_zoo/classic_control/cartpole/config/cartpole_dqn.yaml")))
    cfg.env.manager_type = "subprocess"
    missing = [k for k in flat_keys(cfg) if f"`{k}`" not in text]
    assert not missing, f"keys missing from docs/config_reference.md: {missing}"
    for key in ("env.manager.worker_num", "env.manager.step_timeout"):  # subprocess manager options
        assert f"`{key}`" in text
