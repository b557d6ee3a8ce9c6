"""`rlplace-export CHECKPOINT TARGET`: a reasoning checkpoint's policy as a Hugging Face model folder, to evaluate or
serve any step of a run (lm-eval-harness, vLLM), not only the final one; verl's model merger does this for verl's.

A checkpoint holds the policy in `torch.distributed.checkpoint` form, one part per actor rank (`actor/`), and the
model folder's files but its weights (`model/`: config, generation config, tokenizer, chat template). The policy is
built from that config without initialising its weights, read from every rank's part in this one process (DCP
reshards on load, whatever strategy and rank count wrote it) and written with the files beside it: the weights of
step k as the run's `final_model/` would have held them had it stopped there (a LoRA policy's adapters merged, and
alone in `adapter/`, as there). TARGET is written atomically and must not exist yet.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from rlplace.core import checkpoint
from rlplace.core.errors import ConfigError
from rlplace.reasoning import lora
from rlplace.reasoning.config import FAMILY, LoRAConfig
from rlplace.reasoning.workers.actor import MODEL_FILES_DIR, MODELS_DIR

KEY = "checkpoint"
"""How errors name the checkpoint argument."""
POLICY = "policy"
"""The policy's entry of the actor's training state (`training_state.save_training_state`)."""


def check_export(folder: Path, target: Path) -> dict | None:
    """Refuse, in one line naming the argument, a folder that is not a complete reasoning checkpoint with its model
    files, and a target that already exists; returns the settings of the policy's LoRA adapters (None without)."""
    checkpoint.verify(folder, KEY)
    state = checkpoint.read_state(folder, FAMILY, KEY)
    if not (folder / MODEL_FILES_DIR / "config.json").is_file():
        raise ConfigError(
            f"{KEY} = {str(folder)!r} is invalid: it has no {MODEL_FILES_DIR}/config.json (written before checkpoints "
            "carried their model's files)"
        )
    if target.exists():
        raise ConfigError(f"target = {str(target)!r} is invalid: it exists (valid: a folder that does not exist yet)")
    return state["identity"].get(lora.IDENTITY)


def export_checkpoint(folder: Path, target: Path) -> Path:
    """Write checkpoint `folder`'s policy and model files into `target` as a Hugging Face model folder."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    from rlplace.core.strategies.training_state import single_process_quiet
    from rlplace.reasoning.models.tiny_lm import causal_lm_skeleton

    adapters = check_export(folder, target)
    files = folder / MODEL_FILES_DIR
    model = causal_lm_skeleton(files)
    with torch.device("meta"):  # adapters without weights too: the checkpoint fills them
        policy = lora.adapt(model, LoRAConfig(**adapters)) if adapters else model
    policy.to_empty(device="cpu")
    state = {POLICY: get_model_state_dict(policy)}
    with single_process_quiet():
        dcp.load(state, checkpoint_id=folder / MODELS_DIR)
    set_model_state_dict(policy, state[POLICY])
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(files, tmp)
    lora.save_model(model, policy, policy.state_dict(), tmp)
    tmp.rename(target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlplace-export", description=__doc__.split("\n\n")[0])
    parser.add_argument(KEY, type=Path, help="a reasoning checkpoint folder (<run>/checkpoints/step_<k>)")
    parser.add_argument("target", type=Path, help="the model folder to write (must not exist)")
    args = parser.parse_args(argv)
    try:
        target = export_checkpoint(args.checkpoint, args.target)
    except ConfigError as error:
        print(f"rlplace-export: error: {error}", file=sys.stderr)
        return 2
    print(f"rlplace-export: {args.checkpoint} -> {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
