"""Configs: reading YAML, declared defaults (``Field``), merging and validating (no torch import here)."""

from .compile import TOP_LEVEL_DEFAULTS, ConfigParts, compile_config, compile_section, declared_defaults, is_compiled
from .config import (
    RENAMED_KEYS,
    ConfigError,
    apply_overrides,
    deep_merge,
    parse_overrides,
    read_config,
    save_config,
    set_by_path,
    suggest_choice,
    to_plain,
    validate_merge,
)
from .field import Field, merge_defaults, plain_defaults, signature_config

__all__ = [
    "ConfigError",
    "suggest_choice",
    "ConfigParts",
    "Field",
    "RENAMED_KEYS",
    "TOP_LEVEL_DEFAULTS",
    "read_config",
    "compile_config",
    "compile_section",
    "declared_defaults",
    "is_compiled",
    "deep_merge",
    "merge_defaults",
    "plain_defaults",
    "signature_config",
    "validate_merge",
    "apply_overrides",
    "parse_overrides",
    "save_config",
    "set_by_path",
    "to_plain",
]
