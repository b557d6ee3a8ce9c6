"""Embodied RL: simulators (env), policy inference (rollout) and PPO training (actor), pipelined through channels.

Imports the core, scheduler, placement and metrics layers; never the reasoning family.
"""
