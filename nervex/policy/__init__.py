from .base_policy import CommonPolicy, Policy, create_policy, register_policy, set_seed
from .dqn import DQNPolicy

__all__ = ["Policy", "CommonPolicy", "register_policy", "create_policy", "set_seed", "DQNPolicy"]
