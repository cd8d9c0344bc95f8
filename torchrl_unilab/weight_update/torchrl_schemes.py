"""TorchRL's own weight-sync schemes, honoured on the seqlock transport.

``OffPolicyCollector``'s workers read their weights from one
:class:`~torchrl_unilab.SharedWeights` block; they run no TorchRL worker loop to
answer a scheme's queues, pipes or acknowledgements. A script that names one of
TorchRL's schemes (``weight_sync_schemes={"policy": SharedMemWeightSyncScheme()}``,
``MultiProcessWeightSyncScheme()``, ...) still runs: :func:`as_seqlock_scheme`
wraps the scheme in a :class:`TorchRLSchemeAdapter`, which keeps the scheme's
contract on the seqlock block and says so in one log line:

* every scheme that syncs (``SharedMemWeightSyncScheme``, ``MultiProcessWeightSyncScheme``,
  the distributed ones): ``update_policy_weights_()`` reaches every worker
  before its next step;
* ``SharedMemWeightSyncScheme`` that the user initialised with buffers of their
  own (``init_on_sender(params_map=...)``): those buffers also hold each
  published set of weights, as TorchRL's in-place update leaves them;
* ``NoWeightSyncScheme``: the workers keep the weights they start with.

The other two of TorchRL's weight paths go through this module too, each with one log line:

* a ``WeightUpdaterBase`` (``weight_updater=``, as TorchRL's collector configs pass it, or a callable that builds
  one): :func:`as_weight_updater` registers it with the collector, as TorchRL's collectors do;
  ``update_policy_weights_()`` calls it, then publishes the weights to the workers through the block;
* receiving schemes (``weight_recv_schemes=``, or ``register_scheme_receiver``, which TorchRL's Ray, RPC and
  distributed collectors call on the collector they run on a node): :func:`bind_receiver_schemes` points each at
  the policy the learner's weights are for. When the scheme has received weights, it calls the collector's
  ``update_policy_weights_(model_id="policy", policy_or_weights=...)``, which publishes them to the workers.

The given scheme is never initialised or sent through by the collector: its
transport would wait for workers that never answer it. It is shut down with the
collector (:meth:`TorchRLSchemeAdapter.shutdown`), as TorchRL's collectors shut
theirs down, and never later: a ``SharedMemWeightSyncScheme`` that the user
initialised holds ``multiprocessing`` queues, and its own ``__del__``, left to
the interpreter's final garbage collection, puts a message on them, which starts
a feeder thread that never runs then: the process hung for minutes after the
script's last line.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn
from torchrl.collectors.weight_update import WeightUpdaterBase
from torchrl.weight_update import DistributedWeightSyncScheme, NoWeightSyncScheme, WeightSyncScheme

from torchrl_unilab._torchrl_private import shared_mem_buffers
from torchrl_unilab.envs.specs import VaryingShapeError
from torchrl_unilab.weight_update.weight_sync_scheme import SeqlockWeightSyncScheme, _prefix_of

__all__ = ["FIRST_SEND_WAIT_S", "TorchRLSchemeAdapter", "as_seqlock_scheme", "as_weight_updater",
           "bind_receiver_schemes", "joins_receivers_on_error"]

_log = logging.getLogger("torchrl.unilab")


def as_seqlock_scheme(scheme: WeightSyncScheme | None) -> SeqlockWeightSyncScheme:
    """The scheme a collector syncs its workers with: ``scheme`` itself if it is ours, an adapter of TorchRL's.

    ``None`` gives a new :class:`SeqlockWeightSyncScheme`; any other TorchRL
    ``WeightSyncScheme`` gives a :class:`TorchRLSchemeAdapter` (logged once).

    Examples:
        >>> from torchrl.weight_update import MultiProcessWeightSyncScheme
        >>> type(as_seqlock_scheme(None)).__name__
        'SeqlockWeightSyncScheme'
        >>> type(as_seqlock_scheme(MultiProcessWeightSyncScheme())).__name__
        'TorchRLSchemeAdapter'
    """
    if scheme is None:
        return SeqlockWeightSyncScheme()
    if isinstance(scheme, SeqlockWeightSyncScheme):
        return scheme
    if not isinstance(scheme, WeightSyncScheme):
        raise ValueError(
            "weight_sync_schemes['policy'] must be a torchrl.weight_update.WeightSyncScheme (TorchRL's own or "
            f"SeqlockWeightSyncScheme), got {type(scheme).__name__}"
        )
    adapter = TorchRLSchemeAdapter(scheme)
    _log.info(f"OffPolicyCollector: weight_sync_schemes['policy'] is {type(scheme).__name__}; {adapter.promise}")
    return adapter


def as_weight_updater(value: Any, collector: Any) -> WeightUpdaterBase | None:
    """TorchRL's ``weight_updater=`` argument, registered with ``collector`` as TorchRL's collectors register it.

    ``value`` is ``None``, a ``WeightUpdaterBase``, or a callable that builds one (TorchRL's hydra configs pass a
    ``functools.partial``). The collector's ``update_policy_weights_()`` calls the updater, then publishes the
    weights to its workers through the shared-memory block: the updater's own transport reaches no worker of an
    ``OffPolicyCollector``.

    Examples:
        >>> from torchrl.collectors.weight_update import RemoteModuleWeightUpdater
        >>> class Collector:  # what register_collector needs of a collector
        ...     pass
        >>> collector = Collector()
        >>> updater = as_weight_updater(RemoteModuleWeightUpdater, collector)
        >>> type(updater).__name__, updater.collector is collector
        ('RemoteModuleWeightUpdater', True)
        >>> as_weight_updater(None, collector) is None
        True
    """
    if value is None:
        return None
    if not isinstance(value, WeightUpdaterBase) and callable(value):
        value = value()
    if not isinstance(value, WeightUpdaterBase):
        raise ValueError(
            "weight_updater must be a torchrl.collectors.WeightUpdaterBase, a callable returning one, or None, "
            f"got {type(value).__name__}"
        )
    value.register_collector(collector)
    _log.info(f"OffPolicyCollector: weight_updater is {type(value).__name__}; update_policy_weights_() calls it, "
              "then publishes the weights to every worker through the shared-memory seqlock block")
    return value


def bind_receiver_schemes(collector: Any, schemes: Mapping[str, WeightSyncScheme], model: nn.Module | None,
                          log: bool = True) -> None:
    """Initialises TorchRL's receiving schemes on ``collector``, each applying what it receives to ``model``.

    ``model`` is the policy the learner's weights are for (the one given to the collector, not the exploration or
    normalisation wrapped around it). The scheme then calls ``collector.update_policy_weights_(model_id="policy",
    policy_or_weights=...)``, which publishes the weights to the workers. Logged once, unless ``log`` is false (a
    node whose driver already says how weights travel).

    Examples:
        >>> import torch
        >>> from torchrl.weight_update import RayWeightSyncScheme
        >>> class Collector:
        ...     worker_idx = 0
        ...     policy = torch.nn.Linear(2, 1)
        >>> collector, scheme = Collector(), RayWeightSyncScheme()
        >>> bind_receiver_schemes(collector, {"policy": scheme}, collector.policy)
        >>> scheme.initialized_on_receiver, scheme.model is collector.policy
        (True, True)
    """
    if not isinstance(schemes, Mapping):
        raise ValueError(f"weight_recv_schemes must be a dict of {{model_id: WeightSyncScheme}}, got "
                         f"{type(schemes).__name__}")
    unknown = sorted(set(schemes) - {"policy"})
    if unknown:
        raise ValueError(f"weight_recv_schemes receives the 'policy' model only, got keys {unknown}")
    for model_id, scheme in schemes.items():
        if not isinstance(scheme, WeightSyncScheme):
            raise ValueError(f"weight_recv_schemes[{model_id!r}] must be a torchrl.weight_update.WeightSyncScheme, "
                             f"got {type(scheme).__name__}")
        if not scheme.initialized_on_receiver:
            scheme.init_on_receiver(model_id=model_id, context=collector, worker_idx=collector.worker_idx)
        if model is not None:
            scheme.model = model
        if log:
            _log.info(f"OffPolicyCollector: receives the policy's weights through {type(scheme).__name__}; each "
                      "update is published to every worker through the shared-memory seqlock block")


#: Seconds a node whose collector failed waits for its driver's first weight send (see
#: :func:`joins_receivers_on_error`). ``DistributedSyncCollector``'s driver sends it as its iteration starts, once
#: it has collected the batch that lays its buffers out; a driver that never iterates lets the node go after this.
FIRST_SEND_WAIT_S = 120.0


def joins_receivers_on_error(init: Callable[..., None]) -> Callable[..., None]:
    """A collector's ``__init__`` that, when it raises on a node of ``DistributedSyncCollector``, leaves the driver
    an error to raise instead of a wait.

    TorchRL's collectors connect their receiving schemes (``weight_recv_schemes=``) early in their constructor, and a
    node whose collector fails later still answers the driver's first weight send; the node then exits and the
    driver's next receive raises (gloo: "Connection closed by peer"). This collector connects after its probe, which
    refuses an env or a policy it cannot run, so a node that failed there would leave the driver waiting: at its
    rendezvous, then for the node's acknowledgement. On such an error, each unconnected
    ``DistributedWeightSyncScheme`` is connected (the process group and the initial weights), answers the driver's
    first weight send (for up to :data:`FIRST_SEND_WAIT_S` seconds), and is shut down; then the constructor's error
    is raised, whatever the join gave. Other schemes, and a collector constructed without receiving schemes, are
    left alone: their senders do not wait for the node. A :class:`~torchrl_unilab.envs.specs.VaryingShapeError`
    passes untouched: ``OffPolicyCollector(...)`` then builds TorchRL's collector, which connects the receivers.

    Examples:
        >>> class Node:
        ...     @joins_receivers_on_error
        ...     def __init__(self, create_env_fn, policy=None, **torchrl_kwargs):
        ...         raise ValueError("the env refused the policy's action")
        >>> try:
        ...     Node(None, weight_recv_schemes=None)
        ... except ValueError as err:
        ...     print(err)
        the env refused the policy's action
    """
    signature = inspect.signature(init)

    @functools.wraps(init)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            init(self, *args, **kwargs)
        except VaryingShapeError:
            raise  # OffPolicyCollector(...) hands the env to TorchRL's collector, which connects the receivers itself
        except BaseException:
            given = signature.bind_partial(self, *args, **kwargs).arguments
            torchrl_kwargs = given.get("torchrl_kwargs") or {}
            schemes = torchrl_kwargs.get("weight_recv_schemes")
            if isinstance(schemes, Mapping):
                _answer_once_and_close(schemes, given.get("policy"), given.get("policy_factory"),
                                       torchrl_kwargs.get("worker_idx"))
            raise

    return wrapper


class _FailedNode:
    """What a failed node's receiving scheme calls back: it keeps no weights, and notes that the driver sent some."""

    def __init__(self, policy: nn.Module | None) -> None:
        self.policy = policy
        self.sent = threading.Event()

    def update_policy_weights_(self, *args: Any, **kwargs: Any) -> None:
        self.sent.set()


def _answer_once_and_close(schemes: Mapping[str, WeightSyncScheme], policy: Any,
                           policy_factory: Callable[[], Any] | None, worker_idx: int | None) -> None:
    """:func:`joins_receivers_on_error`'s join; a failing join is logged, not raised."""
    joining = [(model_id, scheme) for model_id, scheme in schemes.items()
               if isinstance(scheme, DistributedWeightSyncScheme) and not scheme.synchronized_on_receiver]
    if not joining:
        return
    _log.warning(f"OffPolicyCollector failed at construction on node {worker_idx}: it joins the driver's process "
                 "group and answers its first weight send before raising, so that the driver raises instead of "
                 "waiting for it")
    for model_id, scheme in joining:
        try:
            model = policy if isinstance(policy, nn.Module) or policy_factory is None else policy_factory()
            node = _FailedNode(model)
            if not scheme.initialized_on_receiver:
                scheme.init_on_receiver(model_id=model_id, context=node, worker_idx=worker_idx)
            else:
                scheme.context = node
            if model is not None:
                scheme.model = model
            scheme.connect(worker_idx=worker_idx)
            node.sent.wait(FIRST_SEND_WAIT_S)
        except Exception as err:  # the constructor's error is the one to raise
            _log.warning(f"OffPolicyCollector: joining {type(scheme).__name__} failed: {type(err).__name__}: {err}")
        finally:
            with contextlib.suppress(Exception):
                scheme.shutdown()  # waits for the background receiver, which acknowledges the send


class TorchRLSchemeAdapter(SeqlockWeightSyncScheme):
    """A TorchRL ``WeightSyncScheme``'s contract, kept on the seqlock block.

    Weights travel as with :class:`SeqlockWeightSyncScheme` (the writer never
    waits for a worker). What the wrapped scheme adds to that: buffers that the
    user registered with a ``SharedMemWeightSyncScheme`` (``params_map``) are
    updated in place with each publish, and a ``NoWeightSyncScheme`` sends
    nothing after the workers start.

    Args:
        scheme: the TorchRL scheme given to the collector; kept as :attr:`scheme`.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.weight_update import SharedMemWeightSyncScheme
        >>> policy = torch.nn.Linear(2, 1)
        >>> mirror = TensorDict.from_module(policy).clone().zero_()
        >>> given = SharedMemWeightSyncScheme()
        >>> given.shared_transport.register_weights({0: mirror}, {})  # what init_on_sender(params_map=...) does
        >>> scheme = TorchRLSchemeAdapter(given)
        >>> scheme.init_on_sender(model_id="policy", model=policy)
        >>> scheme.send(None)
        >>> torch.equal(given.shared_transport.unique_weights[0]["weight"], policy.weight.detach())
        True
        >>> scheme.shutdown()
    """

    def __init__(self, scheme: WeightSyncScheme) -> None:
        super().__init__()
        self.scheme = scheme
        self._syncs = not isinstance(scheme, NoWeightSyncScheme)

    @property
    def promise(self) -> str:
        """What this adapter keeps of the wrapped scheme's contract, in one sentence."""
        if not self._syncs:
            return "the workers act with the policy as it is when they start, and no weights are sent after that"
        mirrored = " and into the buffers registered with it" if self._mirrors() else ""
        return (f"its weights go through OffPolicyCollector's shared-memory seqlock block{mirrored}; "
                "update_policy_weights_() reaches every worker before its next step")

    def send(self, weights: Any = None, worker_ids: int | list[int] | None = None, *,
             new_version: bool = True) -> None:
        """Publishes as :meth:`SeqlockWeightSyncScheme.send`; under ``NoWeightSyncScheme``, only the start's weights."""
        if self._syncs or not new_version:
            super().send(weights, worker_ids, new_version=new_version)

    def _mirrors(self) -> list[TensorDictBase]:
        return shared_mem_buffers(self.scheme)

    def _published(self, state: dict[str, torch.Tensor]) -> None:
        for buffer in self._mirrors():
            flat = buffer.flatten_keys(".")
            names = list(flat.keys(include_nested=True, leaves_only=True))
            prefix = _prefix_of(list(state), names) if names else None
            if prefix is None:
                continue  # buffers for some other model: not ours to fill
            update = TensorDict({name: state[prefix + name].detach() for name in names}, []).unflatten_keys(".")
            buffer.update_(update.to(buffer.device) if buffer.device is not None else update)

    def shutdown(self) -> None:
        """Closes the block, then shuts the wrapped scheme down while threads can still start."""
        super().shutdown()
        scheme, self.scheme = getattr(self, "scheme", None), None
        if scheme is not None:
            try:
                scheme.shutdown()
            except Exception as err:  # noqa: BLE001 - the user's scheme must not fail the collector's shutdown
                _log.warning(f"OffPolicyCollector: {type(scheme).__name__}.shutdown() raised {err!r}")

    def __setstate__(self, state: dict) -> None:
        # Workers get the block only (SeqlockWeightSyncScheme.__getstate__); the user's scheme stays in the parent.
        super().__setstate__(state)
        self.scheme, self._syncs = None, True

