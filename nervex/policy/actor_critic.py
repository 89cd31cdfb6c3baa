"""What the actor-critic policies (PPO, A2C) share besides their loss: acting, normalization and GAE samples.

``ActorCriticPolicy`` is their base (Policy -> ActorCriticPolicy -> PPOPolicy: two levels, like DQN's): it owns the
collect and eval agents, the optional running observation and reward normalizers (as Stable-Baselines3's
``VecNormalize``), the transition they store and the GAE train samples. A subclass adds its learn mode.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import numpy as np
import torch

from nervex.agent import Agent
from nervex.agent.agent import set_train_mode
from nervex.config import Field
from nervex.rl_utils import Adder
from nervex.torch_utils import CategoricalDist, GaussianDist, ReturnNormalizer, RunningMeanStd

from .base_policy import Output, Policy
from .common_policy import standard_transition

Dist = Union[CategoricalDist, GaussianDist]
SAMPLE_FIELDS = ("obs", "action", "logp", "value", "adv", "return")
SCHEDULES = ("constant", "linear")

# Keys of the ``policy`` section the core reads; PPO and A2C put them in their ``config``.
ACTOR_CRITIC_CONFIG: Dict[str, Any] = dict(
    discount_factor=Field(0.99, gt=0, le=1),
    gae_lambda=Field(0.95, ge=0, le=1),  # 1: Monte-Carlo returns minus value; 0: one-step TD errors
    normalize=dict(
        obs=False,  # running mean/std of observations (updated while collecting, saved in checkpoints)
        reward=False,  # rewards divided by the running std of each env's discounted return
        clip_obs=Field(10.0, gt=0),
        clip_reward=Field(10.0, gt=0),
    ),
)


def dist_from_output(output: Mapping[str, torch.Tensor]) -> Dist:
    """The action distribution a model's output describes: ``logit`` -> categorical, ``mu``/``sigma`` -> Gaussian.

    Raises:
        KeyError: the output has neither (the message lists its keys).
    """
    if "logit" in output:
        return CategoricalDist(output["logit"], output.get("action_mask"))
    if "mu" in output and "sigma" in output:
        return GaussianDist(output["mu"], output["sigma"])
    raise KeyError(f"an actor-critic model must output 'logit' or 'mu' and 'sigma', got {sorted(output)}")


def explained_variance(value: torch.Tensor, returns: torch.Tensor) -> float:
    """``1 - Var[return - value] / Var[return]`` (1: the critic explains the returns; <= 0: no better than a constant).

    Shapes:
        - value, returns: :math:`(B,)`
    """
    if returns.device.type == "cpu":  # NumPy on 256 floats costs a fraction of four torch ops
        ret = returns.detach().numpy()
        var = float(ret.var())
        return float(1.0 - (ret - value.detach().numpy()).var() / var) if var > 0 else float("nan")
    var = returns.var(unbiased=False)
    if not var > 0:
        return float("nan")
    return float(1.0 - (returns - value).var(unbiased=False) / var)


class ActorCriticPolicy(Policy):
    """The base of PPO and A2C: everything but the learn step.

    The model is a ``ValueAC``-like module (``forward(x, mode)`` with modes ``compute_action_value``,
    ``compute_action`` and ``compute_value``) that outputs ``logit`` (categorical actions) or ``mu``/``sigma``
    (Gaussian actions, ``model.action_space: continuous``), and ``value``. This class acts (sampling with the
    behaviour log-probability, greedy for evaluation), bootstraps values for the actor, keeps the optional running
    normalizers (saved as the policy's extra state), stores transitions and turns trajectories into GAE samples.
    A subclass declares its ``config`` (over ``ACTOR_CRITIC_CONFIG``) and implements ``_init_learn`` /
    ``_forward_learn``; ``evaluate_actions`` gives it the values, log-probs and entropies of a batch.
    """

    on_policy = True
    default_model_type = "value_ac"

    _obs_rms: Optional[RunningMeanStd] = None
    _reward_norm: Optional[ReturnNormalizer] = None
    _constants_of: Optional[torch.Tensor] = None  # the batch field `_constants` were computed from
    _constants: Tuple[torch.Tensor, float]

    def _init_shared(self) -> None:
        cfg = self._cfg
        self._continuous = cfg.model.get("action_space") == "continuous"
        self._gamma = float(cfg.discount_factor)
        self._gae_lambda = float(cfg.gae_lambda)
        norm = cfg.normalize
        self._clip_obs = float(norm.clip_obs)
        if norm.obs:
            self._obs_rms = RunningMeanStd(obs_shape_of(cfg.model) or ())
        if norm.reward:
            self._reward_norm = ReturnNormalizer(self._gamma, clip=float(norm.clip_reward))
        self._adder = Adder(kind="gae", gamma=self._gamma, gae_lambda=self._gae_lambda, keep=SAMPLE_FIELDS)

    def _agent(self, plugin: Optional[str] = None, **kwargs: Any) -> Agent:
        agent = Agent(self._model)
        if plugin is not None:
            agent.add_plugin("main", plugin, **kwargs)
        agent.add_plugin("main", "grad", enable_grad=False)
        return agent

    # ---- acting ---------------------------------------------------------------------------------------------
    def normalize_obs(self, obs: torch.Tensor, update: bool) -> torch.Tensor:
        """Observations scaled by the running statistics (updated first when ``update``); unchanged when off."""
        if self._obs_rms is None:
            return obs
        if update:
            self._obs_rms.update(obs.detach().cpu().numpy())
        return self._obs_rms.normalize(obs, clip=self._clip_obs)

    def _init_collect(self) -> None:
        plugin = "gaussian_sample" if self._continuous else "multinomial_sample"
        self._collect_agent = self._agent(plugin)
        self._value_agent = self._agent()

    def _forward_collect(self, data_id: List[int], data: torch.Tensor) -> Output:
        """Sample actions: ``action``, ``logp`` (behaviour log-prob), ``value``, and the observation as the model saw
        it (``model_obs``, only when normalizing) and ``env_id`` (only with reward normalization)."""
        model_obs = self.normalize_obs(data, update=True)
        set_train_mode(self._model, False)
        out = self._collect_agent.forward(model_obs, mode="compute_action_value")
        output: Dict[str, Any] = {"action": out["action"], "logp": out["logp"], "value": out["value"]}
        if self._obs_rms is not None:
            output["model_obs"] = model_obs
        if self._reward_norm is not None:
            output["env_id"] = data_id
        return output

    def _forward_bootstrap(self, data_id: List[int], data: torch.Tensor) -> Output:
        """``{'value': V(obs)}`` for observations that are not acted on."""
        set_train_mode(self._model, False)
        value = self._value_agent.forward(self.normalize_obs(data, update=False), mode="compute_value")["value"]
        return {"value": value}

    def _process_transition(self, obs: Any, agent_output: Output, timestep: Any) -> Dict[str, Any]:
        """The standard transition plus ``logp`` and ``value``; ``obs`` as the model saw it (normalized)."""
        transition = standard_transition(agent_output.get("model_obs", obs), agent_output, timestep)
        del transition["next_obs"]  # the actor bootstraps from the real next observation; samples do not need it
        transition["logp"] = agent_output["logp"]
        transition["value"] = agent_output["value"]
        if self._reward_norm is not None:
            transition["raw_reward"] = timestep.reward
            env_id = int(agent_output["env_id"])
            transition["reward"] = self._reward_norm.scale(env_id, float(timestep.reward), timestep.done)
        return transition

    def _init_eval(self) -> None:
        self._eval_agent = (
            self._agent("gaussian_sample", deterministic=True) if self._continuous else self._agent("argmax_sample")
        )

    def _forward_eval(self, data_id: List[int], data: torch.Tensor) -> Output:
        set_train_mode(self._model, False)
        out = self._eval_agent.forward(self.normalize_obs(data, update=False), mode="compute_action")
        return {"action": out["action"]}

    # ---- learning helpers -----------------------------------------------------------------------------------
    def evaluate_actions(
        self, agent: Agent, data: Mapping[str, torch.Tensor]
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, Dist]:
        """``(value, log_prob(action), entropy, distribution)`` of a batch's stored actions under the current
        parameters."""
        output = agent.forward(data["obs"], mode="compute_action_value")
        dist = dist_from_output(output)
        action = data["action"] if self._continuous else data["action"].long()
        return output["value"], dist.log_prob(action), dist.entropy(), dist

    def learn_terms(
        self, agent: Agent, optimizer: torch.optim.Optimizer, data: Mapping[str, torch.Tensor], learning_rate: Any
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, Dist, torch.Tensor]:
        """What PPO's and A2C's losses start from: the scheduled learning rate applied, then
        ``(value, logp, entropy, distribution, advantages)`` of a batch; the entropy carries no gradient when its
        weight is 0, and the advantages are normalized when ``learn.adv_norm`` says so."""
        learn = self._cfg.learn
        if learning_rate is not None:
            for group in optimizer.param_groups:
                group["lr"] = learning_rate
        set_train_mode(self._model, True)
        value, logp, entropy, dist = self.evaluate_actions(agent, data)
        if learn.entropy_weight == 0:
            entropy = entropy.detach()  # still logged, but no gradient to carry back
        return value, logp, entropy, dist, self._batch_constants(data)[0]

    def _batch_constants(self, data: Mapping[str, torch.Tensor]) -> Tuple[torch.Tensor, float]:
        """``(advantages, normalized per learn.adv_norm; explained variance of the stored values)`` of a batch.

        Both depend only on the rollout's stored fields, so they are computed once per batch object: when the
        minibatch is the whole rollout, the trainer passes the same batch every epoch (20 or more times).
        """
        adv = data["adv"]
        if self._constants_of is not adv:
            if self._cfg.learn.adv_norm and adv.numel() > 1:
                norm_adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            else:
                norm_adv = adv
            self._constants = (norm_adv, explained_variance(data["value"], data["return"]))
            self._constants_of = adv
        return self._constants

    def weighted_loss(
        self, policy_loss: torch.Tensor, value_loss: torch.Tensor, entropy_loss: torch.Tensor
    ) -> torch.Tensor:
        """``policy_loss + value_weight * value_loss + entropy_weight * entropy_loss`` (a zero-weight term is left
        out rather than multiplied by 0)."""
        learn = self._cfg.learn
        total = policy_loss + learn.value_weight * value_loss
        return total + learn.entropy_weight * entropy_loss if learn.entropy_weight else total

    def _get_setting_learn(self, command_info: Dict[str, Any]) -> Dict[str, Any]:
        learn = self._cfg.learn
        return {"learning_rate": schedule_value(learn.learning_rate, learn.lr_schedule, command_info)}

    # ---- state ----------------------------------------------------------------------------------------------
    def _state_dict_extra(self) -> Dict[str, Any]:
        state: Dict[str, Any] = {}
        if self._obs_rms is not None:
            state["obs_rms"] = self._obs_rms.state_dict()
        if self._reward_norm is not None:
            state["reward_norm"] = self._reward_norm.state_dict()
        return state

    def _load_state_dict_extra(self, state: Mapping[str, Any]) -> None:
        if self._obs_rms is not None and "obs_rms" in state:
            self._obs_rms.load_state_dict(state["obs_rms"])
        if self._reward_norm is not None and "reward_norm" in state:
            self._reward_norm.load_state_dict(state["reward_norm"])


def schedule_value(start: float, kind: str, command_info: Mapping[str, Any]) -> float:
    """``start`` (``constant``) or ``start`` times the fraction of ``max_env_step`` still to go (``linear``, as
    Stable-Baselines3's ``lin_X`` schedules of learning rate and clip range)."""
    if kind == "constant":
        return start
    progress_remaining = 1.0 - command_info["env_step"] / max(1, command_info["max_env_step"])
    return start * min(1.0, max(0.0, progress_remaining))


def obs_shape_of(model_cfg: Mapping[str, Any]) -> Optional[Tuple[int, ...]]:
    """The observation shape a model config names (``obs_dim`` or ``obs_shape``), for the running normalizer."""
    value = model_cfg.get("obs_shape", model_cfg.get("obs_dim"))
    if value is None:
        return None
    return (int(value),) if isinstance(value, (int, np.integer)) else tuple(int(v) for v in value)
