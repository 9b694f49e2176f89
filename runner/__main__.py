"""`python -m runner [-m] [overrides]`: one job, or with -m a Hydra sweep of jobs."""

import hydra
from omegaconf import DictConfig

from runner.config import register_configs

register_configs()


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> dict:
    from runner.job import run_job

    return run_job(cfg)


if __name__ == "__main__":
    main()
