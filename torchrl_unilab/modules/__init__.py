"""Policy-side modules: SAC/TD3 networks, exploration and shared observation normalisation.

Laid out like :mod:`torchrl.modules`.

Example:
    >>> from torchrl_unilab.modules import make_actor, make_critic, make_exploration_policy, ObservationNormalizer
"""

from torchrl_unilab.modules.exploration import (
    ActionProjection,
    PerEnvMixedNoise,
    make_collector_policy,
    make_exploration_policy,
    sample_offpolicy_actions,
)
from torchrl_unilab.modules.models import make_actor, make_critic
from torchrl_unilab.modules.normalization import ObservationNormalizer
