"""Checkpointing and seeding of :class:`~torchrl_unilab.OffPolicyCollector`, in TorchRL's collector shape.

``state_dict`` holds the consumer-side counters and the policy's weights;
``load_state_dict`` continues a run from them. Env states stay in the workers:
a resumed run starts new episodes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from torchrl_unilab.collectors._control import STREAM_TRAJ_BITS
from torchrl_unilab.weight_update.weight_sync_scheme import resolve_weight_names

__all__ = ["CheckpointAPI"]


class CheckpointAPI:
    """Mixin of :class:`~torchrl_unilab.OffPolicyCollector`: ``set_seed``, ``state_dict`` and ``load_state_dict``.

    It reads the collector's fields (``_worker_frames``, ``_scheme``, ...)
    and is not meant to be used alone.

    Examples:
        >>> from torchrl_unilab import OffPolicyCollector
        >>> with OffPolicyCollector("Pendulum-v1", num_envs=2, frames_per_batch=32, total_frames=64) as collector:
        ...     for _ in collector:
        ...         pass
        ...     state = collector.state_dict()
        >>> state["frames"], sorted(key for key in state if key.startswith("worker"))
        (64, ['worker0'])
    """

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seeds the workers' envs; call it before collection starts. Returns the next free seed.

        Env ``j`` of worker ``i`` gets ``seed + i * num_envs + j``, so the next
        free seed is ``seed + num_workers * num_envs``.
        """
        if static_seed:
            raise ValueError("static_seed=True is not supported: every env of every worker gets its own seed")
        if self._started:
            raise RuntimeError(
                "set_seed() must be called before collection starts (the first iteration, start(), "
                "allow_frames() or wait_for_frames()); pass seed= to the constructor, or call it earlier"
            )
        self.seed = int(seed)
        return self.seed + self.num_workers * self.num_envs

    def state_dict(self) -> OrderedDict:
        """Counters in TorchRL's collector shape (``"worker<i>"``, ``"frames"``, ``"iter"``), for checkpoints.

        Per worker: frames collected, the policy version it acts with and, as in
        TorchRL's collectors, ``"policy_state_dict"`` under the names of the policy
        given to the constructor (none for a policy without weights): a CPU
        policy's own weights, which TorchRL's workers share, and for a policy on
        a GPU the weights published last. The workers act with the version
        published last (``"policy_version"``). Env states stay in the workers; a
        resumed run starts new episodes.
        ``"traj_pool"`` is TorchRL's ``{"traj_id": ...}``: here the first trajectory id
        no worker of this run hands out, so that a run resumed from it numbers its
        trajectories after those already in a saved buffer.
        """
        state = OrderedDict()
        if isinstance(self._user_policy, nn.Module) and not self._acts_on_copy:
            weights = {name: value.detach().clone() for name, value in self._user_policy.state_dict().items()}
        else:
            closed = self._scheme.shared.closed
            weights = None if closed else self._scheme.published_state_dict(like=self._user_policy)
        for idx, worker in enumerate(self._metrics.summary()["workers"]):
            state[f"worker{idx}"] = {"frames": self._worker_frames.control.worker_written(idx),
                                     "policy_version": worker["policy_version"]}
            if weights:
                state[f"worker{idx}"]["policy_state_dict"] = OrderedDict(weights)
        state.update(frames=self._consumed_frames, iter=self._iteration, frames_written=self.frames_written,
                     policy_version=self.policy_version)
        state["traj_pool"] = {"traj_id": torch.tensor(self._first_free_traj_id(), dtype=torch.int64)}
        return state

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> None:
        """Restores the consumer-side counters saved by :meth:`state_dict`, to continue a run.

        As with TorchRL's collectors, iteration goes on from the restored
        ``frames`` to ``total_frames``, and the restored frames count against
        ``init_random_frames`` (loaded before collection starts; once workers
        run, the random frames they were given stay). The workers start new
        episodes. A ``"policy_state_dict"`` (of the first worker that has one)
        is loaded into the collector's policy and published: every worker acts
        with it from its next step; ``strict`` as in ``nn.Module.load_state_dict``
        (TorchRL's ``RayCollector`` passes ``strict=False``).
        """
        saved = [entry.get("policy_state_dict") for key, entry in state_dict.items()
                 if key.startswith("worker") and isinstance(entry, Mapping)]
        weights = next((entry for entry in saved if entry), None)
        if weights is not None:
            if isinstance(self.policy, nn.Module) and not strict:
                # nn.Module's own reading of strict=False: the names given are loaded, the others kept
                self.policy.load_state_dict(dict(weights), strict=False)
                weights = None  # the policy, as it now is, is what the workers get
            elif isinstance(self.policy, nn.Module):
                self.policy.load_state_dict(resolve_weight_names(self.policy, weights))
            self._scheme.send(weights)
            self._weights_restored = True
        frames = int(state_dict.get("frames", 0))
        self._restored += frames - self._consumed_frames
        self._consumed_frames = frames
        self._iteration = int(state_dict.get("iter", -1))
        traj_pool = state_dict.get("traj_pool")
        if traj_pool is not None and not self._started:
            # The first seed stream whose trajectory ids all lie at or above the saved first free id.
            block = self.num_workers << STREAM_TRAJ_BITS
            self._stream_base = max(self._stream_base, -(-int(traj_pool["traj_id"]) // block))
        if not self._started:
            self._worker_frames.reset(self._frame_control())

    def _first_free_traj_id(self) -> int:
        """An id above every trajectory id this run's workers may hand out (see ``_worker.WorkerLoop``).

        Worker ``i`` on seed stream ``s`` numbers its trajectories ``(s * 2**32 + k) * num_workers + i``.
        """
        restarts = max(self._pool.restarts) if self._pool is not None else 0
        return ((self._stream_base + restarts + 1) << STREAM_TRAJ_BITS) * self.num_workers
