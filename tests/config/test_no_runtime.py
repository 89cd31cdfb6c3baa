"""``nervex.config`` knows no runtime: it compiles against the parts it is given and imports no torch, gymnasium,
policy, env or entry module, whatever the call; the builder-aware compile is ``nervex.entry.compile_config``."""

import json
import os
import subprocess
import sys

import pytest

from nervex.config import ConfigError, ConfigParts, read_config, save_config
from nervex.config import compile_config as compile_with_parts
from nervex.entry import compile_config, compile_parallel_config, config_parts

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CARTPOLE = os.path.join(ROOT, "app_zoo/classic_control/cartpole/config/cartpole_dqn.yaml")
CARTPOLE_PPO = os.path.join(ROOT, "app_zoo/classic_control/cartpole/config/cartpole_ppo.yaml")
CARTPOLE_DIST = os.path.join(ROOT, "app_zoo/classic_control/cartpole/dist/cartpole_dqn_dist.yaml")
RUNTIME = ("torch", "gymnasium", "nervex.policy", "nervex.envs", "nervex.entry", "nervex.worker", "nervex.data")

# Runs in a fresh interpreter: argv[1] the serial YAML, argv[2] the parallel YAML, argv[3] a config.yaml that
# nervex.entry.compile_parallel_config wrote of it. Prints what it compiled and what it imported, as JSON.
CHILD = r"""
import json, sys
from nervex.config import ConfigError, ConfigParts, Field, TOP_LEVEL_DEFAULTS, compile_config, read_config

# the serial config against plain parts: declared top level and evaluator, the other sections open
evaluator = dict(n_episode=Field(5, ge=1), eval_freq=Field(1000, ge=1), stop_val=Field(None, kind="number"))
sections = dict(env={}, policy={}, replay_buffer={}, evaluator=evaluator)
parts = ConfigParts(sections=sections, open_sections=["env", "policy", "replay_buffer"])
serial = compile_config(read_config(sys.argv[1]), parts)
refused = []
for bad in ({"evaluater": {}}, {"evaluator": {"n_episod": 3}}, {"seed": -1}):
    try:
        compile_config(dict(serial, **bad), parts)
    except ConfigError as error:
        refused.append(str(error))

# the parallel config: the same, with the system section's declarations (plain data in nervex.system.system_config)
from nervex.system.system_config import SYSTEM_CONFIG, compile_coordinator_config, config_hash
dist_parts = ConfigParts(sections=dict(sections, system=SYSTEM_CONFIG), open_sections=["env", "policy", "replay_buffer"])
dist = compile_config(read_config(sys.argv[2]), dist_parts)
# the coordinator's reading of the run's config.yaml
compiled = compile_coordinator_config(read_config(sys.argv[3]))
print(json.dumps(dict(
    seed=serial.seed, batch_size=serial.policy.learn.batch_size, stop_val=serial.evaluator.stop_val,
    max_env_step=serial.max_env_step, max_train_iter=serial.max_train_iter, refused=refused, n_sample=dist.system.coordinator.n_sample,
    lease_s=dist.system.coordinator.lease_s, collect=dict(compiled.system.collect), hash=config_hash(compiled),
    modules=sorted(sys.modules),
)))
"""


def test_nervex_config_alone_compiles_shipped_configs_and_imports_no_runtime(tmp_path):
    compiled_path = tmp_path / "config.yaml"
    entry_compiled = compile_parallel_config(read_config(CARTPOLE_DIST))
    save_config(entry_compiled, compiled_path)
    from nervex.system.system_config import config_hash

    env = dict(os.environ, PYTHONPATH=ROOT)
    args = [sys.executable, "-c", CHILD, CARTPOLE, CARTPOLE_DIST, str(compiled_path)]
    done = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (out["seed"], out["batch_size"], out["stop_val"], out["max_env_step"]) == (0, 64, 195, 200_000)
    assert out["max_train_iter"] == 1_000_000_000  # a top-level default the YAML leaves out
    assert len(out["refused"]) == 3
    assert "unknown key 'evaluater'" in out["refused"][0] and "did you mean 'evaluator'" in out["refused"][0]
    assert "unknown key 'evaluator.n_episod'" in out["refused"][1]
    assert "key 'seed' must be >= 0" in out["refused"][2]
    assert (out["n_sample"], out["lease_s"]) == (512, 10.0)
    assert out["collect"] == {"unit": "sample", "n": 512, "restart_envs": False, "learning_starts": 500}
    assert out["hash"] == config_hash(entry_compiled)  # the coordinator's reading hashes as the entry's compile
    imported = [m for m in out["modules"] if any(m == r or m.startswith(r + ".") for r in RUNTIME)]
    assert imported == [], f"nervex.config / protocol imported runtime modules: {imported}"
    assert "nervex.config" in out["modules"] and "nervex.system.system_config" in out["modules"]


def test_import_nervex_config_imports_no_runtime_module():
    code = "import sys, nervex.config, nervex.system.protocol, nervex.system.system_config; print(' '.join(sorted(sys.modules)))"
    env = dict(os.environ, PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    modules = done.stdout.split()
    assert [m for m in modules if any(m == r or m.startswith(r + ".") for r in RUNTIME)] == []


def test_compile_config_without_parts_names_the_entry():
    with pytest.raises(TypeError, match=r"nervex\.entry\.compile_config\(cfg\)"):
        compile_with_parts(read_config(CARTPOLE))
    with pytest.raises(TypeError, match="got parts=None"):
        compile_with_parts(read_config(CARTPOLE), None)


def test_the_entry_compile_is_config_parts_then_nervex_config():
    raw = read_config(CARTPOLE)
    assert compile_config(raw) == compile_with_parts(raw, config_parts(raw))
    with pytest.raises(ConfigError, match="unknown key 'policy.lern'"):
        compile_config(dict(raw, policy=dict(raw.policy, lern={})))


@pytest.mark.parametrize("path, absent", [(CARTPOLE, []), (CARTPOLE_PPO, ["replay_buffer"])])
def test_config_parts_names_exactly_the_run_sections(path, absent):
    from nervex.system.system_config import RUN_SECTIONS

    parts = config_parts(read_config(path))
    assert isinstance(parts, ConfigParts)
    assert sorted(parts.sections) + sorted(parts.absent) == sorted(set(RUN_SECTIONS) - set(absent)) + absent
