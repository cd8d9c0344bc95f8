"""Our seqlock weight sync as a TorchRL ``WeightSyncScheme``.

:class:`SeqlockWeightSyncScheme` joins TorchRL's ``weight_update`` extension
point: ``OffPolicyCollector(..., weight_sync_schemes={"policy": SeqlockWeightSyncScheme()})``
is what the collector does by default. Its transport is one
:class:`~torchrl_unilab.SharedWeights` block. What it keeps from our design, and what
TorchRL's ``SharedMemWeightSyncScheme`` does not give: the writer never waits for
the workers (no acknowledgement round trip), and a worker always loads a
consistent snapshot (the seqlock), tagged with a version that goes into every row.

Weights are matched by *name*, whatever the collector wrapped around the policy
(:func:`resolve_weight_names`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from tensordict import TensorDictBase
from torch import nn
from torchrl.weight_update import SharedMemWeightSyncScheme

from torchrl_unilab.weight_update.weight_sync import SharedWeights

__all__ = ["SeqlockWeightSyncScheme", "resolve_weight_names"]


def _flat_weights(source: Any) -> dict[str, torch.Tensor]:
    if isinstance(source, nn.Module):
        return dict(source.state_dict())
    if isinstance(source, TensorDictBase):
        flat = source.flatten_keys(".")
        return {key: flat.get(key) for key in flat.keys(include_nested=True, leaves_only=True)}
    if isinstance(source, Mapping):
        return dict(source)
    raise TypeError(
        "weights must be an nn.Module, a state_dict (Mapping[str, Tensor]) or a TensorDict "
        f"(TensorDict.from_module(policy)), got {type(source).__name__}"
    )


def resolve_weight_names(policy: nn.Module, weights: Any) -> dict[str, torch.Tensor]:
    """Maps ``weights`` onto ``policy``'s ``state_dict`` names, whatever wraps the module they came from.

    ``weights`` may belong to ``policy`` itself or to any of its submodules (the
    actor inside an exploration wrapper and an observation normaliser, say): the
    submodule whose names they match is found, and every name of ``policy``
    outside it keeps its current value. A name that matches nowhere, or a
    submodule name that is missing, raises a ``KeyError`` that lists them.

    Examples:
        >>> import torch
        >>> actor = torch.nn.Linear(2, 1)
        >>> wrapped = torch.nn.Sequential(torch.nn.Identity(), actor)
        >>> sd = resolve_weight_names(wrapped, {"weight": torch.ones(1, 2), "bias": torch.zeros(1)})
        >>> sorted(sd), sd["1.weight"].tolist()
        (['1.bias', '1.weight'], [[1.0, 1.0]])
    """
    given = _flat_weights(weights)
    current = dict(policy.state_dict())
    # TensorDict.from_module also holds non-persistent buffers: per-env exploration state (TD3's noise
    # stds), not weights. TorchRL's Ray scheme sends them; they are no part of what workers load.
    state = {f"{name}.{buffer}" if name else buffer
             for name, module in policy.named_modules() for buffer in module._non_persistent_buffers_set}  # noqa: SLF001
    best: tuple[int, str, list[str], list[str]] | None = None
    for prefix in ("", *(f"{name}." for name, _ in policy.named_modules() if name)):
        unknown = sorted(n for n in given if prefix + n not in current and prefix + n not in state)
        if unknown and best is not None and len(unknown) >= best[0]:
            continue
        missing = sorted(n[len(prefix):] for n in current if n.startswith(prefix) and n[len(prefix):] not in given)
        if not unknown and not missing:
            out = dict(current)
            out.update({prefix + n: value for n, value in given.items() if prefix + n in current})
            return out
        if best is None or len(unknown) + len(missing) < best[0]:
            best = (len(unknown) + len(missing), prefix, unknown, missing)
    _, prefix, unknown, missing = best
    raise KeyError(
        f"weights do not match the collector's policy: closest module is {prefix.rstrip('.') or '(the policy)'!r}; "
        f"names not in it: {unknown[:20]}; its names not given: {missing[:20]}. "
        f"Pass TensorDict.from_module(policy), policy.state_dict() or the module itself, for the policy given to "
        f"the collector or any of its submodules. The policy's names: {sorted(current)[:40]}"
    )


class SeqlockWeightSyncScheme(SharedMemWeightSyncScheme):
    """Learner → worker weight sync through one seqlock-protected shared-memory block.

    The sender copies the policy's weights into a :class:`~torchrl_unilab.SharedWeights`
    block and bumps its version; each worker checks the version between env steps
    and copies a consistent snapshot when it has advanced. ``send`` returns as soon
    as the copy is made: the writer never waits for a worker, and a worker never
    reads a torn mix of two versions. CUDA weights reach the shared CPU block with one
    batched device-to-host copy (:meth:`SharedWeights.publish <torchrl_unilab.SharedWeights.publish>`).

    What travels is the policy's ``state_dict``: parameters and persistent buffers
    of any dtype and size, so the annealed ``sigma``/``eps`` of TorchRL's
    exploration modules reach the workers as with TorchRL's own schemes.
    Non-persistent buffers and state the policy keeps in the TensorDict (per-env
    noise) stay with each worker (:mod:`torchrl_unilab.weight_update.weight_sync`).
    A policy with no weights (TorchRL's ``RandomPolicy``, any callable) has
    nothing to sync: only the version travels.

    It is a ``SharedMemWeightSyncScheme`` (TorchRL's default for multi-process
    collectors, which ``isinstance`` checks in users' code expect), with its own
    transport: none of that class's queues or background threads run.

    :meth:`shutdown` (which TorchRL's ``WeightSyncScheme.__del__`` calls) may run
    at any time and in any order with the garbage collector: it never reads
    memory that may be unmapped (:meth:`SharedWeights.close
    <torchrl_unilab.SharedWeights.close>`).

    Args:
        strategy: kept for TorchRL's interface; weights always travel as a ``state_dict``.

    Examples:
        >>> import torch
        >>> scheme = SeqlockWeightSyncScheme()
        >>> policy = torch.nn.Linear(3, 1)
        >>> scheme.init_on_sender(model_id="policy", model=policy)
        >>> scheme.send({"weight": torch.ones(1, 3), "bias": torch.zeros(1)})
        >>> scheme.version
        2
        >>> scheme.shutdown()
        >>> scheme.version
        2
    """

    def __init__(self, strategy: str = "state_dict") -> None:
        super().__init__(strategy="tensordict")
        self.shared: SharedWeights | None = None
        self._sender_model: nn.Module | None = None

    def _init_on_sender_impl(self, model_id: str = "policy", context: Any = None, model: nn.Module | None = None,
                             **kwargs: Any) -> None:
        if model is None and context is not None:
            model = getattr(context, model_id)
        self.model_id = model_id
        # A policy that is no nn.Module (TorchRL's RandomPolicy, a plain callable) has no weights: an empty block
        # still carries the version.
        self._sender_model = model if isinstance(model, nn.Module) else nn.Module()
        self.shared = SharedWeights.create(self._sender_model)
        self.synchronized_on_sender = True

    def _init_on_receiver_impl(self, model_id: str = "policy", context: Any = None, model: nn.Module | None = None,
                               **kwargs: Any) -> None:
        self.model_id = model_id
        if model is not None:
            self.model = model
        self.synchronized_on_receiver = True

    def create_transport(self, **kwargs: Any) -> SharedWeights:
        """The transport is the shared block itself (``publish`` / ``load_into``)."""
        if self.shared is None:
            raise RuntimeError("SeqlockWeightSyncScheme must be initialised on the sender (init_on_sender) first")
        return self.shared

    @property
    def version(self) -> int:
        """The latest published version (1: the weights at construction); still readable after :meth:`shutdown`."""
        return self.shared.version

    def prepare_weights(self, weights: Any, model_id: str | None = None, strategy: Any = None,
                        context: Any = None) -> dict[str, torch.Tensor]:
        """The full ``state_dict`` to publish: ``weights`` resolved by name, the rest from the sender's model."""
        if weights is None:
            return dict(self._sender_model.state_dict())
        if not self.shared.layout and not _flat_weights(weights):
            return {}  # nothing given for a policy without weights
        return resolve_weight_names(self._sender_model, weights)

    def send(self, weights: Any = None, worker_ids: int | list[int] | None = None, *,
             new_version: bool = True) -> None:
        """Publishes ``weights`` (``None``: the sender's model as it is now) to every worker.

        ``new_version=False`` rewrites the current version, for weights no worker has read yet.
        """
        if self.shared is None:
            raise RuntimeError("SeqlockWeightSyncScheme must be initialised on the sender (init_on_sender) first")
        if self.shared.closed:
            raise RuntimeError("the weight sync is shut down (the collector was shut down); nothing can be published")
        if worker_ids is not None:
            raise ValueError("worker_ids must be None: all workers read one shared copy of the weights")
        state = self.prepare_weights(weights)
        # Tensors stay where they are: publish() brings CUDA weights over in one batched copy, not one .cpu() each.
        self.shared.publish(state, new_version=new_version)
        self._published(state)

    def _published(self, state: dict[str, torch.Tensor]) -> None:
        """Called with each ``state_dict`` once the workers can read it; for schemes built on this one."""

    def published_state_dict(self, like: nn.Module | None = None) -> dict[str, torch.Tensor]:
        """A copy of the weights published last, under ``like``'s names (a submodule of the sender's model).

        ``like=None`` gives the sender model's own names. A ``like`` whose names
        match no submodule of the sender's model also gets them.
        """
        if self.shared is None:
            raise RuntimeError("SeqlockWeightSyncScheme must be initialised on the sender (init_on_sender) first")
        names = [name for name, _, _ in self.shared.layout]
        state = dict(zip(names, self.shared.read()[1])) if names else {}
        if like is None or not isinstance(like, nn.Module):
            return state
        wanted = list(like.state_dict())
        prefix = _prefix_of(names, wanted)
        return state if prefix is None else {name: state[prefix + name] for name in wanted}

    def receive(self, timeout: float | None = None) -> int | None:
        """Worker side: loads a newer version into the registered model; returns it, or ``None``."""
        return self.shared.load_into(self.model)

    def __getstate__(self) -> dict:
        # Workers get the block's handle; the sender's model stays with the sender.
        return {"shared": self.shared, "_model_id": self.model_id}

    def __setstate__(self, state: dict) -> None:
        super().__init__(strategy="tensordict")
        self.shared = state["shared"]
        self.model_id = state["_model_id"]
        self._sender_model = None

    def shutdown(self) -> None:
        """Closes the shared block (the sender also removes it); safe again, from finalisers, in any order."""
        # getattr: TorchRL's __del__ calls this on a scheme whose __init__ may not have finished.
        shared = getattr(self, "shared", None)
        if shared is not None:
            shared.close()


def _prefix_of(names: list[str], wanted: list[str]) -> str | None:
    """The prefix under which every name of ``wanted`` is in ``names`` (``""`` first), or ``None``."""
    if not wanted:
        return ""
    have = set(names)
    candidates = [name[: len(name) - len(wanted[0])] for name in names if name.endswith(wanted[0])]
    for prefix in sorted(candidates, key=len):
        if (not prefix or prefix.endswith(".")) and all(prefix + name in have for name in wanted):
            return prefix
    return None
