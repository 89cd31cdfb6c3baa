"""Policy: one algorithm seen through four modes (learn, collect, eval, command).

A policy object owns the model and everything an algorithm needs. Workers never touch it directly: the learner
gets ``policy.learn_mode``, the actor ``policy.collect_mode``, the evaluator ``policy.eval_mode`` and the trainer
``policy.command_mode``; a trainer reads the class's ``contract(cfg)`` and nothing else about the algorithm.

The framework does, in one place, what every policy would otherwise repeat:

- collect and eval: observations ``{env_id: obs}`` are batched (and moved to the policy's device) before
  ``_forward_collect`` / ``_forward_eval``, and their batched output is split back into ``{env_id: output}``;
- settings from the command mode (``{'eps': 0.1}``) reach a mode either as keyword arguments of its forward
  (nervex's way) or as attributes ``self._eps`` for names the mode lists in ``_collect_setting_set`` (nerveX's way);
- state: every mode saves and loads one format (``state_dict``), so a learner snapshot loads into a collect-only or
  eval-only policy; optimizers and the learn agents' extra models are found among the policy's attributes.
"""

from __future__ import annotations

import copy
import inspect
import os
import random
import warnings
from abc import ABC, abstractmethod
from collections import deque
from typing import Any, Callable, ClassVar, Collection, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np
import torch
from easydict import EasyDict

from nervex.agent import Agent
from nervex.config import ConfigError, compile_section, merge_defaults
from nervex.rl_utils.adder import Adder
from nervex.rl_utils.trajectory_adder import TrajectoryAdder
from nervex.torch_utils import collate, to_device
from nervex.utils import MODEL_REGISTRY, POLICY_REGISTRY

from .contract import OFF_POLICY_CONFIG, ON_POLICY_CONFIG, POLICY_BASE_CONFIG, TrainingContract, contract_from_config
from .modes import MODES, CollectMode, CommandMode, EvalMode, LearnMode, Output

_WARNED_UNDECLARED: set = set()  # policy classes already warned about (once per process)


def set_seed(seed: int) -> None:
    """Seed Python, NumPy and torch with one number."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _as_traj_len(value: Any) -> float:
    if value in ("inf", float("inf")):
        return float("inf")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 1:
        raise ValueError(f"policy.collect.traj_len must be an int >= 1 or 'inf', got {value!r}")
    return value


class Policy(ABC):
    """The base of every algorithm.

    A subclass declares:

    - ``config``: its defaults (a nested dict; ``Field`` for keys with a range), laid over the contract keys of its
      kind (``OFF_POLICY_CONFIG`` or ``ON_POLICY_CONFIG``) and the keys every policy has (``POLICY_BASE_CONFIG``);
    - ``on_policy``; ``default_model_type``; ``_buffer_type(cfg)`` when it picks its replay buffer from its config;

    and implements ``_init_learn``/``_forward_learn``, ``_init_collect``/``_forward_collect``/
    ``_process_transition``/``_get_train_sample``, ``_init_eval``/``_forward_eval``, and optionally
    ``_init_command``/``_get_setting_collect``/``_get_setting_learn``, ``_forward_bootstrap`` and
    ``_create_model_from_cfg``. ``_forward_collect``/``_forward_eval`` receive batched observations and return a
    dict of batched outputs with at least ``action``.

    Args:
        cfg: The ``policy`` section (compiled or not: the class validates it).
        model: A ready model; built from ``cfg.model_type``/``cfg.model`` when omitted.
        enable_field: The modes to initialise (default: all four). An actor process needs only ``['collect']``.
    """

    config: ClassVar[Dict[str, Any]] = {}
    on_policy: ClassVar[bool] = False
    default_model_type: ClassVar[Optional[str]] = None
    # How the framework hands settings to a mode: names listed here become attributes ``self._<name>``; any other
    # setting is a keyword argument of the mode's forward. (nerveX policies list theirs in ``_init_<mode>``.)
    _learn_setting_set: Collection[str] = frozenset()
    _collect_setting_set: Collection[str] = frozenset()
    _eval_setting_set: Collection[str] = frozenset()
    # Transitions an off-policy trajectory holds before ``get_train_sample`` ('inf': until the episode ends).
    _traj_len: Union[int, float, str] = 1

    def __init__(
        self,
        cfg: Mapping[str, Any],
        model: Optional[torch.nn.Module] = None,
        enable_field: Optional[Sequence[str]] = None,
    ) -> None:
        self._cfg = self.compile_section(cfg)
        self._use_cuda = bool(self._cfg.use_cuda)
        if self._use_cuda and not torch.cuda.is_available():
            raise RuntimeError("policy.use_cuda is true but torch finds no CUDA device; set policy.use_cuda: false")
        self._device = torch.device("cuda" if self._use_cuda else "cpu")
        self._enable_field = list(enable_field or MODES)
        for mode in self._enable_field:
            if mode not in MODES:
                raise ValueError(f"unknown policy mode '{mode}'; valid: {', '.join(MODES)}")
        if "collect" in self._cfg and "traj_len" in self._cfg.collect:
            self._traj_len = self._cfg.collect.traj_len
        self._model = model if model is not None else self._build_model()
        self._model.to(self._device)
        self._forward_kwargs: Dict[str, frozenset] = {}
        self._init_shared()
        for mode in self._enable_field:
            getattr(self, f"_init_{mode}")()

    # ---- declarations ---------------------------------------------------------------------------------------
    @classmethod
    def declares_config(cls) -> bool:
        """Whether the class (or a base below ``Policy``) declares its own ``config`` defaults."""
        return cls.config is not Policy.config

    @classmethod
    def is_on_policy(cls, cfg: Optional[Mapping[str, Any]] = None) -> bool:
        """The class's ``on_policy``; a class that declares no config reads ``policy.on_policy`` instead."""
        value = (cfg or {}).get("on_policy")
        if cls.declares_config() or value is None:
            return cls.on_policy
        return bool(value)

    @classmethod
    def default_config(cls, on_policy: Optional[bool] = None) -> Dict[str, Any]:
        """The policy section's declared defaults: base keys, the contract keys of its kind, the class's own."""
        kind = ON_POLICY_CONFIG if (cls.on_policy if on_policy is None else on_policy) else OFF_POLICY_CONFIG
        return merge_defaults(merge_defaults(POLICY_BASE_CONFIG, kind), cls.config)

    @classmethod
    def compile_section(cls, cfg: Mapping[str, Any], source: Optional[str] = None) -> EasyDict:
        """Validate a ``policy`` section for this class (unknown keys are errors unless it declares no config).

        Args:
            cfg: The user's ``policy`` section (or a compiled one).
            source: The config file, for messages.
        """
        on_policy = cls.is_on_policy(cfg)
        declared = cls.declares_config()
        if declared and cfg.get("on_policy") is not None and bool(cfg["on_policy"]) != cls.on_policy:
            where = f" in {os.path.basename(source)}" if source else ""
            raise ConfigError(
                f"key 'policy.on_policy'{where} is {cfg['on_policy']} but {cls.__name__} is "
                f"{'on' if cls.on_policy else 'off'}-policy; remove the key"
            )
        if not declared and cls not in _WARNED_UNDECLARED:
            _WARNED_UNDECLARED.add(cls)
            warnings.warn(
                f"{cls.__name__} declares no `config` defaults, so keys of its policy section are not checked "
                "(a typo would be ignored). Declare them as a class attribute, e.g. "
                "`config = dict(learn=dict(learning_rate=1e-3), collect=dict(...), command=dict(...))` "
                "(see docs/quickstart.md, 'Write your own policy')",
                UserWarning,
                stacklevel=3,
            )
        section = compile_section(cls.default_config(on_policy), cfg, "policy", open_keys=not declared, source=source)
        section.on_policy = on_policy
        return section

    @classmethod
    def _buffer_type(cls, cfg: Mapping[str, Any]) -> Optional[str]:
        """The replay buffer an off-policy class trains from (override to choose from the config)."""
        return None if cls.is_on_policy(cfg) else "uniform"

    @classmethod
    def contract(cls, cfg: Mapping[str, Any]) -> TrainingContract:
        """The training contract for a compiled ``policy`` section (see ``nervex.policy.contract``)."""
        on_policy = cls.is_on_policy(cfg)
        return contract_from_config(cfg, on_policy, cls._buffer_type(cfg))

    @classmethod
    def model_class(cls, cfg: Mapping[str, Any]) -> Optional[type]:
        """The model class ``cfg.model_type`` (or the class's default) names; None when neither names one."""
        import nervex.model  # noqa: F401  (registers the built-in models)

        name = cfg.get("model_type") or cls.default_model_type
        return None if name is None else MODEL_REGISTRY.get(name)

    # ---- model ----------------------------------------------------------------------------------------------
    def _build_model(self) -> torch.nn.Module:
        model_cls = None
        if self._cfg.get("model_type"):
            model_cls = self.model_class(self._cfg)
        try:
            return self._create_model_from_cfg(self._cfg, model_cls)
        except TypeError as e:
            raise TypeError(f"building the model of {type(self).__name__} from policy.model failed: {e}") from None

    def _create_model_from_cfg(self, cfg: Mapping[str, Any], model_type: Optional[type] = None) -> torch.nn.Module:
        """Build ``model_type`` (default: the class's ``default_model_type``) with ``cfg.model`` as keywords."""
        model_cls = model_type or self.model_class(cfg)
        if model_cls is None:
            raise ValueError(
                f"{type(self).__name__} has no default model: set policy.model_type to one of "
                f"{', '.join(MODEL_REGISTRY.names())}, or override _create_model_from_cfg"
            )
        return model_cls(**cfg.get("model", {}))

    @property
    def model(self) -> torch.nn.Module:
        return self._model

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def cfg(self) -> EasyDict:
        """The compiled ``policy`` section."""
        return self._cfg

    # ---- what a subclass implements -------------------------------------------------------------------------
    @abstractmethod
    def _init_learn(self) -> None: ...

    @abstractmethod
    def _forward_learn(self, data: Dict[str, Any]) -> Dict[str, Any]: ...

    @abstractmethod
    def _init_collect(self) -> None: ...

    @abstractmethod
    def _forward_collect(self, data_id: List[int], data: Any) -> Output: ...

    @abstractmethod
    def _process_transition(self, obs: Any, agent_output: Output, timestep: Any) -> Dict[str, Any]: ...

    def _get_train_sample(self, traj_cache: deque) -> List[Dict[str, Any]]:
        """nerveX's contract: turn an env's trajectory cache into train samples (popping what it consumed). Only
        for policies without a streaming ``self._adder``; the cache is handed over every ``collect.traj_len``
        transitions and at an episode's end."""
        raise NotImplementedError

    @abstractmethod
    def _init_eval(self) -> None: ...

    @abstractmethod
    def _forward_eval(self, data_id: List[int], data: Any) -> Output: ...

    def _init_shared(self) -> None:
        """Set up what every mode uses (e.g. running normalizers); called before the modes' ``_init_*``."""

    def _init_command(self) -> None:
        """Build schedules (epsilon, learning rate...) from ``self._cfg.command``."""

    def _get_setting_collect(self, command_info: Dict[str, Any]) -> Dict[str, Any]:
        return {}

    def _get_setting_learn(self, command_info: Dict[str, Any]) -> Dict[str, Any]:
        return {}

    def _get_setting_eval(self, command_info: Dict[str, Any]) -> Dict[str, Any]:
        return {}

    def _forward_bootstrap(self, data_id: List[int], data: Any) -> Output:
        """Evaluate observations that are not acted on (e.g. ``{'value': V(obs)}``); only on-policy value methods
        override this. Each output field ``k`` is stored in its transition as ``next_k``."""
        raise NotImplementedError

    def _reset_collect(self, data_id: Optional[List[int]] = None) -> None:
        """Forget per-env state (recurrent states) of the listed envs, or of all."""

    def _reset_eval(self, data_id: Optional[List[int]] = None) -> None:
        """Forget per-env state (recurrent states) of the listed envs, or of all."""

    # ---- state: one format for every mode -------------------------------------------------------------------
    def _state_dict_extra(self) -> Dict[str, Any]:
        """State every mode needs besides the model's weights (e.g. observation-normalization statistics)."""
        return {}

    def _load_state_dict_extra(self, state: Mapping[str, Any]) -> None:
        """Load what ``_state_dict_extra`` returned."""

    def _optimizers(self) -> Dict[str, torch.optim.Optimizer]:
        """Every optimizer among the policy's attributes, by attribute name (``_optimizer`` -> ``'optimizer'``)."""
        return {k.lstrip("_"): v for k, v in vars(self).items() if isinstance(v, torch.optim.Optimizer)}

    def _learn_agents(self) -> Dict[str, Agent]:
        """Every Agent attribute holding extra models (targets): their weights are learn state."""
        return {k.lstrip("_"): v for k, v in vars(self).items() if isinstance(v, Agent) and v.extra_model_names}

    def _state_dict_learn(self) -> Dict[str, Any]:
        """What only a learner needs: the agents' extra models (targets) and every optimizer's state."""
        return {
            "agents": {name: agent.extra_state_dict() for name, agent in self._learn_agents().items()},
            "optimizers": {name: opt.state_dict() for name, opt in self._optimizers().items()},
        }

    def _load_state_dict_learn(self, state: Mapping[str, Any]) -> None:
        agents = state.get("agents", {})
        for name, agent in self._learn_agents().items():
            agent.load_extra_state_dict(agents.get(name))
        optimizers = state.get("optimizers", {})
        for name, optimizer in self._optimizers().items():
            if name in optimizers:
                # torch keeps the given tensors (step, moments) when dtype and device match: copy them, or two
                # policies loaded from one in-memory state would update each other's moments
                optimizer.load_state_dict(copy.deepcopy(optimizers[name]))

    def state_dict(self) -> Dict[str, Any]:
        """``{'model', 'extra', 'learn'}``: the same format from every mode (``learn`` only with the learn mode)."""
        state: Dict[str, Any] = {"model": self._model.state_dict(), "extra": self._state_dict_extra()}
        if "learn" in self._enable_field:
            state["learn"] = self._state_dict_learn()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load a state from any mode: the model and extra state always; learn state if this policy learns.

        A learn-mode policy given a state without ``learn`` (e.g. an eval snapshot) resets its targets to the loaded
        weights and keeps its optimizers fresh.

        Raises:
            ValueError: the state has no ``model`` entry (not a nervex policy state).
        """
        if not isinstance(state, Mapping) or "model" not in state:
            keys = sorted(state) if isinstance(state, Mapping) else type(state).__name__
            raise ValueError(f"{type(self).__name__}.load_state_dict needs a policy state with 'model'; got {keys}")
        self._model.load_state_dict(state["model"])
        self._load_state_dict_extra(state.get("extra", {}))
        if "learn" in self._enable_field:
            self._load_state_dict_learn(state.get("learn", {}))

    # ---- the framework's side of the modes ------------------------------------------------------------------
    def _apply_setting(self, mode: str, forward: Callable[..., Any], setting: Mapping[str, Any]) -> Dict[str, Any]:
        """Set listed settings as attributes; return the rest as keyword arguments of ``forward``."""
        listed = getattr(self, f"_{mode}_setting_set")
        kwargs: Dict[str, Any] = {}
        for key, value in setting.items():
            if key in listed:
                setattr(self, f"_{key}", value)
            else:
                kwargs[key] = value
        if kwargs:
            accepted = self._forward_kwargs.get(mode)
            if accepted is None:
                params = inspect.signature(forward).parameters.values()
                accepted = (
                    frozenset(["*"])
                    if any(p.kind is p.VAR_KEYWORD for p in params)
                    else frozenset(p.name for p in params)
                )
                self._forward_kwargs[mode] = accepted
            unknown = [k for k in kwargs if k not in accepted and "*" not in accepted]
            if unknown:
                raise TypeError(
                    f"{type(self).__name__}: setting(s) {unknown} from the command mode are neither listed in "
                    f"_{mode}_setting_set nor keyword arguments of _forward_{mode}"
                )
        return kwargs

    def _batch_obs(self, data_id: List[int], data: Mapping[int, Any]) -> Any:
        batch = collate([data[i] for i in data_id])
        return to_device(batch, self._device) if self._use_cuda else batch

    def _unbatch(self, data_id: List[int], output: Mapping[str, Any]) -> Dict[int, Output]:
        """Split a batched output into one dict per env (NumPy rows; one device->host copy per field)."""
        return {env_id: row for env_id, row in zip(data_id, _split_rows(output, len(data_id)))}

    def _collect_forward(self, data_id: List[int], data: Mapping[int, Any], **setting: Any) -> Dict[int, Output]:
        kwargs = self._apply_setting("collect", self._forward_collect, setting) if setting else {}
        output = self._forward_collect(data_id, self._batch_obs(data_id, data), **kwargs)
        return self._unbatch(data_id, output)

    def _eval_forward(self, data_id: List[int], data: Mapping[int, Any], **setting: Any) -> Dict[int, Output]:
        kwargs = self._apply_setting("eval", self._forward_eval, setting) if setting else {}
        output = self._forward_eval(data_id, self._batch_obs(data_id, data), **kwargs)
        return self._unbatch(data_id, output)

    def _bootstrap_forward(self, data_id: List[int], data: Mapping[int, Any]) -> Dict[int, Output]:
        with torch.no_grad():
            output = self._forward_bootstrap(data_id, self._batch_obs(data_id, data))
        return self._unbatch(data_id, output)

    def _learn_forward(self, data: Dict[str, Any], **setting: Any) -> Dict[str, Any]:
        kwargs = self._apply_setting("learn", self._forward_learn, setting) if setting else {}
        if self._use_cuda:
            data = to_device(data, self._device)
        if isinstance(data, dict) and "weight" not in data:
            data["weight"] = None  # importance weights: None means ones (on-policy batches, uniform replay)
        return self._forward_learn(data, **kwargs)

    def _has_bootstrap(self) -> bool:
        return type(self)._forward_bootstrap is not Policy._forward_bootstrap

    # ---- public mode views ----------------------------------------------------------------------------------
    def _require(self, mode: str) -> None:
        if mode not in self._enable_field:
            raise RuntimeError(f"{type(self).__name__} was built without its '{mode}' mode (enable_field)")

    @property
    def learn_mode(self) -> LearnMode:
        self._require("learn")
        return LearnMode(self._learn_forward, self.state_dict, self.load_state_dict, self._optimizers)

    @property
    def collect_mode(self) -> CollectMode:
        self._require("collect")
        return CollectMode(
            self._collect_forward,
            self._process_transition,
            self._collect_adder(),
            self._bootstrap_forward if self._has_bootstrap() else None,
            self._reset_collect,
            self.load_state_dict,
        )

    def _collect_adder(self) -> Any:
        """The collect mode's adder: ``self._adder`` when it streams (built with ``kind=``); a ``TrajectoryAdder``
        over ``_get_train_sample`` for a policy that implements it (nerveX's contract). Built once."""
        adder = getattr(self, "_stream_adder", None)
        if adder is not None:
            return adder
        if type(self)._get_train_sample is not Policy._get_train_sample:
            adder = TrajectoryAdder(self._get_train_sample, _as_traj_len(self._traj_len))
        else:
            adder = getattr(self, "_adder", None)
            if not isinstance(adder, Adder) or adder.kind is None:
                raise TypeError(
                    f"{type(self).__name__}: _init_collect must set self._adder = Adder(kind=...) "
                    f"('nstep', 'gae' or 'sequence'), or the policy must implement _get_train_sample(traj_cache)"
                )
        self._stream_adder = adder
        return adder

    @property
    def eval_mode(self) -> EvalMode:
        self._require("eval")
        return EvalMode(self._eval_forward, self._reset_eval, self.load_state_dict)

    @property
    def command_mode(self) -> CommandMode:
        self._require("command")
        return CommandMode(self._get_setting_collect, self._get_setting_learn, self._get_setting_eval)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(modes={self._enable_field}, device={self._device})"


def _split_rows(output: Any, n: int) -> List[Any]:
    """``n`` per-row views of a batched output (tensors and arrays by their first dim; lists by element)."""
    if isinstance(output, torch.Tensor):
        array = output.detach().cpu().numpy()
        return [array[i] for i in range(n)] if array.ndim else [array] * n
    if isinstance(output, np.ndarray):
        return [output[i] for i in range(n)] if output.ndim else [output] * n
    if isinstance(output, Mapping):
        columns = {k: _split_rows(v, n) for k, v in output.items()}
        return [{k: col[i] for k, col in columns.items()} for i in range(n)]
    if isinstance(output, (list, tuple)) and len(output) == n:
        return list(output)
    return [output] * n


def register_policy(name: str, policy_cls: type) -> type:
    """Make ``policy_cls`` usable from configs as ``policy.policy_type: name``.

    Registering a name that another class holds replaces it with a warning (a user's own ``dqn`` replaces the
    built-in one for this process), so a module copied from the nerveX tutorial registers as written.

    Raises:
        TypeError: ``policy_cls`` is not a Policy subclass.
    """
    if not (isinstance(policy_cls, type) and issubclass(policy_cls, Policy)):
        raise TypeError(f"register_policy('{name}', ...) needs a Policy subclass, got {policy_cls!r}")
    if name in POLICY_REGISTRY and POLICY_REGISTRY.get(name) is not policy_cls:
        old = POLICY_REGISTRY.get(name)
        warnings.warn(
            f"policy '{name}' now refers to {policy_cls.__module__}.{policy_cls.__qualname__} "
            f"(was {old.__module__}.{old.__qualname__})",
            UserWarning,
            stacklevel=2,
        )
    return POLICY_REGISTRY.register(name, policy_cls, force=True)


def create_policy(
    cfg: Mapping[str, Any], model: Optional[torch.nn.Module] = None, enable_field: Optional[Sequence[str]] = None
) -> Policy:
    """Build the policy named by ``cfg.policy_type`` (the ``policy`` section).

    Raises:
        KeyError: unknown ``policy_type``; lists the registered ones and the nearest.
    """
    name = cfg.get("policy_type")
    if name not in POLICY_REGISTRY:
        raise KeyError(POLICY_REGISTRY.unknown_message(str(name)))
    return POLICY_REGISTRY.get(name)(cfg, model=model, enable_field=enable_field)
