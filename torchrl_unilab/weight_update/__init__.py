"""Learner-to-worker weight sync through shared memory, and its TorchRL ``WeightSyncScheme``.

Laid out like :mod:`torchrl.weight_update`.

Example:
    >>> from torchrl_unilab.weight_update import SeqlockWeightSyncScheme, SharedWeights
"""

from torchrl_unilab.weight_update.weight_sync import SharedWeights, layout_of
from torchrl_unilab.weight_update.weight_sync_scheme import SeqlockWeightSyncScheme
