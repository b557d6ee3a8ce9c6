"""Decoders for the hf engine: prefill a left-padded batch, then one token per row per step.

`DynamicDecoder` is transformers' usual path: a KV cache that grows by concatenation, a mask that grows with it.
Every step launches each layer's kernels from Python, so on a GPU a small model's decoding is bound by the host
(about ten kernel launches per layer per token), not by the GPU.

`StaticDecoder` preallocates the KV cache (transformers' `StaticCache`) and keeps every input of a decode step in a
buffer of fixed address, so one step can be captured as a CUDA graph once and replayed for every later token: one
launch per token. It passes its own 4D attention mask, so transformers builds none (its mask code would differ per
step), and it pads the rows to a bucket so that one graph serves batches of nearby sizes. The step can also be
`torch.compile`d before capture, which fuses transformers' many small kernels (norms, rotary embedding) into fewer.
Without capture (on the CPU) it runs the same kernels eagerly, which tests use to check its masks and positions
against `DynamicDecoder`.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import Tensor
from transformers import PreTrainedModel, StaticCache

CACHE_LEN_MULTIPLE = 64
"""Static caches are sized to a multiple of this, so prompts of nearby widths share one cache and graph."""


class Decoder(Protocol):
    def prefill(self, input_ids: Tensor, mask: Tensor) -> Tensor:
        """Run the left-padded prompts [rows, width] (mask 1 on real tokens); the next-token logits [rows, vocab]."""
        ...

    def step(self, token: Tensor) -> Tensor:
        """Append one token per row [rows]; the next-token logits [rows, vocab]."""
        ...


def prompt_positions(mask: Tensor) -> Tensor:
    """Position ids counting real tokens only, so a row's positions do not depend on how far it was padded."""
    return (mask.cumsum(dim=1) - 1).clamp(min=0)


class DynamicDecoder:
    """transformers' default cache: no setup, kernels launched from Python every step."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.mask: Tensor | None = None
        self.next_position: Tensor | None = None
        self.past: Any = None

    def prefill(self, input_ids: Tensor, mask: Tensor) -> Tensor:
        self.mask = mask
        self.next_position = mask.sum(dim=1, keepdim=True)
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=prompt_positions(mask),
            use_cache=True,
            logits_to_keep=1,
        )
        self.past = out.past_key_values
        return out.logits[:, -1]

    def step(self, token: Tensor) -> Tensor:
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=1)
        out = self.model(
            input_ids=token[:, None],
            attention_mask=self.mask,
            position_ids=self.next_position,
            past_key_values=self.past,
            use_cache=True,
        )
        self.next_position = self.next_position + 1
        self.past = out.past_key_values
        return out.logits[:, -1]


def bucket_rows(rows: int) -> int:
    """Rows rounded up to a power of two (multiples of 256 above that): few graphs, at most 2x padded work."""
    return 1 << (rows - 1).bit_length() if rows <= 256 else -(-rows // 256) * 256


def bucket_cache_len(tokens: int) -> int:
    return -(-tokens // CACHE_LEN_MULTIPLE) * CACHE_LEN_MULTIPLE


class StaticDecoder:
    """A preallocated KV cache for `rows` sequences of at most `cache_len` tokens, its decode step optionally a
    CUDA graph (`capture`, on a CUDA device only; `pool` lets the graphs of one engine share their memory).

    One instance serves any batch of at most `rows` rows whose prompt width plus new tokens fit `cache_len`; the
    rows beyond the batch are padding that attends only to itself. Column j of the cache holds column j of the
    padded prompt, then the generated tokens: every row writes the same slot each step, which is what a static
    cache supports, and the mask hides the padding.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        rows: int,
        cache_len: int,
        *,
        capture: bool,
        pool: Any = None,
        step_model: Any = None,
    ) -> None:
        self.model, self.rows, self.cache_len = model, rows, cache_len
        self.step_model = model if step_model is None else step_model
        """What runs a decode step: the model, or the model compiled (`torch.compile`) into fewer kernels."""
        device = model.device
        self.cache = StaticCache(config=model.config, max_cache_len=cache_len)
        self.visible = torch.zeros(rows, cache_len, dtype=torch.bool, device=device)
        """visible[r, j]: row r's queries may attend to slot j (a real prompt token or a generated one)."""
        self.token = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.position = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.slot = 0
        """The cache slot the next decode step writes."""
        self.batch = 0
        """Rows of the current batch (the rest are padding)."""
        self.logits: Tensor | None = None
        self.graph: torch.cuda.CUDAGraph | None = None
        if capture:
            self._capture(pool)

    def prefill(self, input_ids: Tensor, mask: Tensor) -> Tensor:
        batch, width = input_ids.shape
        ids = torch.zeros(self.rows, width, dtype=torch.long, device=input_ids.device)
        ids[:batch] = input_ids
        self.cache.reset()  # in place: a captured graph keeps pointing at the same cache
        self.visible.zero_()
        self.visible[:batch, :width] = mask.bool()
        self.visible[batch:, width - 1] = True  # a padding row is one token, so no query is fully masked
        slots = torch.arange(self.cache_len, device=ids.device)
        causal = slots[None, :] <= slots[:width, None]
        itself = slots[None, :] == slots[:width, None]
        # A left-padding query attends to itself alone: its output is never read, but a fully masked query would
        # put NaN into the cache, and NaN times a zero attention weight is still NaN.
        attend = (self.visible[:, None, None, :] & causal) | itself
        self.position.copy_(self.visible.sum(dim=1, keepdim=True))
        positions = prompt_positions(self.visible[:, :width].long())
        out = self.model(
            input_ids=ids,
            attention_mask=self._mask(attend),
            position_ids=positions,
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        self.slot = width
        self.batch = batch
        return out.logits[:batch, -1]

    def step(self, token: Tensor) -> Tensor:
        self.token[: self.batch, 0].copy_(token)
        self.visible[:, self.slot] = True
        if self.graph is None:
            self._forward()
        else:
            self.graph.replay()
        self.slot += 1
        self.position += 1
        return self.logits[: self.batch]

    def _forward(self) -> None:
        out = self.step_model(
            input_ids=self.token,
            attention_mask=self._mask(self.visible[:, None, None, :]),
            position_ids=self.position,
            past_key_values=self.cache,
            use_cache=True,
        )
        self.logits = out.logits[:, -1]

    def _mask(self, attend: Tensor) -> Tensor:
        """`attend` as the model's attention implementation takes a 4D mask: bool for SDPA, additive otherwise."""
        if self.model.config._attn_implementation == "sdpa":  # noqa: SLF001 - transformers' documented switch
            return attend
        return torch.zeros(attend.shape, dtype=self.model.dtype, device=attend.device).masked_fill(
            ~attend, torch.finfo(self.model.dtype).min
        )

    def _capture(self, pool: Any) -> None:
        """Warm up on a side stream (allocates the cache and the libraries' workspaces), then record one step."""
        self.visible[:, 0] = True
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            # The cache allocates its tensors on first use; eagerly, so that a compiled step finds them made.
            self.model(input_ids=self.token, position_ids=self.position, past_key_values=self.cache)
            self._forward()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self._forward()
