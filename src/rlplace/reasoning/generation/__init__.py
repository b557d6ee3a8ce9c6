"""Generation engines for the LLM rollout: `hf` (transformers) and `vllm`, behind one interface."""

from .engine import BACKENDS, GenerationEngine, make_engine, sequence_seed

__all__ = ["BACKENDS", "GenerationEngine", "make_engine", "sequence_seed"]
