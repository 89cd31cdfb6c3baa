"""Agent: a model plus an optional target copy, each wrapped by a chain of plugins."""

from __future__ import annotations

import copy
import inspect
from typing import Any, Dict, Iterable, List, Optional

import torch
import torch.nn as nn

from .plugins import AgentPlugin, create_plugin
from .target import TargetUpdater

MODEL_NAMES = ("main", "target")


def _model_kwarg_names(model: nn.Module) -> Optional[frozenset]:
    """Keyword names ``model.forward`` accepts besides the data, or None when it takes ``**kwargs``."""
    params = list(inspect.signature(model.forward).parameters.values())
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params[1:] if p.kind is not inspect.Parameter.VAR_POSITIONAL)


class Agent:
    """Runs a model through its plugins; optionally keeps a target model and updates it.

    Plugins wrap the model's forward call in the order they are added: the first plugin added is the innermost,
    next to the model. Keyword arguments of ``forward`` go to the plugins that name them (``eps``, ``state_id``);
    the rest go to the model.

    Args:
        model: An ``nn.Module`` whose ``forward`` returns a dict.

    Example:
        >>> agent = Agent(model)
        >>> agent.add_model('target', update_type='assign', update_kwargs={'freq': 100})
        >>> agent.add_plugin('main', 'eps_greedy_sample')
        >>> agent.forward(obs, eps=0.1)['action']
    """

    def __init__(self, model: nn.Module) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"Agent needs an nn.Module, got {type(model).__name__}")
        self._models: Dict[str, nn.Module] = {"main": model}
        self._plugins: Dict[str, List[AgentPlugin]] = {"main": [], "target": []}
        self._model_kwargs = _model_kwarg_names(model)
        self._target_updater: Optional[TargetUpdater] = None

    # ---- models --------------------------------------------------------------------------------------------------
    @property
    def model(self) -> nn.Module:
        """The main model (shared, not copied: the policy's optimizer updates it)."""
        return self._models["main"]

    @property
    def target_model(self) -> Optional[nn.Module]:
        """The target model, or None before ``add_model('target', ...)``."""
        return self._models.get("target")

    def add_model(
        self, name: str = "target", update_type: str = "assign", update_kwargs: Optional[Dict[str, Any]] = None
    ) -> None:
        """Add a target model: a deep copy of the main model, kept in step by ``target_update()``.

        Args:
            name: Only ``'target'``.
            update_type: ``'assign'`` (copy every N-th update) or ``'momentum'`` (Polyak averaging every update).
            update_kwargs: ``{'freq': N}`` for ``'assign'``, ``{'theta': t}`` with ``0 < t <= 1`` for ``'momentum'``.

        Raises:
            ValueError: another name, a second target, or bad ``update_type`` / ``update_kwargs``.
        """
        if name != "target":
            raise ValueError(f"Agent.add_model supports only name='target', got '{name}'")
        if "target" in self._models:
            raise ValueError("Agent already has a target model")
        main = self._models["main"]
        target = copy.deepcopy(main)
        target.requires_grad_(False)  # only ever moved by target_update, never by an optimizer
        self._target_updater = TargetUpdater(main, target, update_type, update_kwargs)
        self._models["target"] = target

    def target_update(self) -> None:
        """Move the target model towards the main one (see ``add_model``)."""
        if self._target_updater is None:
            raise RuntimeError("Agent.target_update() needs a target model; call add_model('target', ...) first")
        self._target_updater.update()

    # ---- plugins -------------------------------------------------------------------------------------------------
    def add_plugin(self, model_name: str, name: str, **kwargs: Any) -> None:
        """Wrap ``model_name``'s forward with the plugin ``name``.

        Args:
            model_name: ``'main'`` or ``'target'``.
            name: ``'argmax_sample'``, ``'eps_greedy_sample'``, ``'multinomial_sample'``, ``'grad'``
                (``enable_grad: bool``) or ``'hidden_state'`` (``state_num: int``, ``init_fn``, ``save_prev_state``).
            **kwargs: The plugin's arguments.

        Raises:
            ValueError: unknown model or plugin name (with a suggestion), the target model is missing, or the
                plugin (or a second sampling plugin) is already on that model.
        """
        if model_name not in MODEL_NAMES:
            raise ValueError(f"Agent.add_plugin: model_name must be one of {MODEL_NAMES}, got '{model_name}'")
        if model_name not in self._models:
            raise ValueError(f"Agent.add_plugin('{model_name}', ...): call add_model('target', ...) first")
        plugin = create_plugin(name, **kwargs)
        for other in self._plugins[model_name]:
            if other.name == plugin.name or (other.samples_action and plugin.samples_action):
                raise ValueError(f"'{model_name}' model already has plugin '{other.name}'; cannot add '{name}'")
        self._plugins[model_name].append(plugin)

    def plugin(self, model_name: str, name: str) -> AgentPlugin:
        """The plugin called ``name`` on ``model_name`` (e.g. to read a ``hidden_state`` plugin's ``states``).

        Raises:
            KeyError: no such plugin there; the message lists the plugins that are.
        """
        for plugin in self._plugins.get(model_name, []):
            if plugin.name == name:
                return plugin
        have = [p.name for p in self._plugins.get(model_name, [])]
        raise KeyError(f"'{model_name}' model has no plugin '{name}'; it has {have or 'none'}")

    def _run(self, model_name: str, data: Any, kwargs: Dict[str, Any]) -> Dict[str, Any]:
        model, plugins = self._models[model_name], self._plugins[model_name]
        model_kwargs = dict(kwargs)
        plugin_kwargs = [{k: model_kwargs.pop(k) for k in p.forward_kwargs if k in model_kwargs} for p in plugins]
        if self._model_kwargs is not None:
            unknown = [k for k in model_kwargs if k not in self._model_kwargs]
            if unknown:
                names = [p.name for p in plugins] or "none"
                raise TypeError(
                    f"Agent forward got keyword(s) {unknown} that neither the '{model_name}' model nor its plugins "
                    f"({names}) take"
                )

        def forward(inner_data: Any) -> Dict[str, Any]:
            return model(inner_data, **model_kwargs)

        for plugin, own_kwargs in zip(plugins, plugin_kwargs):
            forward = _bind(plugin, forward, own_kwargs)
        return forward(data)

    # ---- calls ---------------------------------------------------------------------------------------------------
    def forward(self, data: Any, **kwargs: Any) -> Dict[str, Any]:
        """Run the main model through its plugins.

        Args:
            data: The model's input (a tensor, or a dict for models that take several).
            **kwargs: Plugin arguments (``eps=0.1``, ``state_id=[0, 2]``); others go to the model.

        Returns:
            The model's output dict, with e.g. ``'action'`` added by a sampling plugin.
        """
        return self._run("main", data, kwargs)

    def target_forward(self, data: Any, **kwargs: Any) -> Dict[str, Any]:
        """Run the target model through its plugins, without recording gradients."""
        if "target" not in self._models:
            raise RuntimeError("Agent.target_forward() needs a target model; call add_model('target', ...) first")
        with torch.no_grad():
            return self._run("target", data, kwargs)

    def mode(self, train: bool) -> None:
        """Put the main and target models in train (``True``) or eval (``False``) mode."""
        for model in self._models.values():
            model.train(train)

    def reset(self, state_id: Optional[Iterable[int]] = None) -> None:
        """Reset the plugins' per-episode state (recurrent states) for ``state_id``, or all ids when None."""
        state_id = None if state_id is None else list(state_id)
        for plugins in self._plugins.values():
            for plugin in plugins:
                plugin.reset(state_id)

    # ---- persistence ---------------------------------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        """``{'model': ...}``, plus ``'target'`` and ``'target_update_count'`` when there is a target model."""
        state: Dict[str, Any] = {"model": self._models["main"].state_dict()}
        if self._target_updater is not None:
            state["target"] = self._models["target"].state_dict()
            state["target_update_count"] = self._target_updater.update_count
        return state

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Load what ``state_dict`` returned.

        Without a ``'target'`` entry the target model (if any) is set to the main weights; a ``'target'`` entry is
        ignored by an agent without a target model (e.g. an eval agent loading a learner's checkpoint).
        """
        if "model" not in state_dict:
            raise KeyError(f"Agent.load_state_dict needs a 'model' entry, got keys {sorted(state_dict)}")
        self._models["main"].load_state_dict(state_dict["model"])
        if self._target_updater is not None:
            self._models["target"].load_state_dict(state_dict.get("target", state_dict["model"]))
            self._target_updater.update_count = int(state_dict.get("target_update_count", 0))

    def __repr__(self) -> str:
        plugins = {k: [p.name for p in v] for k, v in self._plugins.items() if k in self._models}
        target = f", target={self._target_updater.update_type}" if self._target_updater else ""
        return f"Agent({type(self.model).__name__}{target}, plugins={plugins})"


def _bind(plugin: AgentPlugin, inner: Any, own_kwargs: Dict[str, Any]) -> Any:
    # a separate function so each closure captures its own plugin / inner pair, not the loop variables
    def forward(data: Any) -> Dict[str, Any]:
        return plugin(inner, data, **own_kwargs)

    return forward
