"""Environments: batched MuJoCo tasks, TorchRL env stacks moved onto EnvPool, and the privileged-information transform.

The tasks run on gymnasium or EnvPool; MuJoCo Playground and the Control Suite run on EnvPool.

Laid out like :mod:`torchrl.envs`.

Example:
    >>> from torchrl_unilab.envs import BatchedGymEnv, EnvPoolEnv, PrivilegedInfoTransform, make_gym_id_env
    >>> from torchrl_unilab.envs import EnvStackPlan, recognise_env_stack
    >>> from torchrl_unilab.envs import observation_layout, task_family
"""

from torchrl_unilab.envs.batched_env import BatchedGymEnv, BatchedTaskEnv, make_gym_env
from torchrl_unilab.envs.envpool_env import EnvPoolEnv, make_gym_id_env, select_engine
from torchrl_unilab.envs.privileged import PrivilegedInfoTransform
from torchrl_unilab.envs.task_families import ObservationLayout, TaskFamily, observation_layout, task_family
from torchrl_unilab.envs.torchrl_stack import EnvStackPlan, recognise_env_stack
