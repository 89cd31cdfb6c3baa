"""RL building blocks: TD targets and losses, GAE, exploration schedules and the Adder.

Every loss here is a pure tensor function documented with a ``Shapes:`` block; the Adder works on NumPy.
"""

from .a2c import a2c_data, a2c_error, a2c_loss
from .actor_critic_td import (
    bootstrap_target,
    critic_loss,
    critic_min,
    ddpg_critic_target,
    deterministic_actor_loss,
    sac_actor_loss,
    sac_alpha_loss,
    sac_critic_target,
    target_policy_smoothing,
    td3_critic_target,
)
from .adder import Adder
from .coma import ComaAdvantage, coma_advantage, coma_lambda_return, coma_policy_probs
from .dist_td import categorical_projection, dist_nstep_td_data, dist_nstep_td_error
from .exploration import epsilon_greedy
from .gae import gae, gae_data
from .ppo import ppo_data, ppo_error, ppo_info, ppo_loss
from .sequence_td import q_nstep_sequence_td_data, q_nstep_sequence_td_error
from .td import (
    generalized_lambda_returns,
    masked_argmax,
    nstep_return,
    q_1step_td_data,
    q_1step_td_error,
    q_nstep_td_data,
    q_nstep_td_error,
    q_nstep_td_error_with_rescale,
    td_lambda_data,
    td_lambda_error,
    v_1step_td_data,
    v_1step_td_error,
    v_nstep_td_data,
    v_nstep_td_error,
    value_inv_transform,
    value_transform,
)
from .trajectory_adder import TrajectoryAdder
from .upgo import upgo_loss, upgo_returns
from .vtrace import vtrace_advantages, vtrace_data, vtrace_error, vtrace_loss, vtrace_nstep_return

__all__ = [
    "Adder",
    "TrajectoryAdder",
    "categorical_projection",
    "ComaAdvantage",
    "coma_advantage",
    "coma_lambda_return",
    "coma_policy_probs",
    "dist_nstep_td_data",
    "dist_nstep_td_error",
    "epsilon_greedy",
    "gae",
    "gae_data",
    "generalized_lambda_returns",
    "masked_argmax",
    "nstep_return",
    "q_1step_td_data",
    "q_1step_td_error",
    "q_nstep_td_data",
    "q_nstep_td_error",
    "q_nstep_td_error_with_rescale",
    "q_nstep_sequence_td_data",
    "q_nstep_sequence_td_error",
    "td_lambda_data",
    "td_lambda_error",
    "v_1step_td_data",
    "v_1step_td_error",
    "v_nstep_td_data",
    "v_nstep_td_error",
    "value_inv_transform",
    "value_transform",
    "a2c_data",
    "a2c_error",
    "a2c_loss",
    "ppo_data",
    "ppo_error",
    "ppo_info",
    "ppo_loss",
    "bootstrap_target",
    "critic_loss",
    "critic_min",
    "ddpg_critic_target",
    "deterministic_actor_loss",
    "sac_actor_loss",
    "sac_alpha_loss",
    "sac_critic_target",
    "target_policy_smoothing",
    "td3_critic_target",
    "upgo_loss",
    "upgo_returns",
    "vtrace_advantages",
    "vtrace_data",
    "vtrace_error",
    "vtrace_loss",
    "vtrace_nstep_return",
]
