"""Agent plugins: small objects that each wrap one model forward call.

A plugin is called as ``plugin(forward, data, **its_kwargs)``, where ``forward(data) -> dict`` runs everything
inside it (the inner plugins, then the model). It may change ``data`` on the way in, the output on the way out, or the
context the call runs in. ``forward_kwargs`` names the ``Agent.forward`` keyword arguments it takes; the Agent hands
those to it and passes the rest to the model.
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import torch

from nervex.torch_utils.distribution import CategoricalDist, GaussianDist, TanhGaussianDist
from nervex.utils import Registry

ForwardFn = Callable[[Any], Dict[str, Any]]


class AgentPlugin:
    """Base class: a plugin that passes the call through unchanged.

    Attributes:
        name: The name ``Agent.add_plugin`` knows it by.
        forward_kwargs: Names of the ``Agent.forward`` keyword arguments this plugin consumes.
        samples_action: True for plugins that set ``output['action']``; an agent model takes at most one.
    """

    name = "base"
    forward_kwargs: Tuple[str, ...] = ()
    samples_action = False

    def __init__(self) -> None:
        pass

    def __call__(self, forward: ForwardFn, data: Any, **kwargs: Any) -> Dict[str, Any]:
        return forward(data)

    def reset(self, state_id: Optional[Iterable[int]] = None) -> None:
        """Forget per-episode state (only stateful plugins have any)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


# ---- sampling ------------------------------------------------------------------------------------------------------
def _masked_logit(
    output: Dict[str, Any], data: Any, plugin: str, key: str = "logit"
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``output[key]`` with illegal actions at -inf, and the bool mask (or None).

    The mask is ``output['action_mask']`` or, failing that, ``data['action_mask']`` (1/True = legal).
    """
    if not isinstance(output, dict) or not isinstance(output.get(key), torch.Tensor):
        got = sorted(output) if isinstance(output, dict) else type(output).__name__
        raise TypeError(f"{plugin} needs the model output to be a dict with a '{key}' tensor, got {got}")
    logit = output[key]
    mask = output.get("action_mask")
    if mask is None and isinstance(data, dict):
        mask = data.get("action_mask")
    if mask is None:
        return logit, None
    mask = torch.as_tensor(mask, device=logit.device).bool()
    if mask.shape != logit.shape:
        raise ValueError(f"{plugin}: action_mask shape {tuple(mask.shape)} differs from logit {tuple(logit.shape)}")
    if not bool(mask.any(dim=-1).all()):
        raise ValueError(f"{plugin}: action_mask has a row with no legal action")
    return logit.masked_fill(~mask, float("-inf")), mask


class _LogitSamplePlugin(AgentPlugin):
    """Base of the plugins that pick a discrete action from ``output[logit_key]``.

    Args:
        logit_key: The output field holding the logits (or Q-values): ``'logit'`` by default.
    """

    samples_action = True

    def __init__(self, logit_key: str = "logit") -> None:
        if not isinstance(logit_key, str) or not logit_key:
            raise TypeError(f"{self.name}: logit_key must be a non-empty string, got {logit_key!r}")
        self.logit_key = logit_key

    def __repr__(self) -> str:
        return f"{type(self).__name__}(logit_key={self.logit_key!r})"


class ArgmaxSamplePlugin(_LogitSamplePlugin):
    """Sets ``output['action']`` to the legal action with the largest logit (greedy).

    Shapes:
        ``logit`` ``(B, A)`` -> ``action`` ``(B,)`` int64.
    """

    name = "argmax_sample"

    def __call__(self, forward: ForwardFn, data: Any, **kwargs: Any) -> Dict[str, Any]:
        output = forward(data)
        logit, _ = _masked_logit(output, data, self.name, self.logit_key)
        output["action"] = logit.argmax(dim=-1)
        return output


class EpsGreedySamplePlugin(_LogitSamplePlugin):
    """Greedy action, replaced with probability ``eps`` by a uniformly random legal action.

    Needs ``Agent.forward(data, eps=...)``. Draws from torch's global RNG, so a seeded run repeats itself.

    Shapes:
        ``logit`` ``(B, A)`` -> ``action`` ``(B,)`` int64.
    """

    name = "eps_greedy_sample"
    forward_kwargs = ("eps",)

    def __call__(self, forward: ForwardFn, data: Any, eps: Optional[float] = None, **kwargs: Any) -> Dict[str, Any]:
        if eps is None:
            raise TypeError("eps_greedy_sample needs the exploration rate: call forward(data, eps=0.1)")
        eps = float(eps)
        if not 0.0 <= eps <= 1.0:
            raise ValueError(f"eps_greedy_sample: eps must be in [0, 1], got {eps}")
        output = forward(data)
        logit, mask = _masked_logit(output, data, self.name, self.logit_key)
        action = logit.argmax(dim=-1)
        if eps > 0:
            num_actions = logit.shape[-1]
            explore = torch.rand(action.shape, device=action.device) < eps
            if mask is None:
                random_action = torch.randint(num_actions, action.shape, device=action.device)
            else:
                random_action = torch.multinomial(mask.reshape(-1, num_actions).float(), 1).reshape(action.shape)
            action = torch.where(explore, random_action, action)
        output["action"] = action
        return output


class MultinomialSamplePlugin(_LogitSamplePlugin):
    """Samples ``output['action']`` from ``softmax(logit)`` over the legal actions and adds its log-probability
    ``output['logp']`` (what on-policy losses and off-policy corrections need from the behaviour policy).

    Shapes:
        ``logit`` ``(B, A)`` -> ``action`` ``(B,)`` int64, ``logp`` ``(B,)``.
    """

    name = "multinomial_sample"

    def __call__(self, forward: ForwardFn, data: Any, **kwargs: Any) -> Dict[str, Any]:
        output = forward(data)
        logit, _ = _masked_logit(output, data, self.name, self.logit_key)
        with torch.no_grad():
            dist = CategoricalDist(logit, validate_args=False)  # the mask, if any, is already in the logits
            action = dist.sample()
            output["logp"] = dist.log_prob(action)
        output["action"] = action
        return output


class GaussianSamplePlugin(AgentPlugin):
    """Samples a continuous action from a diagonal Gaussian ``N(output['mu'], output['sigma'])``, optionally
    tanh-squashed into the action bounds, and adds its log-probability ``output['logp']``.

    Args:
        mu_key, sigma_key: Output fields of the mean and standard deviation.
        squash: Squash with tanh into ``[low, high]`` (SAC); False samples the plain Gaussian (PPO, A2C), which the
            actor clips to the env's bounds when stepping.
        low, high: Action bounds for ``squash`` (scalars or per dimension, e.g. the env's ``Box.low`` / ``high``).
        deterministic: Take the mode (the mean, squashed) instead of sampling: greedy evaluation.

    Shapes:
        ``mu``, ``sigma`` ``(B, D)`` -> ``action`` ``(B, D)``, ``logp`` ``(B,)``.
    """

    name = "gaussian_sample"
    samples_action = True

    def __init__(
        self,
        mu_key: str = "mu",
        sigma_key: str = "sigma",
        squash: bool = False,
        low: Any = None,
        high: Any = None,
        deterministic: bool = False,
    ) -> None:
        if (low is not None or high is not None) and not squash:
            raise ValueError("gaussian_sample: low/high bound a squashed Gaussian; set squash=True or drop them")
        self.mu_key, self.sigma_key = mu_key, sigma_key
        self.squash, self.low, self.high = bool(squash), low, high
        self.deterministic = bool(deterministic)

    def __call__(self, forward: ForwardFn, data: Any, **kwargs: Any) -> Dict[str, Any]:
        output = forward(data)
        missing = [k for k in (self.mu_key, self.sigma_key) if not isinstance(output.get(k), torch.Tensor)]
        if missing:
            raise TypeError(f"gaussian_sample needs the model output to hold tensors {missing}; got {sorted(output)}")
        mu, sigma = output[self.mu_key], output[self.sigma_key]
        with torch.no_grad():
            if self.squash:
                dist = TanhGaussianDist(mu, sigma, self.low, self.high)
                if self.deterministic:
                    action = dist.mode()
                    output["logp"] = dist.log_prob(action)
                else:
                    action, output["logp"] = dist.sample_with_log_prob()
            else:
                dist = GaussianDist(mu, sigma)
                action = dist.mode() if self.deterministic else dist.sample()
                output["logp"] = dist.log_prob(action)
        output["action"] = action
        return output

    def __repr__(self) -> str:
        return f"GaussianSamplePlugin(squash={self.squash}, deterministic={self.deterministic})"


# ---- execution context ---------------------------------------------------------------------------------------------
class GradPlugin(AgentPlugin):
    """Runs the forward under ``torch.no_grad()`` when ``enable_grad`` is False.

    With ``enable_grad=True`` the caller's grad mode is left as it is, so a caller's own ``torch.no_grad()`` block
    (e.g. DQN picking the double-Q next action) still avoids building a graph.

    Args:
        enable_grad: Whether the forward may record gradients.
    """

    name = "grad"

    def __init__(self, enable_grad: bool) -> None:
        if not isinstance(enable_grad, bool):
            raise TypeError(f"grad plugin: enable_grad must be True or False, got {enable_grad!r}")
        self.enable_grad = enable_grad

    def __call__(self, forward: ForwardFn, data: Any, **kwargs: Any) -> Dict[str, Any]:
        context = contextlib.nullcontext() if self.enable_grad else torch.no_grad()
        with context:
            return forward(data)

    def __repr__(self) -> str:
        return f"GradPlugin(enable_grad={self.enable_grad})"


# ---- recurrent state -----------------------------------------------------------------------------------------------
def _detach(state: Any) -> Any:
    if isinstance(state, torch.Tensor):
        return state.detach()
    if isinstance(state, (list, tuple)) and not hasattr(state, "_fields"):
        return type(state)(_detach(s) for s in state)
    if isinstance(state, dict):
        return {k: _detach(v) for k, v in state.items()}
    return state


class HiddenStatePlugin(AgentPlugin):
    """Keeps one recurrent state per id (per env) between forward calls.

    ``forward(data, state_id=[...])`` puts the listed ids' states into ``data['prev_state']`` (a list in the order
    of ``state_id``; all ids in order when ``state_id`` is None) and stores ``output['next_state'][k]`` as the new
    state of ``state_id[k]``. Stored tensors are detached: gradients do not flow from one call into the next.

    Args:
        state_num: How many states (ids ``0 .. state_num - 1``).
        init_fn: Makes a fresh state, at construction and on ``reset``; None by default (the model starts from zero).
        save_prev_state: Also return the states that went in as ``output['prev_state']`` (to store in transitions).
    """

    name = "hidden_state"
    forward_kwargs = ("state_id",)

    def __init__(self, state_num: int, init_fn: Callable[[], Any] = lambda: None, save_prev_state: bool = False):
        if isinstance(state_num, bool) or not isinstance(state_num, int) or state_num < 1:
            raise ValueError(f"hidden_state plugin: state_num must be a positive int, got {state_num!r}")
        if not callable(init_fn):
            raise TypeError(f"hidden_state plugin: init_fn must be a callable taking no arguments, got {init_fn!r}")
        self.state_num = state_num
        self.init_fn = init_fn
        self.save_prev_state = save_prev_state
        self._states: List[Any] = [init_fn() for _ in range(state_num)]

    def _ids(self, state_id: Optional[Iterable[int]]) -> List[int]:
        if state_id is None:
            return list(range(self.state_num))
        ids = [int(i) for i in state_id]
        bad = [i for i in ids if not 0 <= i < self.state_num]
        if bad:
            raise IndexError(f"hidden_state plugin: state_id {bad} out of range 0..{self.state_num - 1}")
        return ids

    @property
    def states(self) -> List[Any]:
        """The current state of every id (a copy of the list)."""
        return list(self._states)

    def __call__(self, forward: ForwardFn, data: Any, state_id: Optional[Iterable[int]] = None, **kwargs: Any):
        if not isinstance(data, dict):
            raise TypeError(f"hidden_state plugin needs dict data to add 'prev_state' to, got {type(data).__name__}")
        ids = self._ids(state_id)
        prev_state = [self._states[i] for i in ids]
        output = forward({**data, "prev_state": prev_state})  # a new dict: the caller's data is left alone
        if not isinstance(output, dict) or "next_state" not in output:
            raise KeyError("hidden_state plugin needs the model output to hold 'next_state' (one state per id)")
        next_state = output["next_state"]
        if len(next_state) != len(ids):
            raise ValueError(f"hidden_state plugin: got {len(next_state)} next states for {len(ids)} state ids")
        for i, state in zip(ids, next_state):
            self._states[i] = _detach(state)
        if self.save_prev_state:
            output["prev_state"] = prev_state
        return output

    def reset(self, state_id: Optional[Iterable[int]] = None) -> None:
        for i in self._ids(state_id):
            self._states[i] = self.init_fn()

    def __repr__(self) -> str:
        return f"HiddenStatePlugin(state_num={self.state_num})"


PLUGIN_REGISTRY = Registry("agent plugin")
for _cls in (
    ArgmaxSamplePlugin,
    EpsGreedySamplePlugin,
    MultinomialSamplePlugin,
    GaussianSamplePlugin,
    GradPlugin,
    HiddenStatePlugin,
):
    PLUGIN_REGISTRY.register(_cls.name, _cls)


def register_plugin(name: str, plugin_cls: type) -> type:
    """Make ``Agent.add_plugin(model_name, name, **kwargs)`` build ``plugin_cls(**kwargs)``.

    Raises:
        TypeError: ``plugin_cls`` is not an ``AgentPlugin`` subclass.
        KeyError: ``name`` is taken by another class.
    """
    if not (isinstance(plugin_cls, type) and issubclass(plugin_cls, AgentPlugin)):
        raise TypeError(f"register_plugin('{name}', ...) needs an AgentPlugin subclass, got {plugin_cls!r}")
    return PLUGIN_REGISTRY.register(name, plugin_cls)


def create_plugin(name: str, **kwargs: Any) -> AgentPlugin:
    """Build the registered plugin called ``name`` with its constructor ``kwargs``.

    Raises:
        ValueError: unknown name (the message lists valid names and the nearest match).
        TypeError: ``kwargs`` do not fit the plugin; the message shows what it takes.
    """
    if name not in PLUGIN_REGISTRY:
        names = PLUGIN_REGISTRY.names()
        close = difflib.get_close_matches(str(name), names, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ValueError(f"unknown agent plugin '{name}'; valid: {', '.join(names)}{hint}")
    cls = PLUGIN_REGISTRY.get(name)
    signature = inspect.signature(cls.__init__)
    try:
        signature.bind(None, **kwargs)
    except TypeError as e:
        takes = ", ".join(p for p in signature.parameters if p != "self") or "no arguments"
        raise TypeError(f"agent plugin '{name}' takes {takes}; got {sorted(kwargs)} ({e})") from None
    return cls(**kwargs)
