"""Registers ``OffPolicyCollector``'s config in Hydra's ConfigStore when a Hydra app starts.

Hydra imports every module of the ``hydra_plugins`` namespace package while it
discovers plugins, before it composes the app's config; this is what lets a
TorchRL trainer config say ``- collector@collector: off_policy`` with no import
of ours in its script (see :mod:`torchrl_unilab.trainers.configs`).
"""

from torchrl_unilab.trainers.configs import register_configs

register_configs()
