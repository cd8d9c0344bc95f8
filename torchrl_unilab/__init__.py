"""torchrl_unilab: simulator-speed off-policy data collection for TorchRL.

A TorchRL plugin: :class:`OffPolicyCollector` runs worker processes that each
step a batch of MuJoCo environments and write transitions straight into a
shared replay buffer, while the learner trains at the same time.
"""

from torchrl_unilab.collectors import CollectorMetrics, OffPolicyCollector, WorkerError
from torchrl_unilab.data import init_storage, make_replay_buffer
from torchrl_unilab.envs import (
    BatchedGymEnv,
    EnvPoolEnv,
    PrivilegedInfoTransform,
    make_gym_env,
    make_gym_id_env,
    select_engine,
)
from torchrl_unilab.modules import (
    ActionProjection,
    ObservationNormalizer,
    PerEnvMixedNoise,
    make_actor,
    make_collector_policy,
    make_critic,
    make_exploration_policy,
    sample_offpolicy_actions,
)
from torchrl_unilab.weight_update import SeqlockWeightSyncScheme, SharedWeights, layout_of

__all__ = [
    "ActionProjection",
    "BatchedGymEnv",
    "CollectorMetrics",
    "EnvPoolEnv",
    "ObservationNormalizer",
    "OffPolicyCollector",
    "PerEnvMixedNoise",
    "PrivilegedInfoTransform",
    "SeqlockWeightSyncScheme",
    "SharedWeights",
    "WorkerError",
    "init_storage",
    "layout_of",
    "make_actor",
    "make_collector_policy",
    "make_critic",
    "make_exploration_policy",
    "make_gym_env",
    "make_gym_id_env",
    "make_replay_buffer",
    "sample_offpolicy_actions",
    "select_engine",
]

__version__ = "0.1.0"
