"""Batch post-processing before the buffer, as :mod:`torchrl.data.postprocs`: n-step returns that end where
their window ends.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from torchrl.data.postprocs import MultiStep

__all__ = ["MultiStepWithDone"]


class MultiStepWithDone(MultiStep):
    """TorchRL's :class:`~torchrl.data.postprocs.MultiStep`, with the done flags of each window's last step.

    ``MultiStep(gamma, n_steps)`` turns each row of a ``[envs, steps]`` batch into an n-step transition: the
    discounted sum of up to ``n_steps`` rewards in ``("next", "reward")``, the observation after the window's
    last step in ``"next"``, and ``"steps_to_next_obs"`` (TorchRL's value estimators bootstrap with
    ``gamma ** steps_to_next_obs``). A window stops at the first done step and at the end of the batch. TorchRL
    0.14 gathers every ``"next"`` entry at the window's last step *except* the done keys, which stay those of
    the row's own step: a window that reaches a termination then holds the terminal observation with
    ``("next", "terminated")`` false, and its target bootstraps from a state that has no future. This class
    gathers ``("next", "done" | "terminated" | "truncated")`` at the window's last step too, so each row is the
    transition from its state to the window's end (with ``n_steps=1``, the rows as they were).

    Args:
        gamma: the discount factor, as the loss's.
        n_steps: rewards summed per transition (1: none).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> steps = 4  # one env; the episode terminates at step 1
        >>> batch = TensorDict({"observation": torch.arange(4.0).unsqueeze(-1), "next": {
        ...     "observation": torch.arange(1.0, 5.0).unsqueeze(-1), "reward": torch.ones(steps, 1),
        ...     "terminated": torch.tensor([[False], [True], [False], [False]]),
        ...     "truncated": torch.zeros(steps, 1, dtype=torch.bool),
        ...     "done": torch.tensor([[False], [True], [False], [False]])}}, [steps]).unsqueeze(0)
        >>> out = MultiStepWithDone(gamma=0.5, n_steps=3)(batch)[0]
        >>> out["next", "reward"].squeeze(-1).tolist(), out["steps_to_next_obs"].tolist()
        ([1.5, 1.0, 1.5, 1.0], [2, 1, 2, 1])
        >>> out["next", "terminated"].squeeze(-1).tolist()  # step 0's window ends on the termination
        [True, True, False, False]
    """

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        out = super().forward(tensordict)
        steps = out.get("steps_to_next_obs")
        if steps.shape != out.batch_size:  # MultiStep's own layout for other shapes: left as TorchRL gives it
            return out
        # the window's last step, as MultiStep gathers the other "next" entries
        last = torch.arange(steps.shape[-1], device=steps.device).expand_as(steps) + steps - 1
        keys = [key for key in self.done_keys if ("next", key) in tensordict.keys(True)]
        out.get("next").update(tensordict.get("next").select(*keys).gather(-1, last))
        return out
