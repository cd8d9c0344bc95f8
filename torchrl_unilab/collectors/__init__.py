"""Collectors: :class:`OffPolicyCollector`, its worker processes, and its Ray scale-out.

Laid out like :mod:`torchrl.collectors`. The worker loop, process lifecycle,
frame accounting and batch hand-over are private modules of this package;
:mod:`~torchrl_unilab.collectors.metrics` and
:mod:`~torchrl_unilab.collectors.trace` are what a user reads from a run.

Example:
    >>> from torchrl_unilab.collectors import OffPolicyCollector, WorkerError
"""

from torchrl_unilab.collectors._processes import WorkerError
from torchrl_unilab.collectors.metrics import CollectorMetrics
from torchrl_unilab.collectors.offpolicy_collector import OffPolicyCollector
from torchrl_unilab.collectors.trace import PhaseTimer
