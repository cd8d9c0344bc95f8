"""torchrl_unilab: simulator-speed off-policy data collection for TorchRL.

A TorchRL plugin: :class:`OffPolicyCollector` runs worker processes that each
step a batch of MuJoCo environments and write transitions straight into a
shared replay buffer, while the learner trains at the same time.
"""

from torchrl_unilab._processes import WorkerError
from torchrl_unilab.batched_env import BatchedGymEnv, make_gym_env
from torchrl_unilab.collector import OffPolicyCollector
from torchrl_unilab.envpool_env import EnvPoolEnv, make_gym_id_env, select_engine
from torchrl_unilab.exploration import (
    ActionProjection,
    PerEnvMixedNoise,
    make_exploration_policy,
    sample_offpolicy_actions,
)
from torchrl_unilab.metrics import CollectorMetrics
from torchrl_unilab.models import make_actor, make_critic
from torchrl_unilab.normalization import ObservationNormalizer
from torchrl_unilab.privileged import PrivilegedInfoTransform
from torchrl_unilab.replay_buffer import init_storage, make_replay_buffer
from torchrl_unilab.weight_sync import SharedWeights, layout_of
from torchrl_unilab.weight_sync_scheme import SeqlockWeightSyncScheme

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
    "make_critic",
    "make_exploration_policy",
    "make_gym_env",
    "make_gym_id_env",
    "make_replay_buffer",
    "sample_offpolicy_actions",
    "select_engine",
]

__version__ = "0.1.0"
