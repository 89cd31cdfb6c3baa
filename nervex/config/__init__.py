from .compile import compile_config
from .config import (
    ConfigError,
    apply_overrides,
    deep_merge,
    parse_overrides,
    read_config,
    save_config,
    set_by_path,
    to_plain,
    validate_merge,
)

__all__ = [
    "ConfigError",
    "read_config",
    "compile_config",
    "deep_merge",
    "validate_merge",
    "apply_overrides",
    "parse_overrides",
    "save_config",
    "set_by_path",
    "to_plain",
]
