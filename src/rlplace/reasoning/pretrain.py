"""Supervised pretraining of the tiny LM on its task, up to partial accuracy, cached so that RL starts from it.

RL with a verifiable reward learns nothing from a model that never answers correctly (every reward is 0, every group-
normalised advantage is 0), and has nothing left to learn from one that always does. So a freshly built tiny LM is first
fine-tuned on (prompt, answer) pairs of its task until greedy exact-match accuracy on the held-out split reaches
`model.pretrain.target_accuracy`, and RL starts from there. The result depends only on the problems, the model shape and
the pretraining config, so it is made once per such combination and cached under `outputs/pretrained/` (or
`$RLPLACE_OUTPUT_DIR/pretrained/`), keyed by a hash of exactly those fields; every run (and every placement) then starts
from the same weights. The folder appears atomically: a crashed or concurrent pretraining never leaves a half-written
one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from rlplace.core import preemption
from rlplace.core.config import output_root
from rlplace.core.errors import check
from rlplace.core.registry import load
from rlplace.reasoning.config import ReasoningConfig
from rlplace.reasoning.models.hf_folder import check_model_folder
from rlplace.reasoning.models.registry import MODELS
from rlplace.reasoning.models.tiny_lm import load_causal_lm
from rlplace.reasoning.models.tokenizer import load_tokenizer
from rlplace.reasoning.rewards import SCORE, RewardFunction, check_remote_reward
from rlplace.reasoning.tasks import drop_overlong, make_prompt_source
from rlplace.reasoning.tasks.prompts import Problem, PromptSource, encode_prompts
from rlplace.reasoning.tasks.registry import ReasoningTaskConfig

log = logging.getLogger(__name__)

STATS_FILE = "pretrain.json"
"""Written into the model folder: accuracy before and after, steps, seconds, the eval history and the keyed config."""
IGNORE_INDEX = -100
"""Label of tokens the SFT loss skips (BOS, prompt and padding): the model learns to answer, not to ask."""
TASK_KEY_FIELDS = (
    "name",
    "min_digits",
    "max_digits",
    "operations",
    "eval_size",
    "data_seed",
    "train_path",
    "eval_path",
)
"""The task fields that define the problems of the built-in tasks, keyed as they always were (a field a task's schema
does not have keys as None), so that a cached model stays found; a task's other fields key too, but for
`PRETRAIN_NEUTRAL_FIELDS`."""
PRETRAIN_NEUTRAL_FIELDS = ("prompts_per_step",)
"""Task fields that do not change the pretrained weights."""
KEYED_WHEN_SET = {"truncation": "error"}
"""Task fields added after models were cached, with the value that keys as their absence: such a field keys only when
set to another, so that those keys stay valid."""
KEYED_REWARD_DEFAULT = "exact_match"
"""The reward changes the pretrained weights too (pretraining stops on its score), but it keys (as `task.reward`, the
field it was before it had a section of its own) only when it is not `exact_match`, so that keys made before rewards
were configurable stay valid."""
LR_WARMUP_STEPS = 50
"""Linear learning-rate warmup: without it, AdamW's first large steps from a random init stall the loss for longer."""
MAX_GRAD_NORM = 1.0


def cache_config(cfg: ReasoningConfig) -> dict[str, Any]:
    """Everything the pretrained weights depend on, and nothing else: the cache key is a hash of it."""
    return {
        "task": {
            **{name: getattr(cfg.task, name, None) for name in TASK_KEY_FIELDS},
            **{
                f.name: getattr(cfg.task, f.name)
                for f in dataclasses.fields(cfg.task)
                if f.name not in TASK_KEY_FIELDS + PRETRAIN_NEUTRAL_FIELDS
                and (f.name not in KEYED_WHEN_SET or getattr(cfg.task, f.name) != KEYED_WHEN_SET[f.name])
            },
            **({} if cfg.reward_name == KEYED_REWARD_DEFAULT else {"reward": cfg.reward_name}),
        },
        **({} if cfg.model.name == "tiny_lm" else {"model": cfg.model.name}),
        "shape": dataclasses.asdict(load(MODELS[cfg.model.name].shape, "model.name")()),
        "pretrain": dataclasses.asdict(cfg.model.pretrain),
        "max_new_tokens": cfg.rollout.max_new_tokens,
    }


def cache_key(cfg: ReasoningConfig) -> str:
    """A short sha256 of `cache_config`, stable across processes and Python versions."""
    return hashlib.sha256(json.dumps(cache_config(cfg), sort_keys=True).encode()).hexdigest()[:12]


def pretrained_model_path(cfg: ReasoningConfig, cache_root: Path | None = None) -> Path:
    """The model folder a reasoning run starts from.

    `model.path` when set (checked with check_model_folder); for a model kind that builds (`models.registry`) without
    a path, the cached pretrained folder for this (kind, task, shape, pretrain config), made by `pretrain` on first
    use.
    """
    if cfg.model.path is not None:
        return check_model_folder(cfg.model.path)
    built = [name for name, kind in MODELS.items() if kind.build is not None]
    check(
        MODELS[cfg.model.name].build is not None,
        "model.path",
        None,
        f"a local Hugging Face model folder (only model={'|'.join(built)} is built)",
    )
    root = output_root() / "pretrained" if cache_root is None else Path(cache_root)
    folder = root / f"{cfg.model.name}-{cfg.task.name}-{cache_key(cfg)}"
    if (folder / STATS_FILE).is_file():
        log.info("pretrained model: %s (cached)", folder)
        return folder
    pretrain(cfg, folder)
    return folder


def pretrain(cfg: ReasoningConfig, folder: Path) -> dict[str, Any]:
    """Build a fresh tiny LM, fine-tune it on the task to partial accuracy, and move it into `folder` atomically.

    Everything is written into a temporary folder next to `folder` and renamed into place last, so `folder` either
    does not exist or is complete. If another process renamed its own result into place first, theirs is kept
    (same key, same config, same seed) and its stats are returned.
    """
    check_remote_reward(cfg.reward_name)  # the fine-tuning scores with the run's reward
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.parent / f".tmp-{folder.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        build = load(MODELS[cfg.model.name].build, "model.name")
        source = make_prompt_source(cfg.task)  # read once: the builder (a tokenizer's text) and the fine-tuning
        build(tmp, source, cfg.model.pretrain.seed)
        stats = fine_tune(cfg, tmp, source)
        (tmp / STATS_FILE).write_text(json.dumps(stats, indent=2) + "\n")
        try:
            os.rename(tmp, folder)
        except OSError:
            if not (folder / STATS_FILE).is_file():
                raise
            log.info("another process pretrained %s first; keeping theirs", folder)
            return json.loads((folder / STATS_FILE).read_text())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info(
        "pretrained model: %s (accuracy %.3f -> %.3f in %d steps, %.1f s)",
        folder,
        stats["accuracy_before"],
        stats["accuracy_after"],
        stats["steps"],
        stats["seconds"],
    )
    return stats


def fine_tune(cfg: ReasoningConfig, folder: Path, source: PromptSource) -> dict[str, Any]:
    """SFT of the model in `folder`, saved back in place; evaluates every eval_interval steps and stops at target."""
    pre = cfg.model.pretrain
    torch.manual_seed(pre.seed)
    reward = cfg.reward_function()
    tokenizer = load_tokenizer(folder)
    model = load_causal_lm(folder)
    # The run leaves out the same prompts (`drop_overlong`): pretraining neither learns nor measures on them.
    drop_overlong(source, cfg.task, tokenizer, model.config.max_position_embeddings, cfg.rollout.max_new_tokens)
    eval_set = source.eval_set()
    optimizer = torch.optim.AdamW(model.parameters(), lr=pre.lr)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / LR_WARMUP_STEPS))
    max_new_tokens = cfg.rollout.max_new_tokens
    start = time.monotonic()

    def evaluate(step: int, train_losses: list[float]) -> dict[str, Any]:
        point = {
            "step": step,
            "train_loss": sum(train_losses) / len(train_losses) if train_losses else None,
            "eval_loss": sft_loss(model, tokenizer, eval_set, cfg.task),
            "accuracy": greedy_accuracy(model, tokenizer, eval_set, cfg.task, max_new_tokens, reward),
            "seconds": round(time.monotonic() - start, 2),
        }
        log.info(
            "pretrain step %d: train_loss %s  eval_loss %.4f  accuracy %.3f  (%.1f s)",
            step,
            "-" if point["train_loss"] is None else f"{point['train_loss']:.4f}",
            point["eval_loss"],
            point["accuracy"],
            point["seconds"],
        )
        return point

    history = [evaluate(0, [])]
    losses: list[float] = []
    step = 0
    while step < pre.max_steps and history[-1]["accuracy"] < pre.target_accuracy:
        preemption.stop_if_requested()  # a run stopped while its model pretrains ends here, caching nothing
        model.train()
        loss = sft_loss(model, tokenizer, source.train_batch(step, pre.batch_size), cfg.task, grad=True)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        optimizer.step()
        warmup.step()
        losses.append(loss.item())
        step += 1
        if step % pre.eval_interval == 0 or step == pre.max_steps:
            history.append(evaluate(step, losses))
            losses = []
    model.eval()
    model.save_pretrained(folder)
    return {
        "accuracy_before": history[0]["accuracy"],
        "accuracy_after": history[-1]["accuracy"],
        "steps": step,
        "seconds": round(time.monotonic() - start, 2),
        "history": history,
        "key": cache_key(cfg),
        "config": cache_config(cfg),
    }


def sft_batch(
    tokenizer: PreTrainedTokenizerBase, problems: Sequence[Problem], task: ReasoningTaskConfig
) -> dict[str, torch.Tensor]:
    """The prompt as the model is asked it (`encode_prompts`) + answer + EOS per problem, right-padded; labels only on
    answer and EOS tokens.

    Right padding keeps every sequence's positions at 0, 1, 2, ... as in unpadded generation (left-padded
    generation derives the same positions from the attention mask).
    """
    prompts = encode_prompts(tokenizer, problems, task)
    answers = tokenizer([p.answer for p in problems], add_special_tokens=False)["input_ids"]
    length = max(len(p) + len(a) + 1 for p, a in zip(prompts, answers, strict=True))
    input_ids = torch.full((len(problems), length), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(problems), length), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(problems), length), dtype=torch.long)
    for row, (prompt, answer) in enumerate(zip(prompts, answers, strict=True)):
        target = [*answer, tokenizer.eos_token_id]
        end = len(prompt) + len(target)
        input_ids[row, :end] = torch.tensor(prompt + target)
        labels[row, len(prompt) : end] = torch.tensor(target)
        attention_mask[row, :end] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def sft_loss(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[Problem],
    task: ReasoningTaskConfig,
    grad: bool = False,
) -> torch.Tensor | float:
    """Mean cross-entropy over answer and EOS tokens: a tensor to backpropagate with grad=True, else a float."""
    batch = {k: v.to(model.device) for k, v in sft_batch(tokenizer, problems, task).items()}
    if grad:
        return model(**batch).loss
    with torch.no_grad():
        return model(**batch).loss.item()


def greedy_accuracy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[Problem],
    task: ReasoningTaskConfig,
    max_new_tokens: int,
    reward: RewardFunction,
    batch_size: int = 256,
) -> float:
    """Mean training reward ("score" of `reward`, the run's) of the greedy responses: the held-out metric pretraining
    stops on."""
    if not problems:
        raise ValueError("greedy_accuracy needs at least one problem")
    prompts = encode_prompts(tokenizer, problems, task)
    decoded = reward.decode(tokenizer, prompts, greedy_responses(model, tokenizer, prompts, max_new_tokens, batch_size))
    return sum(scores[SCORE] for scores in reward.scores(problems, decoded)) / len(problems)


@torch.no_grad()
def greedy_responses(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[list[int]],
    max_new_tokens: int,
    batch_size: int = 256,
) -> list[list[int]]:
    """Greedy continuation of each prompt (token ids): its tokens up to and with the first EOS; prompts are
    left-padded in batches.

    With left padding every prompt ends where generation starts, and generate derives position ids from the
    attention mask, so each response is the one the prompt alone would get.
    """
    was_training = model.training
    model.eval()
    responses: list[list[int]] = []
    for first in range(0, len(prompts), batch_size):
        chunk = {"input_ids": list(prompts[first : first + batch_size])}
        enc = tokenizer.pad(chunk, return_tensors="pt", padding=True, padding_side="left")
        enc = {k: v.to(model.device) for k, v in enc.items()}
        out = model.generate(
            **enc,
            do_sample=False,
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        for row in out[:, enc["input_ids"].shape[1] :].tolist():
            ends = row.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in row else len(row)
            responses.append(row[:ends])
    model.train(was_training)
    return responses
