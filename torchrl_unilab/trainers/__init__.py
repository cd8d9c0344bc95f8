"""Learner support for the recipes: update steps, UTD pacing, checkpoints and logging.

Laid out like :mod:`torchrl.trainers`.

Example:
    >>> from torchrl_unilab.trainers.checkpoint import Checkpointer
"""
