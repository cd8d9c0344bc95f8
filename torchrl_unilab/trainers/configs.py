"""``OffPolicyCollector`` in TorchRL's trainer configuration system.

TorchRL's config-driven trainers (``sota-implementations/*_trainer``) pick their
collector from the Hydra ``ConfigStore`` group ``collector`` by name
(``- collector@collector: multi_async``). :func:`register_configs` adds ours
there as ``off_policy``, with the fields of TorchRL's
``MultiAsyncCollectorConfig`` plus the collector's own options. Hydra imports
the ``hydra_plugins.torchrl_unilab_configs`` package of this distribution when
it starts, which calls :func:`register_configs`, so a trainer config selects the
collector by name without any change to its script::

    defaults:
      - collector@collector: off_policy

or, keeping the config as it is, with the override
``collector._target_=torchrl_unilab.OffPolicyCollector``.
"""

from __future__ import annotations

from dataclasses import dataclass

from hydra.core.config_store import ConfigStore
from torchrl.trainers.algorithms.configs.collectors import MultiAsyncCollectorConfig

__all__ = ["OffPolicyCollectorConfig", "register_configs"]

#: The name a trainer config uses in its ``collector`` defaults entry.
CONFIG_NAME = "off_policy"


@dataclass
class OffPolicyCollectorConfig(MultiAsyncCollectorConfig):
    """Hydra configuration for :class:`~torchrl_unilab.OffPolicyCollector`.

    Every field of TorchRL's ``MultiAsyncCollectorConfig`` (the collector takes
    them all, or rejects a value with the reason), and the options of our own
    that a config most often sets. The rest are keyword arguments of the
    collector that a config may add as it adds any key.

    Examples:
        >>> from hydra.utils import instantiate
        >>> from omegaconf import OmegaConf
        >>> cfg = OmegaConf.structured(OffPolicyCollectorConfig(create_env_fn=[], frames_per_batch=64))
        >>> cfg._target_, cfg.engine, cfg.num_envs
        ('torchrl_unilab.OffPolicyCollector', 'auto', 16)
    """

    num_envs: int = 16
    engine: str = "auto"
    seed: int | None = None
    algo: str | None = None
    nonfinite: str = "raise"
    threads_per_worker: int = 1

    _target_: str = "torchrl_unilab.OffPolicyCollector"


def register_configs() -> None:
    """Stores :class:`OffPolicyCollectorConfig` in Hydra's ``ConfigStore`` as ``collector/off_policy``.

    Idempotent. Hydra's plugin discovery calls it when a Hydra app starts.

    Examples:
        >>> register_configs()
        >>> ConfigStore.instance().load("collector/off_policy.yaml").node._target_
        'torchrl_unilab.OffPolicyCollector'
    """
    ConfigStore.instance().store(group="collector", name=CONFIG_NAME, node=OffPolicyCollectorConfig)
