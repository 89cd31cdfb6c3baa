"""Policies: the base classes, the training contract, the registry and one file per algorithm."""

# registers the fused CPU equivalents of DDPG's, TD3's and SAC's update steps (see update_steps)
from . import fused_ac  # noqa: F401
from .a2c import A2CPolicy
from .atoc import ATOCPolicy
from .base_policy import (
    CollectMode,
    CommandMode,
    EvalMode,
    LearnMode,
    Policy,
    create_policy,
    register_policy,
    set_seed,
)
from .coma import COMAPolicy
from .common_policy import CommonPolicy, standard_transition
from .contract import (
    OFF_POLICY_CONFIG,
    ON_POLICY_CONFIG,
    POLICY_BASE_CONFIG,
    CollectSpec,
    LearnSpec,
    TrainingContract,
)
from .ddpg import DDPGPolicy
from .dqn import DQNPolicy
from .impala import IMPALAPolicy
from .mappo import MAPPOPolicy
from .ppo import PPOPolicy
from .qmix import QMIXPolicy
from .r2d2 import R2D2Policy
from .rainbow import RainbowPolicy
from .sac import SACPolicy
from .td3 import TD3Policy
from .vdn import VDNPolicy

__all__ = [
    "Policy",
    "CommonPolicy",
    "standard_transition",
    "register_policy",
    "create_policy",
    "set_seed",
    "LearnMode",
    "CollectMode",
    "EvalMode",
    "CommandMode",
    "TrainingContract",
    "CollectSpec",
    "LearnSpec",
    "POLICY_BASE_CONFIG",
    "OFF_POLICY_CONFIG",
    "ON_POLICY_CONFIG",
    "DQNPolicy",
    "PPOPolicy",
    "A2CPolicy",
    "DDPGPolicy",
    "TD3Policy",
    "SACPolicy",
    "RainbowPolicy",
    "R2D2Policy",
    "IMPALAPolicy",
    "QMIXPolicy",
    "VDNPolicy",
    "ATOCPolicy",
    "COMAPolicy",
    "MAPPOPolicy",
]
