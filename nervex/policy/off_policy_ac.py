"""What DDPG, TD3 and SAC share, as functions (STYLE: no inheritance between algorithms): their common config
keys, the QAC model with the algorithm's defaults, n-step samples, batch terms, optimizers and agents, and the update
steps all three take: the no-grad evaluations behind a target and the critics' regression.

Each function takes what it works on as arguments; none reads a policy's private fields. The steps are written with
autograd and marked ``update_step`` (``nervex/policy/update_steps.py`` chooses whether a registered equivalent, the
fused CPU kernels, runs instead).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from nervex.agent import Agent
from nervex.config import Field
from nervex.rl_utils import Adder, critic_loss
from nervex.torch_utils import Adam

from .update_steps import update_step

# Keys DDPG, TD3 and SAC share, with Stable-Baselines3's defaults (off-policy contract keys included: one gradient
# step per env step, uniform random actions for the first 100 steps).
AC_CONFIG: Dict[str, Any] = dict(
    discount_factor=Field(0.99, gt=0, le=1),
    nstep=Field(1, ge=1),
    priority=False,  # prioritized replay: per-sample |TD| (mean over critics) as priorities, importance weights
    learn=dict(
        batch_size=256,
        update_per_collect=8,  # with collect.n_sample 8: one gradient step per env step (SB3's train_freq 1)
        learning_starts=100,
        random_warmup=True,
        learning_rate=Field(1e-3, gt=0),  # actor and critics (and SAC's temperature)
        target_theta=Field(0.005, gt=0, le=1),  # Polyak rate tau of the target copies
        grad_clip=Field(0.0, ge=0),  # max gradient norm of each optimizer; 0 turns clipping off
        # let the update steps' registered equivalents run (nervex.policy.fused_ac: the stock QAC's losses
        # differentiated by hand, same gradients, 1.3-2x faster per update on a CPU); false: always autograd
        fused_update=True,
    ),
    collect=dict(n_sample=8),
)

# The exploration noise of the deterministic actors (DDPG, TD3), in the [-1, 1] action space (SB3's action noise).
NOISE_CONFIG: Dict[str, Any] = dict(
    type=Field("gaussian", choices=("gaussian", "ou")),
    sigma=Field(0.1, ge=0),
    theta=Field(0.15, ge=0),  # ou only
    dt=Field(1e-2, gt=0),  # ou only
)


def build_qac(model_cls: Optional[type], model_cfg: Mapping[str, Any], defaults: Mapping[str, Any], policy: str):
    """The model with the algorithm's defaults under the user's ``policy.model`` keys, checked for what it needs.

    Args:
        model_cls: The model class (``QAC`` unless ``policy.model_type`` names another).
        model_cfg: ``policy.model``.
        defaults: The algorithm's model defaults (``actor_type``, ``critic_num``).
        policy: The policy's name, for messages.

    Raises:
        ValueError: the model lacks a QAC's interface, or the config sets a default to a value the algorithm
            cannot use (e.g. ``actor_type: deterministic`` for SAC).
    """
    if model_cls is None:
        raise ValueError(f"{policy}: set policy.model_type (the default is 'qac')")
    cfg = dict(model_cfg)
    actor_type = defaults["actor_type"]
    if cfg.get("actor_type", actor_type) != actor_type:
        raise ValueError(f"{policy} needs policy.model.actor_type '{actor_type}', got '{cfg['actor_type']}'")
    model = model_cls(**{**defaults, **cfg})
    missing = [a for a in ("actor_type", "critic_num", "action_low", "action_high") if not hasattr(model, a)]
    if missing:
        raise ValueError(f"{policy} needs a QAC-like model (with {missing}); got {type(model).__name__}")
    return model


def check_critic_num(model: Any, policy: str, least: int, most: Optional[int] = None) -> None:
    """Raise ``ValueError`` naming ``policy.model.critic_num`` unless the model has ``least .. most`` critics."""
    if model.critic_num < least or (most is not None and model.critic_num > most):
        wanted = f"{least}" if most == least else f">= {least}" if most is None else f"in {least}..{most}"
        raise ValueError(f"{policy} needs policy.model.critic_num {wanted}, got {model.critic_num}")


def make_adam(params: Any, lr: float, grad_clip: float) -> Adam:
    """nervex's Adam, clipping the global gradient norm at ``grad_clip`` when it is > 0."""
    clip = dict(grad_clip_type="clip_norm", clip_value=float(grad_clip)) if grad_clip > 0 else {}
    return Adam(params, lr=float(lr), **clip)


def host_figures(**tensors: torch.Tensor) -> Dict[str, float]:
    """The logged scalars as Python floats: on an accelerator copied to the host together (one sync instead of one
    ``.item()`` each); on the CPU read one by one (an ``.item()`` is cheaper there than stacking them)."""
    if all(t.device.type == "cpu" for t in tensors.values()):
        return {name: t.item() for name, t in tensors.items()}
    values = torch.stack([t.detach().reshape(()).float() for t in tensors.values()]).tolist()
    return dict(zip(tensors, values))


def polyak_agent(model: torch.nn.Module, theta: float) -> Agent:
    """A learner Agent over ``model`` with a Polyak-averaged copy ``'target'`` (actor and critics together)."""
    agent = Agent(model)
    agent.add_model("target", update_type="momentum", update_kwargs={"theta": float(theta)})
    agent.add_plugin("main", "grad", enable_grad=True)
    agent.mode(train=True)
    return agent


def inference_agent(model: torch.nn.Module, plugin: Optional[str] = None, **plugin_kwargs: Any) -> Agent:
    """An Agent over ``model`` for acting: the given plugin (noise, sampling), no gradients."""
    agent = Agent(model)
    if plugin is not None:
        agent.add_plugin("main", plugin, **plugin_kwargs)
    agent.add_plugin("main", "grad", enable_grad=False)
    agent.mode(train=False)
    return agent


def noise_plugin(noise: Mapping[str, Any], low: torch.Tensor, high: torch.Tensor) -> Tuple[str, Dict[str, Any]]:
    """The exploration plugin ``collect.noise`` names, and its arguments."""
    if noise["type"] == "ou":
        return "ou_noise", dict(sigma=noise["sigma"], theta=noise["theta"], dt=noise["dt"], low=low, high=high)
    return "gaussian_noise", dict(sigma=noise["sigma"], low=low, high=high)


def nstep_terms(data: Mapping[str, Any]) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """``(reward, terminated, value_gamma)`` of a batch: rewards time first.

    Shapes:
        - data['reward']: :math:`(B, nstep)` or :math:`(B,)`
        - reward: :math:`(nstep, B)`; terminated, value_gamma: :math:`(B,)` (value_gamma may be ``None``)
    """
    reward = data["reward"].float()
    reward = reward.t() if reward.dim() == 2 else reward.unsqueeze(0)
    return reward, data["terminated"].float(), data.get("value_gamma")


class DeterministicActing:
    """The collect and eval side of a deterministic actor (DDPG, TD3): exploration noise from ``collect.noise`` when
    collecting (per env for OU noise, reset at each env's episode end), the plain actor when evaluating, n-step
    samples from the trajectories. A policy holds one and forwards its collect and eval modes to it.

    Args:
        model: The QAC (its action bounds clip the noisy actions).
        cfg: The compiled ``policy`` section (``discount_factor``, ``nstep``, ``collect.noise``).
        use_cuda: Whether samples are moved to the GPU (the Adder's setting).
    """

    def __init__(self, model: torch.nn.Module, cfg: Mapping[str, Any], use_cuda: bool) -> None:
        self.model = model
        self.gamma = float(cfg["discount_factor"])
        self.nstep = int(cfg["nstep"])
        self.adder = Adder(use_cuda, kind="nstep", nstep=self.nstep, gamma=self.gamma)
        noise = cfg["collect"]["noise"]
        self.noise_per_env = noise["type"] == "ou"
        plugin, kwargs = noise_plugin(noise, model.action_low, model.action_high)
        self.collect_agent = inference_agent(model, plugin, **kwargs)
        self.eval_agent = inference_agent(model)

    def collect(self, data_id: List[int], data: Any) -> Dict[str, Any]:
        """Noisy actions clipped to the bounds, ``{'action': (B, action_dim)}``."""
        self.collect_agent.mode(train=False)
        kwargs = {"state_id": data_id} if self.noise_per_env else {}
        return {"action": self.collect_agent.forward(data, mode="compute_actor", **kwargs)["action"]}

    def evaluate(self, data: Any) -> Dict[str, Any]:
        """The actor's actions, without noise."""
        self.eval_agent.mode(train=False)
        return {"action": self.eval_agent.forward(data, mode="compute_actor")["action"]}

    def reset(self, data_id: Optional[List[int]] = None) -> None:
        """Restart the noise processes of ``data_id`` (all envs when None)."""
        self.collect_agent.reset(data_id)


# ---- the update steps DDPG, TD3 and SAC share ---------------------------------------------------------------------
@dataclass
class ActorCriticLearn:
    """What the update steps of an actor-critic work on (the policy builds it in ``_init_learn`` and owns it).

    Attributes:
        model: The QAC.
        agent: The learner's agent over ``model``, with the Polyak copy ``'target'``.
        actor_optimizer, critic_optimizer: Adam over the actor's and the critics' parameters.
        actor_params, critic_params: The tensors each optimizer trains.
        use_equivalents: ``policy.learn.fused_update``: registered equivalents may run (``update_steps``).
        priority: ``policy.priority``: the critic step's TD errors are read (an equivalent may skip them otherwise).
    """

    model: torch.nn.Module
    agent: Agent
    actor_optimizer: torch.optim.Optimizer
    critic_optimizer: torch.optim.Optimizer
    actor_params: List[torch.Tensor]
    critic_params: List[torch.Tensor]
    use_equivalents: bool
    priority: bool


def actor_critic_learn(model: torch.nn.Module, cfg: Mapping[str, Any]) -> ActorCriticLearn:
    """The parts of a QAC's update from the ``policy`` section: Adam for the actor and the critics
    (``learn.learning_rate``, ``learn.grad_clip``), a learner agent with a Polyak target (``learn.target_theta``), the
    ``learn.fused_update`` switch and ``priority``."""
    learn = cfg["learn"]
    actor_params, critic_params = list(model.actor.parameters()), list(model.critic.parameters())
    return ActorCriticLearn(
        model=model,
        agent=polyak_agent(model, learn["target_theta"]),
        actor_optimizer=make_adam(actor_params, learn["learning_rate"], learn["grad_clip"]),
        critic_optimizer=make_adam(critic_params, learn["learning_rate"], learn["grad_clip"]),
        actor_params=actor_params,
        critic_params=critic_params,
        use_equivalents=bool(learn["fused_update"]),
        priority=bool(cfg["priority"]),
    )


def minimize(optimizer: torch.optim.Optimizer, loss: torch.Tensor, inputs: Optional[Sequence[torch.Tensor]] = None):
    """One optimizer step on ``loss``: ``zero_grad(); loss.backward(inputs=inputs); step()`` (``inputs``: the
    tensors that get a gradient, e.g. the actor's parameters for a loss that runs through the critics)."""
    optimizer.zero_grad()
    loss.backward(inputs=inputs)
    optimizer.step()


@update_step
def actor_output(ac: ActorCriticLearn, name: str, obs: torch.Tensor) -> Dict[str, torch.Tensor]:
    """The actor's output at ``obs`` from the agent's model ``name`` (``'main'`` or ``'target'``), without gradient:
    ``{'action'}`` or ``{'mu', 'sigma', 'log_sigma'}`` (see ``QAC.compute_actor``)."""
    with torch.no_grad():
        return ac.agent.model_forward(name, obs, mode="compute_actor")


@update_step
def critic_values(ac: ActorCriticLearn, name: str, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """Every critic's ``Q(obs, action)`` from the agent's model ``name``, without gradient.

    Shapes:
        - obs: :math:`(B, *obs_shape)`; action: :math:`(B, A)`; output: :math:`(N, B)`
    """
    with torch.no_grad():
        return ac.agent.model_forward(name, {"obs": obs, "action": action}, mode="compute_critic")["q"]


@update_step
def critic_step(
    ac: ActorCriticLearn,
    obs: torch.Tensor,
    action: torch.Tensor,
    target: torch.Tensor,
    weight: Optional[torch.Tensor],
) -> Tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
    """Critic loss: every ``Q_i(s, a)`` of the stored actions regressed on the target,
    ``sum_i 0.5 * mean_b w_b (Q_i(s_b, a_b) - y_b)^2``, one step of the critics' optimizer.

    Returns:
        ``(loss, td_error, q)``, detached: ``td_error = mean_i |y - Q_i|`` per sample (replay priorities; an
        equivalent may return None for it unless ``ac.priority``).

    Shapes:
        - obs: :math:`(B, *obs_shape)`; action: :math:`(B, A)`; target, weight, td_error: :math:`(B,)`
        - q: :math:`(N, B)`
    """
    q = ac.agent.forward({"obs": obs, "action": action}, mode="compute_critic")["q"]
    loss, td_error = critic_loss(q, target, weight)
    minimize(ac.critic_optimizer, loss)
    return loss.detach(), td_error, q.detach()
