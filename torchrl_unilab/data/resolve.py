"""How a user's ``replay_buffer=`` becomes the buffer the collector's workers write.

TorchRL's buffers that are not a ``ReplayBuffer`` themselves are resolved here,
so that the collector only ever sees the buffer its rows go into:

* an :class:`~torchrl.data.OfflineToOnlineReplayBuffer` (an offline dataset
  beside a growing online buffer, sampled at a fixed offline fraction) is written
  through its online part. TorchRL builds that part as a plain, unshared
  ``ReplayBuffer``; an empty one on a CPU ``LazyTensorStorage`` or
  ``LazyMemmapStorage`` is replaced, inside the user's object, by a
  :func:`~torchrl_unilab.make_replay_buffer` buffer of the same capacity, which the
  workers write themselves. It is laid out with the offline dataset's keys and
  dtypes, as TorchRL's ``OfflineToOnlineReplayBufferHook`` projects online rows
  onto them, so that ``sample()`` can concatenate the two. The user's object still
  does the sampling: TorchRL's exact offline fraction is kept.
* a buffer whose transforms hold a :class:`~torchrl.envs.transforms.PolicyAgeFilter`
  reaches the workers without it (:func:`workers_buffer`): the filter's live
  version (``lambda: collector.policy_version``) is the learner's to call. The
  workers write every row, stamped ``"policy_version"``; the filter drops those
  older than its lag where the learner samples.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
from torchrl.data import LazyMemmapStorage, LazyTensorStorage, OfflineToOnlineReplayBuffer, ReplayBuffer
from torchrl.data.replay_buffers.samplers import RandomSampler
from torchrl.data.replay_buffers.writers import RoundRobinWriter
from torchrl.envs.transforms import Compose, PolicyAgeFilter

from torchrl_unilab._torchrl_private import set_buffer_transform, set_online_buffer
from torchrl_unilab.data.replay_buffer import LAYOUT_SOURCE_ATTR, init_storage, make_replay_buffer

__all__ = ["resolve_replay_buffer", "workers_buffer"]

#: What ``replay_buffer=`` accepts, for the error that names it.
ACCEPTED = "a torchrl ReplayBuffer (make_replay_buffer(...) for the fast path), an OfflineToOnlineReplayBuffer, or None"


def resolve_replay_buffer(replay_buffer: ReplayBuffer | OfflineToOnlineReplayBuffer | None) -> ReplayBuffer | None:
    """The buffer a collector's rows go into: ``replay_buffer`` itself, or an ``OfflineToOnlineReplayBuffer``'s
    online part, made one the workers write (see the module docstring).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage
        >>> offline = ReplayBuffer(storage=LazyTensorStorage(10))
        >>> _ = offline.extend(TensorDict({"observation": torch.zeros(10, 3)}, [10]))
        >>> rb = OfflineToOnlineReplayBuffer(offline, online_capacity=100, offline_fraction=0.25)
        >>> online = resolve_replay_buffer(rb)
        >>> online is rb.online_buffer, online.shared, online.storage.max_size
        (True, True, 100)
        >>> resolve_replay_buffer([])
        Traceback (most recent call last):
        ...
        TypeError: replay_buffer must be a torchrl ReplayBuffer (...), an OfflineToOnlineReplayBuffer, or None; got list
    """
    if replay_buffer is None or isinstance(replay_buffer, ReplayBuffer):
        return replay_buffer
    if isinstance(replay_buffer, OfflineToOnlineReplayBuffer):
        return _shared_online_buffer(replay_buffer)
    raise TypeError(f"replay_buffer must be {ACCEPTED}; got {type(replay_buffer).__name__}")


def _shared_online_buffer(replay_buffer: OfflineToOnlineReplayBuffer) -> ReplayBuffer:
    """The online part, swapped for a shared one where TorchRL built it plain and nothing was written yet."""
    online = replay_buffer.online_buffer
    storage = online.storage
    built_by_torchrl = (type(online) is ReplayBuffer and not online.shared and len(online) == 0
                        and type(storage) in (LazyTensorStorage, LazyMemmapStorage) and not storage.initialized
                        and storage.ndim == 1 and storage.device == torch.device("cpu")
                        and type(online.sampler) is RandomSampler and type(online.writer) is RoundRobinWriter
                        and not len(online.transform))
    if not built_by_torchrl:
        # Already shared (a collector resolved it before), or the user's own: written as any other buffer.
        return online
    shared = make_replay_buffer(storage.max_size, scratch_dir=getattr(storage, "scratch_dir", None))
    offline = replay_buffer.offline_buffer
    if len(offline):
        # The offline dataset's keys and dtypes (after its transforms), without the metadata that
        # TensorDictReplayBuffer's sample() adds ("index"): __getitem__ reads the storage only.
        init_storage(shared, offline[:1][0])
        setattr(shared, LAYOUT_SOURCE_ATTR, "the OfflineToOnlineReplayBuffer's offline dataset")
    set_online_buffer(replay_buffer, shared)
    return shared


def workers_buffer(replay_buffer: ReplayBuffer) -> ReplayBuffer:
    """``replay_buffer`` as the workers write it: without the ``PolicyAgeFilter`` among its transforms, if any.

    The copy shares the storage, writer, sampler and locks; the transforms it keeps
    are copies (as a worker process unpickles them). The filter keeps filtering
    samples drawn from ``replay_buffer`` itself. Its live version stays callable in
    this process only: a worker process unpickles the storage's link back to
    ``replay_buffer`` (for its sampler), filter included, and the user's
    ``lambda: collector.policy_version`` does not pickle; there it is a stub that
    raises if called.

    Examples:
        >>> from torchrl_unilab import make_replay_buffer
        >>> rb = make_replay_buffer(10)
        >>> workers_buffer(rb) is rb
        True
        >>> _ = rb.append_transform(PolicyAgeFilter(lambda: 3, max_policy_lag=1))
        >>> copy = workers_buffer(rb)
        >>> copy.storage is rb.storage, len(copy.transform), len(rb.transform)
        (True, 0, 1)
        >>> rb.transform[0].current_version()
        3
    """
    transform = replay_buffer.transform
    filters = [t for t in transform if isinstance(t, PolicyAgeFilter)]
    if not filters:
        return replay_buffer
    for age_filter in filters:
        if callable(age_filter.current_version) and not isinstance(age_filter.current_version, _LearnerVersion):
            age_filter.current_version = _LearnerVersion(age_filter.current_version)
    view = object.__new__(type(replay_buffer))
    view.__dict__.update(replay_buffer.__dict__)  # the same locks, not the fresh ones a pickled copy makes
    set_buffer_transform(view, Compose(*(t.clone() for t in transform if not isinstance(t, PolicyAgeFilter))))
    return view


class _LearnerVersion:
    """A ``PolicyAgeFilter``'s live version as the user gave it; pickled, a :class:`_VersionElsewhere`."""

    def __init__(self, read: Callable[[], int]) -> None:
        self.read, self.pid = read, os.getpid()

    def __call__(self) -> int:
        return self.read()

    def __reduce__(self) -> tuple:
        return _VersionElsewhere, (self.pid,)


class _VersionElsewhere:
    """What a worker process unpickles of a ``PolicyAgeFilter``'s live version: nothing to call."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def __call__(self) -> int:
        raise RuntimeError(
            f"this PolicyAgeFilter's live version is read in the process that made it (pid {self.pid}), where the "
            "buffer is sampled; workers write every row without it"
        )
