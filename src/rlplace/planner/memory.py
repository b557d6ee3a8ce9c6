"""Device memory, predicted: what each component of a run holds on its devices in each phase of a step, and the sum
per device.

Out-of-memory is the first thing that fails when components share a device, so the planner answers it before
anything starts: from the model's shape (a Hugging Face `config.json`) and the run's sizes, each component's bytes
per rank, resident (what stays on the device while it idles) and working (its peak inside the phase it works in);
the switch plan says which idle components are offloaded before each phase. Arithmetic only, like the rest of the
planner. Family modules turn their config into `Usage` (`rlplace.reasoning.memory`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

GB = 1e9
FP32_BYTES = 4
ADAMW_STATE_BYTES = 3 * FP32_BYTES
"""A trained parameter between updates: its float32 weight and AdamW's two moments."""
ALL_LINEAR = "all-linear"
"""LoRA's target of every linear layer but the output head (PEFT's name for it)."""


@dataclass(frozen=True)
class TransformerShape:
    """A decoder-only transformer (Llama, Qwen2, Mistral and alike), as its `config.json` gives it."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    tied_embeddings: bool
    attention_bias: bool = False
    """Biases on the query, key and value projections (Qwen2 has them)."""

    @classmethod
    def from_config(cls, config: Mapping[str, object]) -> TransformerShape:
        """From a Hugging Face config dict; KeyError names a field it lacks."""
        heads = int(config["num_attention_heads"])  # type: ignore[arg-type]
        return cls(
            vocab_size=int(config["vocab_size"]),  # type: ignore[arg-type]
            hidden_size=int(config["hidden_size"]),  # type: ignore[arg-type]
            num_layers=int(config["num_hidden_layers"]),  # type: ignore[arg-type]
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),  # type: ignore[arg-type]
            intermediate_size=int(config["intermediate_size"]),  # type: ignore[arg-type]
            tied_embeddings=bool(config.get("tie_word_embeddings", False)),
            attention_bias=config.get("model_type") == "qwen2" or bool(config.get("attention_bias", False)),
        )

    @property
    def kv_size(self) -> int:
        """Width of the keys (and of the values) of one token in one layer."""
        return self.num_kv_heads * (self.hidden_size // self.num_heads)

    def layer_parameters(self) -> int:
        h, kv, i = self.hidden_size, self.kv_size, self.intermediate_size
        attention = h * h * 2 + h * kv * 2 + ((h + 2 * kv) if self.attention_bias else 0)
        return attention + 3 * h * i + 2 * h  # q, o, k, v; gate, up, down; two norms

    def embedding_parameters(self) -> int:
        return self.vocab_size * self.hidden_size

    def parameters(self, head: bool = True) -> int:
        """All parameters; `head=False` without the LM head (a critic's backbone)."""
        untied_head = head and not self.tied_embeddings
        return (
            self.embedding_parameters() * (2 if untied_head else 1)
            + self.num_layers * self.layer_parameters()
            + self.hidden_size  # the final norm
        )

    def state_dict_parameters(self) -> int:
        """The values of a state dict of the model: tied embeddings appear twice in it (as the input embedding and as
        the LM head), and weight sync sends both."""
        return self.parameters() + (self.embedding_parameters() if self.tied_embeddings else 0)

    def projections(self) -> dict[str, tuple[int, int]]:
        """A decoder layer's linear layers by name: (inputs, outputs)."""
        h, kv, i = self.hidden_size, self.kv_size, self.intermediate_size
        return {
            "q_proj": (h, h),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (h, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def lora_parameters(self, rank: int, targets: Sequence[str]) -> int:
        """LoRA adapters of `rank` on the decoder layers' linear layers named in `targets` (or all of them, with
        `all-linear`): rank x (inputs + outputs) each."""
        adapted = self.projections()
        if list(targets) != [ALL_LINEAR]:
            names = {target.rsplit(".", 1)[-1] for target in targets}
            adapted = {name: size for name, size in adapted.items() if name in names}
        return self.num_layers * sum(rank * (fan_in + fan_out) for fan_in, fan_out in adapted.values())

    def largest_unit(self) -> int:
        """The largest part a sharded model gathers at once: a decoder layer or a vocabulary matrix."""
        return max(self.layer_parameters(), self.embedding_parameters())

    def state_bytes(self, ranks: int, head: bool = True, adapters: int | None = None) -> int:
        """One rank's share of the float32 weights and AdamW's two moments (12 bytes a parameter): what stays on its
        device between updates, each of which frees its gradients when it ends (`ranks` 1 for a replica). With
        `adapters` LoRA parameters, the model's weights are frozen (4 bytes each) and the adapters train."""
        if adapters is None:
            return -(-ADAMW_STATE_BYTES * self.parameters(head) // ranks)
        return -(-(FP32_BYTES * self.parameters(head) + ADAMW_STATE_BYTES * adapters) // ranks)

    def training_state_bytes(
        self, ranks: int, sharded: bool, compute_bytes: int, head: bool = True, adapters: int | None = None
    ) -> int:
        """One rank's training state inside a pass, its float32 gradients included: a replica's whole state;
        sharded, 1/`ranks` of it plus one gathered unit in the compute precision and its unreduced gradient. With
        `adapters` LoRA parameters, only they have gradients."""
        trained = self.parameters(head) if adapters is None else adapters
        whole = self.state_bytes(1, head, adapters) + FP32_BYTES * trained
        if not sharded:
            return whole
        unit_gradient = FP32_BYTES if adapters is None else 0  # an adapter's is a rounding error beside the unit
        return -(-whole // ranks) + self.largest_unit() * (compute_bytes + unit_gradient)

    def frozen_bytes(self, ranks: int, sharded: bool, adapters: int = 0) -> int:
        """One rank's float32 copy of the model (with `adapters` LoRA parameters) for forward passes alone: the whole
        of it, or sharded 1/`ranks`."""
        return -(-FP32_BYTES * (self.parameters() + adapters) // (ranks if sharded else 1))

    def bucket_bytes(self, bucket_mb: float, adapters: int | None = None) -> int:
        """The largest bucket of float32 weight sync sends: `bucket_mb`, or the vocabulary matrix, which travels alone
        when larger (`core.weights.buckets`); the whole state dict when that is smaller. With `adapters`, weight sync
        sends that many LoRA parameters alone."""
        if adapters is not None:
            return min(int(bucket_mb * 1e6), adapters * FP32_BYTES)
        largest = max(int(bucket_mb * 1e6), self.embedding_parameters() * FP32_BYTES)
        return min(largest, self.state_dict_parameters() * FP32_BYTES)

    def scoring_bytes(self, rows: int, seq_len: int) -> int:
        """A forward pass's output for log-probs of `rows` x `seq_len` tokens: the float32 logits and their
        log-softmax."""
        return rows * seq_len * self.vocab_size * FP32_BYTES * 2

    def kv_cache_bytes(self, tokens: int, dtype_bytes: int) -> int:
        """Keys and values of `tokens` tokens in every layer."""
        return 2 * self.num_layers * self.kv_size * tokens * dtype_bytes

    def activation_bytes(self, rows: int, seq_len: int, checkpointing: bool, dtype_bytes: int = 4) -> int:
        """What one training pass of `rows` x `seq_len` tokens keeps for its backward pass, at its peak.

        Per token and layer: the inputs of both norms and of the four attention projections, the rotated queries
        and keys, the values, and the MLP's gate, up, activation and product (6 h + 2 kv + 4 i values); the
        attention probabilities, heads x seq_len per token (the math kernel of a CPU keeps them); the logits and
        their softmax for the log-probs and the entropy (3 V per token), in float32 whatever the compute precision
        (a sharded actor's outputs are cast to float32, and the losses take the log-softmax in float32). With
        checkpointing each layer keeps its input alone, and one layer's full set is rebuilt at a time.
        """
        tokens = rows * seq_len
        h, kv, i = self.hidden_size, self.kv_size, self.intermediate_size
        per_layer = tokens * (6 * h + 2 * kv + 4 * i + self.num_heads * seq_len)
        layers = self.num_layers * tokens * h + per_layer if checkpointing else self.num_layers * per_layer
        return layers * dtype_bytes + tokens * 3 * self.vocab_size * FP32_BYTES


@dataclass(frozen=True)
class Usage:
    """One rank's device memory: `resident` bytes whenever it is on its devices, and its peak in the phases where it
    holds more (`working`: phase -> bytes, resident included)."""

    resident: int
    working: Mapping[str, int] = field(default_factory=dict)

    def in_phase(self, phase: str) -> int:
        return self.working.get(phase, self.resident)

    @property
    def peak(self) -> int:
        return max([self.resident, *self.working.values()])


def device_peaks(
    phases: Sequence[tuple[str, frozenset[str]]],
    devices: Mapping[str, frozenset[int]],
    offloaded: Mapping[str, frozenset[str]],
    usage: Mapping[str, Usage],
) -> dict[int, dict[str, int]]:
    """Device -> phase -> predicted bytes: every component on the device that is not offloaded in that phase (the
    switch plan's `offloaded` set per phase), at its peak in the phase. A component's ranks each hold one device (its
    usage is per rank)."""
    peaks: dict[int, dict[str, int]] = {}
    for phase, _ in phases:
        for name, where in devices.items():
            if name in offloaded[phase] or name not in usage:
                continue
            size = usage[name].in_phase(phase)
            for device in where:
                peaks.setdefault(device, {}).setdefault(phase, 0)
                peaks[device][phase] += size
    return peaks


def over_capacity(peaks: Mapping[int, Mapping[str, int]], capacity_gb: float) -> tuple[int, str, float] | None:
    """The (device, phase, GB over) of the largest excess over `capacity_gb`, or None when every phase fits."""
    excesses = [
        (size / GB - capacity_gb, -device, phase) for device, phases in peaks.items() for phase, size in phases.items()
    ]
    worst = max(excesses, default=None)  # the largest excess, on the lowest device of equal ones
    if worst is None or worst[0] <= 0:
        return None
    return -worst[1], worst[2], worst[0]
