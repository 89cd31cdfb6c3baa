"""Rainbow (Hessel et al. 2018): C51 with n-step targets, double Q, a dueling head, NoisyNet exploration and PER."""

from __future__ import annotations

import inspect
import os
from typing import Any, Dict, List, Mapping, Optional

import torch
from easydict import EasyDict

from nervex.config import ConfigError, Field
from nervex.model import DistributionalHead, NoisyLinear
from nervex.rl_utils import Adder, dist_nstep_td_data, dist_nstep_td_error, epsilon_greedy
from nervex.torch_utils import Adam

from .base_policy import Output, register_policy
from .common_policy import CommonPolicy, acting_agent, eps_schedule_config, q_learn_agent
from .off_policy_ac import nstep_terms

_NOT_DISTRIBUTIONAL = (
    "rainbow learns return distributions (C51) and needs a distributional model: set "
    "policy.model.distributional: true (rainbow's default; drop the key), or use policy_type: dqn for a plain Q-network"
)


def distributional_head(model: torch.nn.Module) -> DistributionalHead:
    """The model's one ``DistributionalHead``: its support (``v_min``, ``v_max``, ``n_atom``) is the loss's.

    Raises:
        ValueError: the model has no distributional head, or several.
    """
    heads = [m for m in model.modules() if isinstance(m, DistributionalHead)]
    if len(heads) != 1:
        found = "none" if not heads else f"{len(heads)}"
        raise ValueError(f"{_NOT_DISTRIBUTIONAL} ({type(model).__name__} has {found} DistributionalHead)")
    return heads[0]


def has_noisy_layers(model: torch.nn.Module) -> bool:
    """Whether the model explores by itself: any :class:`~nervex.model.NoisyLinear` layer."""
    return any(isinstance(m, NoisyLinear) for m in model.modules())


class RainbowPolicy(CommonPolicy):
    """Rainbow: distributional (C51) n-step double Q-learning with a dueling, noisy head and prioritized replay.

    Config keys (besides the off-policy contract keys ``learn.batch_size``, ``learn.update_per_collect``,
    ``learn.learning_starts``, ``collect.n_sample``):
        model.distributional, model.dueling, model.noisy, model.n_atom, model.v_min, model.v_max: the network
            (``fc_discrete_net`` / ``conv_discrete_net``); rainbow's defaults turn the first three on. The support
            of the C51 loss is the model's (declared once, in ``policy.model``); ``distributional: false`` is refused
            (that is DQN: ``policy_type: dqn``).
        discount_factor, nstep: the target distribution is that of ``sum_k gamma^k r_k + gamma^n Z(s_n, a*)``
            projected onto the support; a terminal window does not bootstrap, a time-limit truncation does (with
            ``gamma^k`` for a window cut after ``k`` steps).
        priority: prioritized replay with the per-sample cross-entropy as the new priority and the loss weighted by
            importance weights; false trains from the uniform ``ReplayBuffer``.
        learn.double: ``a*`` is the online net's greedy action at ``s_n`` (valued by the target net's
            distribution); false: the target net's own greedy action.
        learn.target_update_freq, learn.target_theta: hard copy every N gradient steps, or Polyak averaging.
        learn.learning_rate, learn.adam_eps, learn.weight_decay, learn.grad_clip: the Adam optimizer.
        command.eps: epsilon-greedy schedule over env steps; ``enabled`` null turns it on only for a model without
            noisy layers (NoisyNet explores through its parameter noise instead).

    Noise: the noisy layers draw new noise on every forward in training mode and none in eval mode. The learn step
    runs online and target nets in training mode (one online draw for ``s`` and ``s_n`` together, an independent
    draw for the target net, as in the paper); collect acts in training mode without gradients (a new draw per env
    step); eval acts greedily in eval mode, without noise.
    """

    default_model_type = "fc_discrete_net"
    # laid under the user's policy.model keys (for a model class whose constructor takes them)
    model_defaults: Dict[str, Any] = dict(distributional=True, dueling=True, noisy=True)
    config: Dict[str, Any] = dict(
        discount_factor=Field(0.99, gt=0, le=1),
        nstep=Field(3, ge=1),
        priority=True,
        learn=dict(
            learning_rate=Field(1e-3, gt=0),
            adam_eps=Field(1e-8, gt=0),  # Rainbow's Atari setting is 1.5e-4 with a learning rate of 6.25e-5
            weight_decay=Field(0.0, ge=0),
            target_update_freq=Field(100, ge=1),
            target_theta=Field(0.0, ge=0, le=1),
            double=True,
            grad_clip=Field(0.0, ge=0),  # max gradient norm; 0 turns clipping off
        ),
        # eps.enabled null: epsilon-greedy only when the model has no noisy layers
        command=dict(eps=eps_schedule_config(enabled=Field(None, kind="bool"))),
    )

    @classmethod
    def _buffer_type(cls, cfg: Mapping[str, Any]) -> Optional[str]:
        return "prioritized" if cfg["priority"] else "uniform"

    @classmethod
    def compile_section(cls, cfg: Mapping[str, Any], source: Optional[str] = None) -> EasyDict:
        section = super().compile_section(cfg, source)
        distributional = (section.get("model") or {}).get("distributional", True)
        if distributional is not True:
            where = f" in {os.path.basename(source)}" if source else ""
            raise ConfigError(f"key 'policy.model.distributional'{where} is {distributional!r}: {_NOT_DISTRIBUTIONAL}")
        return section

    def _create_model_from_cfg(self, cfg: Mapping[str, Any], model_type: Optional[type] = None) -> torch.nn.Module:
        model_cls = model_type or self.model_class(cfg)
        if model_cls is None:
            return super()._create_model_from_cfg(cfg, model_type)
        params = inspect.signature(model_cls.__init__).parameters
        defaults = {k: v for k, v in self.model_defaults.items() if k in params}
        return model_cls(**{**defaults, **cfg.get("model", {})})

    def _init_shared(self) -> None:
        self._head = distributional_head(self._model)
        self._noisy = has_noisy_layers(self._model)

    # ---- learn -----------------------------------------------------------------------------------------------
    def _init_learn(self) -> None:
        learn = self._cfg.learn
        self._gamma = float(self._cfg.discount_factor)
        self._nstep = int(self._cfg.nstep)
        self._priority = bool(self._cfg.priority)
        self._double = bool(learn.double)
        clip = dict(grad_clip_type="clip_norm", clip_value=float(learn.grad_clip)) if learn.grad_clip > 0 else {}
        self._optimizer = Adam(
            self._model.parameters(),
            lr=learn.learning_rate,
            eps=learn.adam_eps,
            weight_decay=learn.weight_decay,
            **clip,
        )
        self._learn_agent = q_learn_agent(self._model, learn)

    def _forward_learn(self, data: Dict[str, Any]) -> Dict[str, Any]:
        agent = self._learn_agent
        # the model is shared with collect and eval, which may have left it in eval mode (no noise)
        agent.mode(train=True)
        batch_size = data["obs"].shape[0]
        if self._double:
            # one online pass (one noise draw) over obs and next_obs; the next_obs half only picks the next action
            output = agent.forward(torch.cat([data["obs"], data["next_obs"]]))
            dist = output["distribution"][:batch_size]
            next_action = output["logit"][batch_size:].detach().argmax(dim=-1)
        else:
            output = agent.forward(data["obs"])
            dist = output["distribution"]
        target = agent.target_forward(data["next_obs"])  # its own, independent noise draw
        if not self._double:
            next_action = target["logit"].argmax(dim=-1)
        reward, terminated, value_gamma = nstep_terms(data)
        weight = data.get("weight") if self._priority else None
        td_data = dist_nstep_td_data(
            dist, target["distribution"], data["action"].long(), next_action, reward, terminated, weight
        )
        head = self._head
        loss, cross_entropy = dist_nstep_td_error(
            td_data, self._gamma, head.v_min, head.v_max, head.n_atom, nstep=self._nstep, value_gamma=value_gamma
        )
        self._optimizer.zero_grad()
        loss.backward()
        self._optimizer.step()
        agent.target_update()
        q = output["logit"][:batch_size].detach()
        info = {"cur_lr": self._optimizer.param_groups[0]["lr"], "total_loss": loss.item(), "q_value": q.mean().item()}
        if self._priority:
            info["priority"] = cross_entropy.cpu().numpy()
        return info

    # ---- collect ---------------------------------------------------------------------------------------------
    def _init_collect(self) -> None:
        self._gamma = float(self._cfg.discount_factor)
        self._nstep = int(self._cfg.nstep)
        self._adder = Adder(self._use_cuda, kind="nstep", nstep=self._nstep, gamma=self._gamma)
        self._collect_agent = acting_agent(self._model, "eps_greedy_sample")

    def _forward_collect(self, data_id: List[int], data: Any, eps: float = 0.0) -> Output:
        # NoisyNet explores through its noise: a noisy model acts in training mode (a new draw per forward)
        self._collect_agent.mode(train=self._noisy)
        return self._collect_agent.forward(data, eps=eps)

    # ---- eval ------------------------------------------------------------------------------------------------
    def _init_eval(self) -> None:
        self._eval_agent = acting_agent(self._model, "argmax_sample")

    def _forward_eval(self, data_id: List[int], data: Any) -> Output:
        self._eval_agent.mode(train=False)  # greedy on the noiseless (mean) network
        return self._eval_agent.forward(data)

    # ---- command ---------------------------------------------------------------------------------------------
    def _init_command(self) -> None:
        eps = self._cfg.command.eps
        enabled = (not self._noisy) if eps.enabled is None else bool(eps.enabled)
        self._eps_fn = epsilon_greedy(eps.start, eps.end, eps.decay, eps.type) if enabled else None

    def _get_setting_collect(self, command_info: Dict[str, Any]) -> Dict[str, Any]:
        return {} if self._eps_fn is None else {"eps": self._eps_fn(command_info["env_step"])}


register_policy("rainbow", RainbowPolicy)
