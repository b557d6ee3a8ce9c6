"""Reasoning RL for LLMs: generation (rollout), a verifier (reward), log-probs (inference) and the policy update
(actor), streaming micro-batches through channels.

Imports the core, scheduler, placement and metrics layers; never the embodied family.
"""
