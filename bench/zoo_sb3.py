"""The Stable-Baselines3 side of ``bench/zoo.py``: rl-baselines3-zoo's hyperparameters, read at run time.

The zoo's yml files are read from the installed ``rl_zoo3`` package, so the peer runs with literally the zoo's
settings. For an env the zoo has no entry for, a row gives its own settings in the zoo's format instead (``prepare``
with ``zoo_key=None``): SB3's defaults for everything not listed. Either way the model is built here the way the
zoo's ``ExperimentManager`` builds it:

- ``n_envs`` -> a ``DummyVecEnv`` of that many envs (``make_vec_env``, Monitor-wrapped, env ``i`` seeded
  ``seed + i``);
- ``normalize`` -> ``VecNormalize`` (``true``: obs and reward, with ``gamma`` the algorithm's; a string or dict gives
  the keyword arguments); the evaluation env is a ``VecNormalize`` with ``training=False, norm_reward=False`` whose
  obs statistics are copied from the training env before each evaluation;
- ``policy_kwargs`` / ``normalize`` / ``replay_buffer_kwargs`` written as Python strings are evaluated in a namespace
  holding only ``dict``, ``nn`` (torch.nn), ``th`` (torch) and ``RMSpropTFLike``. This is the zoo's own config
  format (the peer's, not ours: nervex never evaluates a config string); it is done only in this benchmark;
- ``lin_X`` learning-rate / clip-range strings -> a linear schedule ``progress * X``; ``noise_type``/``noise_std``
  -> SB3 action noise; ``frame_stack``, ``env_wrapper``, ``vec_env_wrapper`` and ``callback`` (Atari and
  exotic envs) raise ``NotImplementedError``;
- ``n_timesteps`` is not the run length (the row's budget is), but it anchors everything the zoo gives as a fraction
  of training: ``exploration_fraction`` and ``lin_X`` schedules keep the absolute env-step lengths the zoo runs them
  over (DQN on CartPole: epsilon decays over 0.16 x 50k = 8k steps however long the run is). A ``lin_X`` schedule
  reaches 0 at the zoo's ``n_timesteps`` and stays there, as the zoo's run ends there.
"""

from __future__ import annotations

import importlib.util
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

SCHEDULE_KEYS = ("learning_rate", "clip_range", "clip_range_vf", "delta_std")
STRING_KWARGS = ("policy_kwargs", "replay_buffer_kwargs")
UNSUPPORTED_KEYS = ("frame_stack", "env_wrapper", "vec_env_wrapper", "callback", "replay_buffer_class")
EVAL_SEED_OFFSET = 100_000  # as nervex's evaluator envs: seeded apart from every training env


def sb3_algos() -> Dict[str, type]:
    """The zoo's algorithm names and their classes (SB3 and sb3-contrib)."""
    import sb3_contrib
    import stable_baselines3 as sb3

    return dict(
        a2c=sb3.A2C,
        ddpg=sb3.DDPG,
        dqn=sb3.DQN,
        ppo=sb3.PPO,
        sac=sb3.SAC,
        td3=sb3.TD3,
        ppo_lstm=sb3_contrib.RecurrentPPO,
        qrdqn=sb3_contrib.QRDQN,
        tqc=sb3_contrib.TQC,
        trpo=sb3_contrib.TRPO,
    )


def zoo_hyperparams_dir() -> str:
    """The folder of the installed rl_zoo3's ``hyperparams/*.yml`` (found without importing rl_zoo3)."""
    spec = importlib.util.find_spec("rl_zoo3")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("rl_zoo3 is not installed (pip install -e .[bench])")
    return os.path.join(list(spec.submodule_search_locations)[0], "hyperparams")


def read_zoo_hyperparams(algo: str, zoo_key: str) -> Dict[str, Any]:
    """The zoo's entry ``zoo_key`` of ``hyperparams/{algo}.yml``, as written there.

    Raises:
        KeyError: the zoo has no entry for that key (its ``default`` entry is not used in its place).
    """
    import yaml

    path = os.path.join(zoo_hyperparams_dir(), f"{algo}.yml")
    with open(path, encoding="utf-8") as f:
        entries = yaml.safe_load(f)
    if zoo_key not in entries:
        raise KeyError(f"rl-zoo has no '{zoo_key}' entry in {path}; entries: {', '.join(sorted(entries))}")
    return dict(entries[zoo_key])


def eval_zoo_expr(text: str) -> Any:
    """Evaluate a zoo config string such as ``"dict(net_arch=[256, 256], activation_fn=nn.ReLU)"``.

    Only ``dict``, ``nn``, ``th`` and ``RMSpropTFLike`` are visible, and no builtins.

    Raises:
        NameError: the string uses any other name.
    """
    import torch
    from stable_baselines3.common.sb2_compat.rmsprop_tf_like import RMSpropTFLike

    namespace = {"dict": dict, "nn": torch.nn, "th": torch, "RMSpropTFLike": RMSpropTFLike}
    return eval(text, {"__builtins__": {}}, namespace)  # the zoo's own config format; see the module docstring


@dataclass
class ZooLinearSchedule:
    """The zoo's ``lin_X`` over the zoo's ``n_timesteps``, expressed in the progress of a run ``stretch`` x as long.

    SB3 calls it with ``progress_remaining`` (1 at the start of ``learn``, 0 at ``total_timesteps``).
    """

    initial_value: float
    stretch: float = 1.0  # learn's total_timesteps / the zoo's n_timesteps

    def __call__(self, progress_remaining: float) -> float:
        zoo_progress = 1.0 - (1.0 - progress_remaining) * self.stretch
        return self.initial_value * max(0.0, zoo_progress)


def parse_schedule(key: str, value: Any, stretch: float = 1.0) -> Any:
    """A zoo schedule value (``0.2``, ``"lin_0.001"``) as SB3 takes it: a number or a progress -> value callable.

    Raises:
        ValueError: a string that is not ``lin_<number>``.
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.startswith("lin_"):
        try:
            return ZooLinearSchedule(float(value[len("lin_") :]), stretch)
        except ValueError:
            pass
    raise ValueError(f"zoo setting {key}={value!r}: expected a number or 'lin_<number>' (e.g. 'lin_0.001')")


def normalize_kwargs(setting: Any, gamma: Optional[float]) -> Optional[Dict[str, Any]]:
    """``VecNormalize`` keyword arguments for the zoo's ``normalize`` setting, or None for no normalization."""
    if setting is False or setting is None:
        return None
    if setting is True:
        kwargs: Dict[str, Any] = {}
    elif isinstance(setting, str):
        kwargs = dict(eval_zoo_expr(setting))
    elif isinstance(setting, dict):
        kwargs = dict(setting)
    else:
        raise ValueError(f"zoo setting normalize={setting!r}: expected true/false, a dict or a dict string")
    if gamma is not None:
        kwargs["gamma"] = gamma  # as the zoo: the reward is normalized with the algorithm's discount
    return kwargs


@dataclass
class Sb3Setup:
    """What ``build_model`` needs, derived from one zoo entry or a row's own settings (``zoo_key`` None)."""

    algo: str
    zoo_key: Optional[str]
    zoo_entry: Dict[str, Any]
    n_envs: int
    n_timesteps: int
    normalize: Optional[Dict[str, Any]]
    env_kwargs: Dict[str, Any]
    model_kwargs: Dict[str, Any] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)


def defaults_entry(settings: Mapping[str, Any], learn_timesteps: int) -> Dict[str, Any]:
    """A zoo-format entry for SB3's defaults with ``settings`` over them, for a run of ``learn_timesteps``.

    Raises:
        ValueError: ``settings`` sets ``n_timesteps`` (the run's budget is the row's) or ``policy`` (MlpPolicy).
    """
    for key in ("n_timesteps", "policy"):
        if key in settings:
            raise ValueError(f"SB3 settings set '{key}': the row's budget is the run length and the policy MlpPolicy")
    return dict(policy="MlpPolicy", n_timesteps=learn_timesteps, **settings)


def prepare(
    algo: str, zoo_key: Optional[str], learn_timesteps: int, settings: Optional[Mapping[str, Any]] = None
) -> Sb3Setup:
    """Turn the zoo's entry into constructor arguments for a run of ``learn_timesteps`` env steps.

    Args:
        algo: The zoo's algorithm name (``td3``: ``hyperparams/td3.yml``, ``stable_baselines3.TD3``).
        zoo_key: The zoo's entry; None: no zoo entry, SB3's defaults with ``settings`` over them.
        learn_timesteps: The run's budget in env steps.
        settings: With ``zoo_key`` None, the settings that differ from SB3's defaults, written as in a zoo entry
            (``learning_starts: 1000``, ``noise_type: normal``, ``noise_std: 0.1``).

    Raises:
        ValueError: ``settings`` given together with a ``zoo_key`` (one source of settings).
        NotImplementedError: the entry needs frame stacking or a wrapper (not needed by the rows so far).
    """
    if zoo_key is not None and settings is not None:
        raise ValueError(f"SB3 settings for {algo}: give a zoo entry ('{zoo_key}') or settings, not both")
    if zoo_key is None:
        entry = defaults_entry(settings or {}, learn_timesteps)
        source = f"SB3 {algo.upper()} defaults"
    else:
        entry = read_zoo_hyperparams(algo, zoo_key)
        source = f"rl-zoo {algo}/{zoo_key}"
    params = dict(entry)
    for key in UNSUPPORTED_KEYS:
        if key in params:
            raise NotImplementedError(f"{source} sets '{key}', which bench/zoo_sb3.py does not build")
    n_timesteps = int(float(params.pop("n_timesteps")))
    stretch = learn_timesteps / n_timesteps
    notes = []
    if zoo_key is None:
        listed = ", ".join(f"{k} {v}" for k, v in (settings or {}).items())
        notes.append(f"SB3 trains with its {algo.upper()} defaults" + (f" except {listed}" if listed else ""))
    if learn_timesteps != n_timesteps:
        notes.append(f"zoo n_timesteps {n_timesteps:,}, run budget {learn_timesteps:,}")
    for key in SCHEDULE_KEYS:
        if key in params:
            params[key] = parse_schedule(key, params[key], stretch)
            if isinstance(params[key], ZooLinearSchedule) and stretch > 1:
                notes.append(f"{key} {entry[key]} reaches 0 at the zoo's n_timesteps ({n_timesteps:,})")
    if "exploration_fraction" in params:
        params["exploration_fraction"] = float(params["exploration_fraction"]) / stretch
        steps = entry["exploration_fraction"] * n_timesteps
        notes.append(
            f"exploration over {steps:,.0f} steps (zoo fraction {entry['exploration_fraction']} x n_timesteps)"
        )
    for key in STRING_KWARGS:
        if isinstance(params.get(key), str):
            params[key] = eval_zoo_expr(params[key])
    if isinstance(params.get("train_freq"), list):
        params["train_freq"] = tuple(params["train_freq"])
    n_envs = int(params.pop("n_envs", 1))
    norm = normalize_kwargs(params.pop("normalize", False), entry.get("gamma"))
    if norm is not None:
        shown = {"norm_obs": True, "norm_reward": True, **norm}
        notes.append(f"VecNormalize({', '.join(f'{k}={v}' for k, v in shown.items())})")
    env_kwargs = dict(params.pop("env_kwargs", None) or {})
    return Sb3Setup(algo, zoo_key, entry, n_envs, n_timesteps, norm, env_kwargs, params, notes)


def _action_noise(kwargs: Dict[str, Any], env: Any) -> Dict[str, Any]:
    if kwargs.get("noise_type") is None:
        return kwargs
    import numpy as np
    from stable_baselines3.common.noise import NormalActionNoise, OrnsteinUhlenbeckActionNoise

    kwargs = dict(kwargs)
    noise_type, noise_std = kwargs.pop("noise_type").strip(), kwargs.pop("noise_std")
    n_actions = env.action_space.shape[0]
    classes = {"normal": NormalActionNoise, "ornstein-uhlenbeck": OrnsteinUhlenbeckActionNoise}
    if noise_type not in classes:
        raise ValueError(f"zoo setting noise_type={noise_type!r}: expected one of {', '.join(classes)}")
    kwargs["action_noise"] = classes[noise_type](mean=np.zeros(n_actions), sigma=noise_std * np.ones(n_actions))
    return kwargs


def make_envs(setup: Sb3Setup, env_id: str, seed: int, evaluation: bool) -> Any:
    """The training vec env (``n_envs``, maybe VecNormalize) or a one-env evaluation env seeded apart."""
    import gymnasium as gym
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    if "NoVel" in env_id and env_id not in gym.registry:
        import rl_zoo3.import_envs  # noqa: F401  (registers the zoo's velocity-masked envs, e.g. CartPoleNoVel-v1)
    n_envs = 1 if evaluation else setup.n_envs
    env_seed = seed + EVAL_SEED_OFFSET if evaluation else seed
    env = make_vec_env(env_id, n_envs=n_envs, seed=env_seed, env_kwargs=setup.env_kwargs)
    if setup.normalize is not None:
        kwargs = dict(setup.normalize)
        if evaluation:
            kwargs.update(training=False, norm_reward=False)
        env = VecNormalize(env, **kwargs)
    return env


def build_model(setup: Sb3Setup, env_id: str, seed: int) -> Any:
    """The SB3 model with the zoo's settings on CPU, seeded with ``seed``."""
    env = make_envs(setup, env_id, seed, evaluation=False)
    kwargs = _action_noise(dict(setup.model_kwargs), env)
    policy = kwargs.pop("policy", "MlpPolicy")
    return sb3_algos()[setup.algo](policy, env, seed=seed, device="cpu", verbose=0, **kwargs)


def key_hyperparams(model: Any) -> Dict[str, Any]:
    """The figures a reader compares with nervex's config, read from the built model (SB3's defaults included)."""
    names = (
        "n_envs",
        "n_steps",
        "batch_size",
        "n_epochs",
        "learning_rate",
        "gamma",
        "gae_lambda",
        "clip_range",
        "ent_coef",
        "vf_coef",
        "max_grad_norm",
        "train_freq",
        "gradient_steps",
        "target_update_interval",
        "learning_starts",
        "buffer_size",
        "action_noise",
    )
    out = {name: getattr(model, name) for name in names if hasattr(model, name)}
    out["net_arch"] = model.policy_kwargs.get("net_arch", f"SB3 default {model.policy.net_arch}")
    # plain values only (a record is JSON): schedules and SB3's TrainFreq as their repr
    return {k: v if isinstance(v, (bool, int, float, str, list)) else repr(v) for k, v in out.items()}


def run_sb3(
    setup: Sb3Setup,
    env_id: str,
    seed: int,
    budget: int,
    eval_freq: int,
    n_eval: int,
    stop_at: Optional[float],
    on_eval: Callable[[int, float, float], None],
    max_train_secs: Optional[float] = None,
) -> Dict[str, Any]:
    """Train with greedy evaluations every ``eval_freq`` env steps until ``stop_at`` (None: to the budget), or until
    ``max_train_secs`` of training time (evaluation excluded) have passed.

    ``on_eval(env_step, mean_reward, train_secs)`` is called after each evaluation.

    Returns:
        ``{'env_steps', 'train_secs', 'eval_secs', 'setup_secs', 'resolved'}`` (``resolved``: the built model's key
        hyperparameters, SB3's defaults included).
    """
    import torch
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import sync_envs_normalization

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    model = build_model(setup, env_id, seed)
    eval_env = make_envs(setup, env_id, seed, evaluation=True)
    setup_secs = time.perf_counter() - t0

    class EvalEvery(BaseCallback):
        """Evaluates when ``num_timesteps`` (all envs) has grown by ``eval_freq`` since the last evaluation."""

        def __init__(self) -> None:
            super().__init__()
            self.start = 0.0
            self.eval_secs = 0.0
            self.last_eval_step = 0

        def _on_training_start(self) -> None:
            self.start = time.perf_counter()

        def train_secs(self) -> float:
            return time.perf_counter() - self.start - self.eval_secs

        def _on_step(self) -> bool:
            if self.num_timesteps - self.last_eval_step >= eval_freq:
                self.last_eval_step = self.num_timesteps
                t = time.perf_counter()
                sync_envs_normalization(self.training_env, eval_env)
                mean, _ = evaluate_policy(self.model, eval_env, n_eval_episodes=n_eval, deterministic=True)
                self.eval_secs += time.perf_counter() - t
                on_eval(self.num_timesteps, float(mean), self.train_secs())
                if stop_at is not None and mean >= stop_at:
                    return False
            if max_train_secs is not None and self.train_secs() >= max_train_secs:
                return False
            return self.num_timesteps < budget

    callback = EvalEvery()
    model.learn(total_timesteps=budget, callback=callback)
    result = dict(
        env_steps=int(model.num_timesteps),
        train_secs=callback.train_secs(),
        eval_secs=callback.eval_secs,
        setup_secs=setup_secs,
        resolved=key_hyperparams(model),
    )
    model.get_env().close()
    eval_env.close()
    return result


def throughput_sb3(setup: Sb3Setup, env_id: str, seed: int, steps: int) -> Tuple[float, Dict[str, Any]]:
    """Env steps per second of ``learn(steps)`` with no callback, and the model's key hyperparameters."""
    import torch

    torch.set_num_threads(1)
    model = build_model(setup, env_id, seed)
    start = time.perf_counter()
    model.learn(total_timesteps=steps)
    secs = time.perf_counter() - start
    model.get_env().close()
    return model.num_timesteps / secs, key_hyperparams(model)
