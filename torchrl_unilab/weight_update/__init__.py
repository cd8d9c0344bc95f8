"""Learner-to-worker weight sync through shared memory, its TorchRL ``WeightSyncScheme``, and the adapter that keeps
TorchRL's own schemes to their contract on it.

Laid out like :mod:`torchrl.weight_update`.

Example:
    >>> from torchrl_unilab.weight_update import SeqlockWeightSyncScheme, SharedWeights, as_seqlock_scheme
"""

from torchrl_unilab.weight_update.torchrl_schemes import TorchRLSchemeAdapter, as_seqlock_scheme
from torchrl_unilab.weight_update.weight_sync import SharedWeights, layout_of
from torchrl_unilab.weight_update.weight_sync_scheme import SeqlockWeightSyncScheme
