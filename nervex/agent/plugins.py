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

    Needs ``Agent.forward(data, eps=...)``: one rate for every row, or one per row (Ape-X's per-actor rates, a
    sequence or tensor of shape ``(B,)``). Draws from torch's global RNG, so a seeded run repeats itself.

    Shapes:
        ``logit`` ``(B, A)`` -> ``action`` ``(B,)`` int64; ``eps`` a number or ``(B,)``.
    """

    name = "eps_greedy_sample"
    forward_kwargs = ("eps",)

    def __call__(self, forward: ForwardFn, data: Any, eps: Any = None, **kwargs: Any) -> Dict[str, Any]:
        if eps is None:
            raise TypeError("eps_greedy_sample needs the exploration rate: call forward(data, eps=0.1)")
        rate = torch.as_tensor(eps, dtype=torch.float32)
        if rate.dim() > 1 or not bool(((rate >= 0) & (rate <= 1)).all()):
            raise ValueError(f"eps_greedy_sample: eps must be in [0, 1] (a number or one per row), got {eps}")
        output = forward(data)
        logit, mask = _masked_logit(output, data, self.name, self.logit_key)
        action = logit.argmax(dim=-1)
        if rate.dim() == 1 and rate.shape != action.shape:
            raise ValueError(f"eps_greedy_sample: {rate.shape[0]} eps values for {tuple(action.shape)} actions")
        if bool((rate > 0).any()):
            num_actions = logit.shape[-1]
            explore = torch.rand(action.shape, device=action.device) < rate.to(action.device)
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
class DictObsPlugin(AgentPlugin):
    """Feeds the model ``data[obs_key]`` of a dict observation (``{'obs', 'action_mask', 'to_play', ...}``).

    Added first (next to the model), it lets the sampling plugins outside it read ``data['action_mask']`` while
    the model sees only its input. Data that is not a dict holding ``obs_key`` passes through unchanged.

    Shapes:
        ``data[obs_key]`` ``(B, *obs_shape)`` -> the model's output.
    """

    name = "dict_obs"

    def __init__(self, obs_key: str = "obs") -> None:
        if not isinstance(obs_key, str) or not obs_key:
            raise TypeError(f"dict_obs plugin: obs_key must be a non-empty string, got {obs_key!r}")
        self.obs_key = obs_key

    def __call__(self, forward: ForwardFn, data: Any, **kwargs: Any) -> Dict[str, Any]:
        if isinstance(data, dict) and self.obs_key in data:
            return forward(data[self.obs_key])
        return forward(data)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(obs_key={self.obs_key!r})"


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
def _tree_map(fn: Callable[..., Any], *trees: Any) -> Any:
    """``fn`` applied leaf by leaf to structures of the same shape (tensors inside dicts, lists and tuples).

    Raises:
        TypeError: the structures differ (other keys, lengths or container types).
    """
    first = trees[0]
    if isinstance(first, dict):
        if any(not isinstance(t, dict) or t.keys() != first.keys() for t in trees):
            raise TypeError(f"expected a dict with keys {sorted(first)}, got {[_describe(t) for t in trees]}")
        return {k: _tree_map(fn, *(t[k] for t in trees)) for k in first}
    if isinstance(first, (list, tuple)) and not hasattr(first, "_fields"):
        if any(not isinstance(t, (list, tuple)) or len(t) != len(first) for t in trees):
            raise TypeError(f"expected a sequence of {len(first)}, got {[_describe(t) for t in trees]}")
        return type(first)(_tree_map(fn, *leaves) for leaves in zip(*trees))
    if any(isinstance(t, (dict, list, tuple)) for t in trees[1:]):
        raise TypeError(f"expected a tensor, got {[_describe(t) for t in trees]}")
    return fn(*trees)


def _leaves(tree: Any) -> List[torch.Tensor]:
    out: List[torch.Tensor] = []
    _tree_map(out.append, tree)
    return out


def _describe(tree: Any) -> str:
    if isinstance(tree, dict):
        return f"dict with keys {sorted(tree)}"
    if isinstance(tree, (list, tuple)):
        return f"{type(tree).__name__} of {len(tree)}"
    return type(tree).__name__


def _check_state(state: Any, where: str) -> None:
    """Raise unless ``state`` is a tensor or a dict / list / tuple of tensors (what replay can store)."""
    leaves = _leaves(state)
    bad = [type(leaf).__name__ for leaf in leaves if not isinstance(leaf, torch.Tensor)] or ([] if leaves else ["none"])
    if bad:
        raise TypeError(
            f"hidden_state plugin: {where} must be a tensor or a dict/list/tuple of tensors (a concrete zero state, "
            f"e.g. init_fn=model.initial_state), got a leaf of type {bad[0]}"
        )


class HiddenStatePlugin(AgentPlugin):
    """Keeps one recurrent state per id (per env) between forward calls.

    States are kept batched: every leaf has shape ``(n, *S)`` where ``S`` is the leaf's shape in ``init_fn()`` and
    ``n`` the number of ids so far (``state_num`` at first; an id beyond it adds fresh states up to it, so a policy
    need not know how many envs its actor steps). ``forward(data, state_id=[...])`` puts the listed ids' states,
    stacked on a new leading batch axis in the order of ``state_id`` (every id in order when ``state_id`` is None),
    into ``data['prev_state']``; the model returns ``output['next_state']`` of the same structure, batch axis first,
    and row ``k`` becomes the new state of ``state_id[k]``. So the batch axis is the first axis everywhere outside the
    model: an LSTM's ``(h, c)`` is ``{'h': (B, num_layers, H), 'c': (B, num_layers, H)}`` and the model moves the
    layer axis where its RNN wants it (see :class:`~nervex.model.DRQN`). Stored tensors are detached: gradients do
    not flow from one call into the next.

    With ``save_prev_state`` the states that went in are also returned as ``output['prev_state']`` (batch first), so
    a policy's per-env split of its output gives each env's transition the state its actor had before acting, in
    the structure of ``init_fn()`` (storable in replay: arrays, never None).

    Args:
        init_fn: Makes one id's fresh state, without a batch axis (at construction, for new ids and on ``reset``):
            a tensor or a dict/list/tuple of tensors, e.g. ``model.initial_state`` (zeros).
        state_num: How many ids to make states for at construction (ids ``0 .. state_num - 1``).
        save_prev_state: Also return the states that went in as ``output['prev_state']``.

    Raises:
        ValueError: ``state_num`` is not a positive int.
        TypeError: ``init_fn`` is not callable or returns something other than tensors (None included).
    """

    name = "hidden_state"
    forward_kwargs = ("state_id",)

    def __init__(self, init_fn: Callable[[], Any], state_num: int = 1, save_prev_state: bool = False):
        if isinstance(state_num, bool) or not isinstance(state_num, int) or state_num < 1:
            raise ValueError(f"hidden_state plugin: state_num must be a positive int, got {state_num!r}")
        if not callable(init_fn):
            raise TypeError(
                f"hidden_state plugin: init_fn must be a callable taking no arguments that returns one id's zero "
                f"state (e.g. model.initial_state), got {init_fn!r}"
            )
        self.init_fn = init_fn
        self.save_prev_state = bool(save_prev_state)
        self._state = _tree_map(lambda leaf: leaf.detach().unsqueeze(0).repeat_interleave(state_num, 0), self._init())

    @property
    def state_num(self) -> int:
        """How many ids have a state (it grows with the largest id seen)."""
        return int(next(iter(_leaves(self._state))).shape[0])

    def _init(self) -> Any:
        state = self.init_fn()
        _check_state(state, "init_fn()")
        return state

    def _ids(self, state_id: Optional[Iterable[int]]) -> List[int]:
        """The ids as ints (every id when None), after adding fresh states for ids beyond the current count."""
        if state_id is None:
            return list(range(self.state_num))
        ids = [int(i) for i in state_id]
        bad = [i for i in ids if i < 0]
        if bad:
            raise IndexError(f"hidden_state plugin: state_id {bad} is negative; ids are 0, 1, 2...")
        if len(set(ids)) != len(ids):
            raise ValueError(f"hidden_state plugin: state_id {ids} lists an id twice; one row per id")
        missing = max(ids, default=-1) + 1 - self.state_num
        if missing > 0:
            fresh = self._init()
            self._state = _tree_map(
                lambda store, leaf: torch.cat([store, leaf.to(store.device, store.dtype).expand(missing, *leaf.shape)]),
                self._state,
                fresh,
            )
        return ids

    @property
    def states(self) -> List[Any]:
        """The current state of every id, one structure like ``init_fn()``'s per id (copies)."""
        return [_tree_map(lambda leaf, i=i: leaf[i].clone(), self._state) for i in range(self.state_num)]

    def _write(self, ids: List[int], value: Any) -> None:
        """Set the states of ``ids`` to the rows of the batched ``value``; the store follows ``value``'s device."""

        def put(store: torch.Tensor, new: Any) -> torch.Tensor:
            if not isinstance(new, torch.Tensor) or tuple(new.shape) != (len(ids), *store.shape[1:]):
                got = tuple(new.shape) if isinstance(new, torch.Tensor) else type(new).__name__
                raise ValueError(
                    f"hidden_state plugin: a next_state leaf is {got}, expected shape {(len(ids), *store.shape[1:])} "
                    "(batch axis first, one row per state id)"
                )
            if store.device != new.device or store.dtype != new.dtype:
                store = store.to(device=new.device, dtype=new.dtype)
            store[torch.as_tensor(ids, dtype=torch.long, device=store.device)] = new.detach()
            return store

        try:
            self._state = _tree_map(put, self._state, value)
        except TypeError as e:
            raise TypeError(
                f"hidden_state plugin: next_state must have the structure of init_fn()'s state: {e}"
            ) from None

    def __call__(self, forward: ForwardFn, data: Any, state_id: Optional[Iterable[int]] = None, **kwargs: Any):
        if not isinstance(data, dict):
            raise TypeError(f"hidden_state plugin needs dict data to add 'prev_state' to, got {type(data).__name__}")
        ids = self._ids(state_id)
        # advanced indexing copies, so the model and a stored transition never see later writes to the store
        prev_state = _tree_map(
            lambda leaf: leaf[torch.as_tensor(ids, dtype=torch.long, device=leaf.device)], self._state
        )
        output = forward({**data, "prev_state": prev_state})  # a new dict: the caller's data is left alone
        if not isinstance(output, dict) or "next_state" not in output:
            raise KeyError("hidden_state plugin needs the model output to hold 'next_state' (batch axis first)")
        self._write(ids, output["next_state"])
        if self.save_prev_state:
            output["prev_state"] = prev_state
        return output

    def reset(self, state_id: Optional[Iterable[int]] = None) -> None:
        ids = self._ids(state_id)
        fresh = _tree_map(
            lambda store, leaf: leaf.to(store.device, store.dtype).unsqueeze(0).expand(len(ids), *leaf.shape),
            self._state,
            self._init(),
        )
        self._write(ids, fresh)

    def __repr__(self) -> str:
        return f"HiddenStatePlugin(state_num={self.state_num})"


PLUGIN_REGISTRY = Registry("agent plugin")
for _cls in (
    ArgmaxSamplePlugin,
    EpsGreedySamplePlugin,
    MultinomialSamplePlugin,
    GaussianSamplePlugin,
    DictObsPlugin,
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
