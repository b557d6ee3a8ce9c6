"""The checks every `model.path` goes through, without importing transformers (so `rlplace-plan` stays fast)."""

from __future__ import annotations

import json
from pathlib import Path

from rlplace.core.errors import ConfigError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
"""A folder holding one of these (next to tokenizer_config.json) carries a tokenizer transformers can load."""


def check_model_folder(path: str | Path | None, key: str = "model.path") -> Path:
    """Refuse, naming `key`, a path that is missing or is not a Hugging Face model folder with a tokenizer."""
    if path is None or str(path) == "":
        raise ConfigError(f"{key} = {path!r} is invalid: set it to a Hugging Face model folder")
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ConfigError(f"{key} = {str(path)!r} is invalid: no such folder")
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ConfigError(f"{key} = {str(path)!r} is invalid: not a Hugging Face model folder (no config.json)")
    try:
        json.loads(config_file.read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"{key} = {str(path)!r} is invalid: config.json is not JSON ({err})") from err
    if not (folder / "tokenizer_config.json").is_file() or not any((folder / f).is_file() for f in TOKENIZER_FILES):
        raise ConfigError(
            f"{key} = {str(path)!r} is invalid: tokenizer missing (needs tokenizer_config.json and one of "
            f"{', '.join(TOKENIZER_FILES)})"
        )
    return folder
