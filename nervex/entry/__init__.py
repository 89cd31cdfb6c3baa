from .builder import (
    compile_config,
    compile_parallel_config,
    config_parts,
    make_actor,
    make_buffer,
    make_env_managers,
    make_evaluator,
    make_learner,
    make_policy,
)
from .callbacks import DefaultCallbacks
from .serial_entry import SerialTrainer, load_policy, serial_eval, serial_pipeline

__all__ = [
    "serial_pipeline",
    "serial_eval",
    "load_policy",
    "SerialTrainer",
    "DefaultCallbacks",
    "compile_config",
    "compile_parallel_config",
    "config_parts",
    "make_env_managers",
    "make_policy",
    "make_buffer",
    "make_learner",
    "make_actor",
    "make_evaluator",
]
