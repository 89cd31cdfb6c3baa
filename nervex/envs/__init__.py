"""nervex environments: the env contract (one or many agents), ``GymEnv`` for any Gymnasium id, wrappers, registry."""

from .base_env import BaseEnv, BaseEnvInfo, BaseEnvTimestep, EnvResetRequest
from .check_env import EnvCheckError, check_env
from .factory import ENV_PIPELINE_KEYS, create_env, get_env_cls
from .gym_env import GymEnv, UnknownEnvIdError
from .lbforaging import LBForagingEnv
from .matrix_game import MATRIX_GAMES, MatrixGameEnv, encode_matrix
from .multi_agent import TEAM_REDUCTIONS, agent_array, reward_shape, sample_action, team_value
from .open_spiel_env import OpenSpielEnv, encode_open_spiel  # imports pyspiel only when a game is built
from .parallel_view import to_parallel_env
from .pettingzoo_env import PettingZooAECEnv
from .pettingzoo_parallel import PettingZooParallelEnv
from .two_step import TwoStepGameEnv
from .wrappers import ENV_WRAPPER_REGISTRY

__all__ = [
    "BaseEnv",
    "BaseEnvInfo",
    "BaseEnvTimestep",
    "EnvResetRequest",
    "GymEnv",
    "LBForagingEnv",
    "MatrixGameEnv",
    "MATRIX_GAMES",
    "encode_matrix",
    "OpenSpielEnv",
    "encode_open_spiel",
    "PettingZooAECEnv",
    "PettingZooParallelEnv",
    "to_parallel_env",
    "TwoStepGameEnv",
    "UnknownEnvIdError",
    "ENV_WRAPPER_REGISTRY",
    "ENV_PIPELINE_KEYS",
    "get_env_cls",
    "create_env",
    "check_env",
    "EnvCheckError",
    "agent_array",
    "team_value",
    "reward_shape",
    "sample_action",
    "TEAM_REDUCTIONS",
]
