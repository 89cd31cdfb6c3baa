"""Agent: a model plus named extra models (targets, critics), each wrapped by a chain of plugins."""

from __future__ import annotations

import copy
import inspect
from typing import Any, Dict, Iterable, List, Mapping, Optional

import torch
import torch.nn as nn

from .plugins import AgentPlugin, create_plugin
from .target import TargetUpdater

MAIN = "main"


def _model_kwarg_names(model: nn.Module) -> Optional[frozenset]:
    """Keyword names ``model.forward`` accepts besides the data, or None when it takes ``**kwargs``."""
    params = list(inspect.signature(model.forward).parameters.values())
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params[1:] if p.kind is not inspect.Parameter.VAR_POSITIONAL)


class Agent:
    """Runs a model through its plugins, with optional named extra models.

    The main model is called ``'main'``. ``add_model`` adds more: a *tracking* copy of another model kept in step
    by ``target_update()`` (``'target'``, ``'target_actor'``...), or an independent model (a second critic). Each
    model has its own plugin chain: the first plugin added is the innermost, next to the model. Keyword arguments
    of a forward call go to the plugins that name them (``eps``, ``state_id``); the rest go to the model.

    Args:
        model: An ``nn.Module`` whose ``forward`` returns a dict (shared, not copied: the policy's optimizer
            updates it).

    Example:
        >>> agent = Agent(model)
        >>> agent.add_model('target', update_type='assign', update_kwargs={'freq': 100})
        >>> agent.add_plugin('main', 'eps_greedy_sample')
        >>> agent.forward(obs, eps=0.1)['action']
        >>> agent.target_forward(next_obs)['logit']
    """

    def __init__(self, model: nn.Module) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"Agent needs an nn.Module, got {type(model).__name__}")
        self._models: Dict[str, nn.Module] = {MAIN: model}
        self._plugins: Dict[str, List[AgentPlugin]] = {MAIN: []}
        self._model_kwargs: Dict[str, Optional[frozenset]] = {MAIN: _model_kwarg_names(model)}
        self._updaters: Dict[str, TargetUpdater] = {}

    # ---- models --------------------------------------------------------------------------------------------------
    @property
    def model(self) -> nn.Module:
        """The main model."""
        return self._models[MAIN]

    @property
    def target_model(self) -> Optional[nn.Module]:
        """The model named ``'target'``, or None."""
        return self._models.get("target")

    @property
    def extra_model_names(self) -> List[str]:
        """Names of the models added with ``add_model``, in the order they were added."""
        return [name for name in self._models if name != MAIN]

    def get_model(self, name: str) -> nn.Module:
        """The model called ``name``.

        Raises:
            KeyError: no such model; the message lists the agent's models.
        """
        if name not in self._models:
            raise KeyError(f"Agent has no model '{name}'; it has {list(self._models)}")
        return self._models[name]

    def add_model(
        self,
        name: str = "target",
        update_type: Optional[str] = "assign",
        update_kwargs: Optional[Dict[str, Any]] = None,
        source: str = MAIN,
        model: Optional[nn.Module] = None,
    ) -> nn.Module:
        """Add a named model.

        Args:
            name: Its name (not ``'main'``).
            update_type: For a tracking copy: ``'assign'`` (copy every N-th ``target_update``) or ``'momentum'``
                (Polyak averaging on every one). None with ``model`` adds an independent model.
            update_kwargs: ``{'freq': N}`` for ``'assign'``, ``{'theta': t}`` with ``0 < t <= 1`` for ``'momentum'``.
            source: The model a tracking copy copies and follows.
            model: An independent model to add instead of a copy (its parameters are the caller's to optimize).

        Returns:
            The added model.

        Raises:
            ValueError: the name is taken or ``'main'``, ``source`` is unknown, or bad ``update_type`` /
                ``update_kwargs``, or neither a tracking copy nor a model is described.
        """
        if name == MAIN or name in self._models:
            raise ValueError(f"Agent.add_model: a model called '{name}' already exists")
        if model is not None:
            if update_type not in (None, "assign") or update_kwargs:
                raise ValueError(f"Agent.add_model('{name}', model=...) adds an independent model; drop update_type")
            if not isinstance(model, nn.Module):
                raise TypeError(f"Agent.add_model('{name}'): model must be an nn.Module, got {type(model).__name__}")
            added = model
        else:
            if update_type is None:
                raise ValueError(f"Agent.add_model('{name}'): give update_type for a tracking copy, or model=...")
            if source not in self._models:
                raise ValueError(f"Agent.add_model('{name}'): unknown source '{source}'; have {list(self._models)}")
            added = copy.deepcopy(self._models[source])
            added.requires_grad_(False)  # only ever moved by target_update, never by an optimizer
            self._updaters[name] = TargetUpdater(self._models[source], added, update_type, update_kwargs)
        self._models[name] = added
        self._plugins[name] = []
        self._model_kwargs[name] = _model_kwarg_names(added)
        return added

    def target_update(self, state_dict: Optional[Mapping[str, Any]] = None, name: Optional[str] = None) -> None:
        """Move the tracking copies towards their sources (see ``add_model``).

        Args:
            state_dict: Weights to move towards instead of the source's current ones (nerveX's
                ``agent.target_update(agent.state_dict()['model'])``; the main model's state, for ``'target'``).
            name: Update only this tracking copy (default: all of them).

        Raises:
            RuntimeError: there is no tracking copy (call ``add_model`` first).
        """
        if not self._updaters:
            raise RuntimeError("Agent.target_update() needs a target model; call add_model('target', ...) first")
        names = [name] if name is not None else list(self._updaters)
        for key in names:
            self._updaters[key].update(state_dict)

    # ---- plugins -------------------------------------------------------------------------------------------------
    def add_plugin(self, model_name: str, name: str, **kwargs: Any) -> None:
        """Wrap ``model_name``'s forward with the registered plugin ``name`` (see ``nervex.agent.plugins``).

        Raises:
            ValueError: unknown model or plugin name (with a suggestion), or the plugin (or a second sampling
                plugin) is already on that model.
        """
        if model_name not in self._models:
            raise ValueError(
                f"Agent.add_plugin('{model_name}', ...): no such model; have {list(self._models)} "
                "(add it with add_model first)"
            )
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
        model, plugins = self.get_model(model_name), self._plugins[model_name]
        model_kwargs = dict(kwargs)
        plugin_kwargs = [{k: model_kwargs.pop(k) for k in p.forward_kwargs if k in model_kwargs} for p in plugins]
        accepted = self._model_kwargs[model_name]
        if accepted is not None:
            unknown = [k for k in model_kwargs if k not in accepted]
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
            **kwargs: Plugin arguments (``eps=0.1``, ``state_id=[0, 2]``); others go to the model (``mode=...``).

        Returns:
            The model's output dict, with e.g. ``'action'`` added by a sampling plugin.
        """
        return self._run(MAIN, data, kwargs)

    def model_forward(self, name: str, data: Any, **kwargs: Any) -> Dict[str, Any]:
        """Run the model called ``name`` through its plugins (tracking copies run without recording gradients)."""
        if name in self._updaters:
            with torch.no_grad():
                return self._run(name, data, kwargs)
        return self._run(name, data, kwargs)

    def target_forward(self, data: Any, **kwargs: Any) -> Dict[str, Any]:
        """Run the ``'target'`` model through its plugins, without recording gradients."""
        if "target" not in self._models:
            raise RuntimeError("Agent.target_forward() needs a target model; call add_model('target', ...) first")
        return self.model_forward("target", data, **kwargs)

    def mode(self, train: bool) -> None:
        """Put every model in train (``True``) or eval (``False``) mode (a no-op for models already there)."""
        for model in self._models.values():
            set_train_mode(model, train)

    def target_mode(self, train: bool) -> None:
        """Put the tracking copies in train or eval mode (nerveX's name; ``mode`` covers them too)."""
        for name in self._updaters:
            set_train_mode(self._models[name], train)

    def reset(self, state_id: Optional[Iterable[int]] = None) -> None:
        """Reset the plugins' per-episode state (recurrent states) for ``state_id``, or all ids when None."""
        self._reset_plugins(self._models, state_id)

    def target_reset(self, state_id: Optional[Iterable[int]] = None) -> None:
        """Reset the per-episode state of the tracking copies' plugins only (nerveX's name)."""
        self._reset_plugins(self._updaters, state_id)

    def _reset_plugins(self, names: Iterable[str], state_id: Optional[Iterable[int]]) -> None:
        state_id = None if state_id is None else list(state_id)
        for name in names:
            for plugin in self._plugins[name]:
                plugin.reset(state_id)

    # ---- persistence ---------------------------------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        """``{'model': main weights}`` plus ``extra_state_dict()``'s entries."""
        return {"model": self.model.state_dict(), **self.extra_state_dict()}

    def extra_state_dict(self) -> Dict[str, Any]:
        """The added models' weights and the tracking copies' update counts (what a learner resumes from)."""
        return {
            "models": {name: self._models[name].state_dict() for name in self.extra_model_names},
            "update_counts": {name: updater.update_count for name, updater in self._updaters.items()},
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load what ``state_dict`` returned (see ``load_extra_state_dict`` for missing extra models).

        Raises:
            KeyError: no ``'model'`` entry.
        """
        if "model" not in state_dict:
            raise KeyError(f"Agent.load_state_dict needs a 'model' entry, got keys {sorted(state_dict)}")
        self.model.load_state_dict(state_dict["model"])
        self.load_extra_state_dict(state_dict)

    def load_extra_state_dict(self, state: Optional[Mapping[str, Any]]) -> None:
        """Load the added models' weights; a tracking copy missing from ``state`` is set to its source's weights.

        Raises:
            KeyError: an independent model is missing from ``state`` (its weights cannot be recovered).
        """
        models = (state or {}).get("models", {})
        counts = (state or {}).get("update_counts", {})
        for name in self.extra_model_names:
            if name in models:
                self._models[name].load_state_dict(models[name])
            elif name in self._updaters:
                self._models[name].load_state_dict(self._updaters[name].main.state_dict())
            else:
                raise KeyError(f"Agent.load_extra_state_dict: no weights for model '{name}'; have {sorted(models)}")
            if name in self._updaters:
                self._updaters[name].update_count = int(counts.get(name, 0))

    def __repr__(self) -> str:
        plugins = {k: [p.name for p in v] for k, v in self._plugins.items()}
        tracking = {k: u.update_type for k, u in self._updaters.items()}
        return (
            f"Agent({type(self.model).__name__}, models={list(self._models)}, tracking={tracking}, plugins={plugins})"
        )


def set_train_mode(model: nn.Module, train: bool) -> None:
    """``model.train(train)`` unless the model is already in that mode.

    ``Module.train`` walks every submodule (~50 us for a small actor-critic); actors switch modes on every env step.
    The top module's flag stands for the whole tree: a submodule switched on its own is not noticed.
    """
    if model.training != train:
        model.train(train)


def _bind(plugin: AgentPlugin, inner: Any, own_kwargs: Dict[str, Any]) -> Any:
    # a separate function so each closure captures its own plugin / inner pair, not the loop variables
    def forward(data: Any) -> Dict[str, Any]:
        return plugin(inner, data, **own_kwargs)

    return forward
