"""The placement planner's family-agnostic parts: measured cost curves, a run's profile, and core contention.

Pure Python on purpose (no Ray, nothing started): a prediction is arithmetic over a profile, so thousands of
candidate placements are scored in a second. Each task family turns these into its step-time model
(`rlplace.embodied.planning`).
"""

from .contention import Resources, Work, busiest
from .curve import Curve
from .prediction import Prediction
from .profile import PROFILE_FILE, Profile, ProfileError, load_profile

__all__ = [
    "PROFILE_FILE",
    "Curve",
    "Prediction",
    "Profile",
    "ProfileError",
    "Resources",
    "Work",
    "busiest",
    "load_profile",
]
