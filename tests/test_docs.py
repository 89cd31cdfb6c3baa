"""The config reference documents every key a compiled config has, so it cannot drift from the code."""

import glob
import os

import pytest

from nervex.config import read_config
from nervex.entry import compile_config, compile_parallel_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# every shipped config (app_zoo registers its envs on import: Atari and MuJoCo ones compile without their extras)
CONFIGS = sorted(
    os.path.relpath(path, ROOT)
    for path in glob.glob(os.path.join(ROOT, "app_zoo", "**", "*.yaml"), recursive=True)
    if not path.endswith("_space.yaml")  # a search space of `nervex -m tune`, not a config
)


USER_NAMED = {"actor.slots": "actor.slots.<name>"}
"""Sections whose keys are names the user chooses: documented once under a placeholder (``actor.slots.<name>.kind``)."""


def flat_keys(cfg, prefix=""):
    for key, value in cfg.items():
        path = f"{prefix}.{key}" if prefix else key
        if prefix in USER_NAMED:
            path = USER_NAMED[prefix]
        if (
            isinstance(value, dict) and value and key not in ("model", "env_kwargs", "scenario_kwargs")
        ):  # a callee's keywords
            yield from flat_keys(value, path)
        else:
            yield path


@pytest.mark.parametrize("config", CONFIGS)
def test_config_reference_covers_every_key(config):
    with open(os.path.join(ROOT, "docs", "config_reference.md"), encoding="utf-8") as f:
        text = f.read()
    import app_zoo  # noqa: F401

    raw = read_config(os.path.join(ROOT, config))
    if "system" in raw:  # a parallel-mode config (app_zoo/**/dist/): the serial sections plus `system`
        cfg = compile_parallel_config(raw)
    else:
        cfg = compile_config(raw)
    cfg.env.manager_type = "subprocess"
    missing = [k for k in flat_keys(cfg) if f"`{k}`" not in text]
    assert not missing, f"keys missing from docs/config_reference.md: {missing}"
    for key in ("env.manager.worker_num", "env.manager.step_timeout"):  # subprocess manager options
        assert f"`{key}`" in text


def test_the_quickstart_policy_trains(tmp_path):
    """The nervex-style policy and YAML of docs/quickstart.md run as printed."""
    import re
    import subprocess
    import sys

    with open(os.path.join(ROOT, "docs", "quickstart.md"), encoding="utf-8") as f:
        text = f.read()
    section = text[text.index("### nervex's style") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    yaml_text = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    (tmp_path / "my_dqn.py").write_text(code)
    (tmp_path / "my.yaml").write_text(yaml_text + "max_env_step: 20000\n")
    out = subprocess.run(
        [sys.executable, "-m", "nervex", "-c", str(tmp_path / "my.yaml"), "--run-root", str(tmp_path), "--no-progress"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "done: evaluation mean" in out.stdout and ">= stop_val 195" in out.stdout, out.stdout + out.stderr[-2000:]
