"""Policy: one algorithm seen through four modes (learn, collect, eval, command).

A policy object owns the model and everything an algorithm needs. Workers never touch it directly: the learner
gets ``policy.learn_mode``, the actor ``policy.collect_mode``, the evaluator ``policy.eval_mode`` and the
pipeline ``policy.command_mode``. Each mode is a small named tuple of bound functions, so the parallel mode can
hand one mode to a process without the others.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections import deque
from typing import Any, Dict, List, NamedTuple, Optional, Sequence

import numpy as np
import torch
from easydict import EasyDict

from nervex.torch_utils import collate, to_device
from nervex.utils import MODEL_REGISTRY, POLICY_REGISTRY

MODES = ("learn", "collect", "eval", "command")


class LearnMode(NamedTuple):
    forward: Any  # (batch: dict of tensors) -> dict of figures (+ 'priority')
    reset: Any
    state_dict: Any
    load_state_dict: Any
    monitor_vars: Any  # () -> list of the figure names forward returns


class CollectMode(NamedTuple):
    forward: Any  # (data_id: list, obs: dict env_id -> obs, **setting) -> dict env_id -> output
    process_transition: Any
    get_train_sample: Any
    reset: Any
    traj_len: int  # call get_train_sample once a trajectory cache holds this many transitions (or the episode ends)
    state_dict: Any
    load_state_dict: Any


class EvalMode(NamedTuple):
    forward: Any  # (data_id, obs) -> dict env_id -> output
    reset: Any
    state_dict: Any
    load_state_dict: Any


class CommandMode(NamedTuple):
    get_setting_collect: Any  # (command_info: dict) -> dict of collect kwargs (e.g. {'eps': 0.1})
    get_setting_learn: Any
    get_setting_eval: Any


def set_seed(seed: int) -> None:
    """Seed Python, NumPy and torch with one number."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class Policy(ABC):
    """The base of every algorithm.

    Subclasses implement ``_init_learn``/``_forward_learn``, ``_init_collect``/``_forward_collect``/
    ``_process_transition``/``_get_train_sample``, ``_init_eval``/``_forward_eval``, ``_init_command``/
    ``_get_setting_collect`` and ``_create_model_from_cfg``, and declare defaults in ``config``.

    Args:
        cfg: The compiled ``policy`` section.
        model: A ready model; built from ``cfg.model`` when omitted.
        enable_field: The modes to initialise (default: all four). A learner process needs only ``['learn']``.
    """

    config: Dict[str, Any] = dict(policy_type="", use_cuda=False, model={})

    def __init__(
        self, cfg: Dict[str, Any], model: Optional[torch.nn.Module] = None, enable_field: Optional[Sequence[str]] = None
    ) -> None:
        self._cfg = EasyDict(cfg)
        self._use_cuda = bool(self._cfg.get("use_cuda", False))
        if self._use_cuda and not torch.cuda.is_available():
            raise RuntimeError("policy.use_cuda is true but torch finds no CUDA device; set policy.use_cuda: false")
        self._device = torch.device("cuda" if self._use_cuda else "cpu")
        self._enable_field = list(enable_field or MODES)
        for field in self._enable_field:
            if field not in MODES:
                raise ValueError(f"unknown policy mode '{field}'; valid: {', '.join(MODES)}")
        self._model = model if model is not None else self._create_model_from_cfg(self._cfg)
        self._model.to(self._device)
        for field in self._enable_field:
            getattr(self, f"_init_{field}")()

    @property
    def model(self) -> torch.nn.Module:
        return self._model

    @property
    def device(self) -> torch.device:
        return self._device

    def _create_model_from_cfg(self, cfg: Dict[str, Any], model_type: Optional[str] = None) -> torch.nn.Module:
        """Build the model named by ``cfg.model.model_type`` from the remaining ``cfg.model`` keys."""
        import nervex.model  # noqa: F401  (registers the built-in models)

        kwargs = dict(cfg.get("model", {}))
        model_type = model_type or kwargs.pop("model_type", None)
        kwargs.pop("model_type", None)
        if model_type is None:
            raise ValueError(f"policy.model.model_type is required; registered models: {MODEL_REGISTRY.names()}")
        return MODEL_REGISTRY.build(model_type, **kwargs)

    # ---- the four modes -------------------------------------------------------------------------------------
    @abstractmethod
    def _init_learn(self) -> None: ...

    @abstractmethod
    def _forward_learn(self, data: Dict[str, Any]) -> Dict[str, Any]: ...

    @abstractmethod
    def _init_collect(self) -> None: ...

    @abstractmethod
    def _forward_collect(self, data_id: List[int], data: Dict[int, Any], **setting: Any) -> Dict[int, Any]: ...

    @abstractmethod
    def _process_transition(self, obs: Any, agent_output: Dict[str, Any], timestep: Any) -> Dict[str, Any]: ...

    @abstractmethod
    def _get_train_sample(self, traj_cache: deque) -> List[Dict[str, Any]]: ...

    @abstractmethod
    def _init_eval(self) -> None: ...

    @abstractmethod
    def _forward_eval(self, data_id: List[int], data: Dict[int, Any]) -> Dict[int, Any]: ...

    def _init_command(self) -> None:
        pass

    def _get_setting_collect(self, command_info: Dict[str, Any]) -> Dict[str, Any]:
        return {}

    def _get_setting_learn(self, command_info: Dict[str, Any]) -> Dict[str, Any]:
        return {}

    def _get_setting_eval(self, command_info: Dict[str, Any]) -> Dict[str, Any]:
        return {}

    def _reset_learn(self, data_id: Optional[List[int]] = None) -> None:
        pass

    def _reset_collect(self, data_id: Optional[List[int]] = None) -> None:
        pass

    def _reset_eval(self, data_id: Optional[List[int]] = None) -> None:
        pass

    def _monitor_vars_learn(self) -> List[str]:
        return ["cur_lr", "total_loss"]

    @property
    def _traj_len(self) -> int:
        return 1

    # ---- state -----------------------------------------------------------------------------------------------
    def _state_dict_learn(self) -> Dict[str, Any]:
        return {"model": self._model.state_dict()}

    def _load_state_dict_learn(self, state_dict: Dict[str, Any]) -> None:
        self._model.load_state_dict(state_dict["model"])

    def _state_dict_eval(self) -> Dict[str, Any]:
        return {"model": self._model.state_dict()}

    def _load_state_dict_eval(self, state_dict: Dict[str, Any]) -> None:
        self._model.load_state_dict(state_dict["model"])

    # ---- public mode views -----------------------------------------------------------------------------------
    def _require(self, field: str) -> None:
        if field not in self._enable_field:
            raise RuntimeError(f"{type(self).__name__} was built without its '{field}' mode (enable_field)")

    @property
    def learn_mode(self) -> LearnMode:
        self._require("learn")
        return LearnMode(
            self._forward_learn,
            self._reset_learn,
            self._state_dict_learn,
            self._load_state_dict_learn,
            self._monitor_vars_learn,
        )

    @property
    def collect_mode(self) -> CollectMode:
        self._require("collect")
        return CollectMode(
            self._forward_collect,
            self._process_transition,
            self._get_train_sample,
            self._reset_collect,
            self._traj_len,
            self._state_dict_eval,
            self._load_state_dict_eval,
        )

    @property
    def eval_mode(self) -> EvalMode:
        self._require("eval")
        return EvalMode(self._forward_eval, self._reset_eval, self._state_dict_eval, self._load_state_dict_eval)

    @property
    def command_mode(self) -> CommandMode:
        self._require("command")
        return CommandMode(self._get_setting_collect, self._get_setting_learn, self._get_setting_eval)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(modes={self._enable_field}, device={self._device})"


class CommonPolicy(Policy):
    """A Policy with the batching every value-based or actor-critic policy shares.

    ``_batch_obs`` turns ``{env_id: obs}`` into one tensor batch on the policy's device, and ``_unbatch`` splits a
    batched model output back into ``{env_id: output}`` of NumPy values.
    """

    def _batch_obs(self, data_id: List[int], data: Dict[int, Any]) -> Any:
        batch = collate([data[i] for i in data_id])
        return to_device(batch, self._device) if self._use_cuda else batch

    def _unbatch(self, data_id: List[int], output: Dict[str, Any]) -> Dict[int, Dict[str, Any]]:
        # One device->host copy per field, then cheap NumPy row views: this runs on every env step.
        arrays = {k: v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else v for k, v in output.items()}
        return {env_id: {k: v[i] for k, v in arrays.items()} for i, env_id in enumerate(data_id)}

    def _to_learn_device(self, data: Dict[str, Any]) -> Dict[str, Any]:
        return to_device(data, self._device) if self._use_cuda else data


def register_policy(name: str, policy_cls: type) -> type:
    """Make ``policy_cls`` usable from configs as ``policy.policy_type: name``."""
    if not (isinstance(policy_cls, type) and issubclass(policy_cls, Policy)):
        raise TypeError(f"register_policy('{name}', ...) needs a Policy subclass, got {policy_cls!r}")
    return POLICY_REGISTRY.register(name, policy_cls)


def create_policy(cfg: Dict[str, Any], **kwargs: Any) -> Policy:
    """Build the policy named by ``cfg.policy_type`` (the compiled ``policy`` section)."""
    name = cfg.get("policy_type")
    if name not in POLICY_REGISTRY:
        raise KeyError(POLICY_REGISTRY.unknown_message(str(name)))
    return POLICY_REGISTRY.get(name)(cfg, **kwargs)
