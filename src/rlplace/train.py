"""`rlplace-train`: the Hydra entry point. Compose -> typed config -> placement -> runner.

A config or placement that cannot run is refused here, with one line naming the key and value and exit code 2,
before Ray or any worker starts.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from rlplace.config import ConfigError, register
from rlplace.placement import PlacementError
from rlplace.plan import CONF_DIR, fail, print_plan, resolve

register()


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="train")
def main(cfg: DictConfig) -> float | None:
    try:
        plan = resolve(cfg)
    except (ConfigError, PlacementError) as err:
        fail(str(err))
    print_plan(plan)
    print("rlplace: training is not built yet; the plan above is what a run would use.")
    return None


if __name__ == "__main__":
    main()
