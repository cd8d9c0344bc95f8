"""Replay data: a TorchRL replay buffer on process-shared storage, and the crash-safe writer that fills it.

Laid out like :mod:`torchrl.data`.

Example:
    >>> from torchrl_unilab.data import make_replay_buffer, init_storage
"""

from torchrl_unilab.data.buffer_sampler import BufferSampler
from torchrl_unilab.data.buffer_writer import BufferLock, CommitWriter
from torchrl_unilab.data.postprocs import MultiStepWithDone
from torchrl_unilab.data.prioritized_sampler import SharedPrioritizedSampler
from torchrl_unilab.data.replay_buffer import buffer_lock, init_storage, make_replay_buffer
from torchrl_unilab.data.resolve import resolve_replay_buffer, workers_buffer
