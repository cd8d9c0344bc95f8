"""TD3 on a gymnasium MuJoCo task, learning while workers collect in the background.

The shape of TorchRL's ``sota-implementations/td3``: a Hydra config with the
sections ``env``, ``collector``, ``replay_buffer``, ``optim``, ``network`` and
``logger``, TorchRL's ``TD3Loss`` and ``SoftUpdate``, the actor and the target
networks updated every ``optim.policy_update_delay`` critic updates. The
training loop is SAC's, line for line (``recipes/sac.py``, ``train``): only the
config (``config/td3.yaml``), the loss and the exploration noise differ, and
those come from ``algo="td3"``.

    python recipes/td3.py                                   # HalfCheetah-v5, ~15 min on 2 cores
    python recipes/td3.py env.name=Hopper-v5 collector.total_frames=200000
    python recipes/td3.py collector.lockstep=true           # collect, train, repeat: reproducible
    python recipes/td3.py resume=outputs/HalfCheetah-v5_TD3/<date>   # continue a run

Ctrl-C saves a checkpoint to resume from.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import hydra
from omegaconf import DictConfig

# The loop lives beside this file in sac.py; load it by path so this works both as a
# script and when imported from elsewhere.
_spec = importlib.util.spec_from_file_location("recipes_sac", Path(__file__).with_name("sac.py"))
_sac = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_sac)


@hydra.main(config_path="config", config_name="td3", version_base="1.3")
def main(cfg: DictConfig) -> dict:
    return _sac.train(cfg, "td3")


if __name__ == "__main__":
    main()
