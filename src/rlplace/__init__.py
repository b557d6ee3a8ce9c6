"""rlplace: RL post-training on Ray where component placement is a measured config choice."""

__version__ = "0.1.0"
