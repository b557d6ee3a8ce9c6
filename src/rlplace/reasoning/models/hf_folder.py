"""The checks every `model.path` goes through, without importing transformers (so `rlplace-plan` stays fast)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from rlplace.core.errors import ConfigError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
"""A folder holding one of these (next to tokenizer_config.json) carries a tokenizer transformers can load."""
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack")
"""Files of these kinds (and their `*.index.json` shard maps) hold a folder's weights."""


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


def check_reward_model_folder(path: str | Path, key: str = "reward.model_path") -> Path:
    """Refuse, naming `key`, a folder `check_model_folder` refuses, or whose model is not a sequence classifier with
    one output (a causal LM has no score head: loaded as a classifier, transformers would add an untrained one)."""
    folder = check_model_folder(path, key)
    config = json.loads((folder / "config.json").read_text())
    architectures = config.get("architectures") or []
    labels = config.get("num_labels", len(config.get("id2label") or {0: "LABEL_0", 1: "LABEL_1"}))
    if not any(name.endswith("ForSequenceClassification") for name in architectures) or labels != 1:
        raise ConfigError(
            f"{key} = {str(path)!r} is invalid: not a reward model (architectures {architectures}, {labels} labels; "
            "valid: a folder saved from an AutoModelForSequenceClassification with num_labels=1)"
        )
    return folder


def copy_without_weights(folder: str | Path, target: Path) -> None:
    """The files of the model folder `folder` into `target`, but its weights: its config, generation config,
    tokenizer and chat template, whatever code it carries; what turns a checkpoint's weights into a folder again."""
    target.mkdir(parents=True, exist_ok=True)
    for file in Path(folder).iterdir():
        if file.is_file() and file.suffix not in WEIGHT_SUFFIXES and not file.name.endswith(".index.json"):
            shutil.copy2(file, target / file.name)
