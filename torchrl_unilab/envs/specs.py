"""Whether an env's entries have one shape for every step and sub-env, as rows of fixed-shape tensors need.

A spec dimension of ``-1`` marks an entry whose size varies: sub-envs whose entries differ in shape (TorchRL
stacks them lazily) or an entry that grows from step to step. Shared-memory rows are laid out once, before any
worker starts, so they cannot hold such an entry; TorchRL's collectors pickle each batch instead.
"""

from __future__ import annotations

from torchrl.envs import EnvBase

__all__ = ["VaryingShapeError", "varying_shape_keys"]


def varying_shape_keys(env: EnvBase) -> list[str]:
    """The keys of ``env``'s specs with a dimension of varying size (``-1``), sorted.

    Examples:
        >>> from torchrl.testing.mocking_classes import EnvWithDynamicSpec
        >>> from torchrl.envs import GymEnv
        >>> varying_shape_keys(EnvWithDynamicSpec()), varying_shape_keys(GymEnv("Pendulum-v1"))
        (['observation'], [])
    """
    specs = (env.full_observation_spec, env.full_action_spec, env.full_reward_spec, env.full_done_spec,
             env.full_state_spec)
    return sorted({str(key) for spec in specs for key in spec.keys(True, True) if -1 in spec[key].shape})


class VaryingShapeError(ValueError):
    """An env's entries vary in shape, so fixed-shape rows cannot hold them; ``keys`` names them.

    Examples:
        >>> err = VaryingShapeError(["observation"])
        >>> err.keys, "varying size (-1) at ['observation']" in str(err)
        (['observation'], True)
    """

    def __init__(self, keys: list[str]) -> None:
        super().__init__(
            f"the env's specs have dimensions of varying size (-1) at {keys}: heterogeneous (lazy-stacked) or "
            "dynamic-shaped entries. Rows of fixed-shape shared tensors cannot hold them: pad these entries to a "
            "fixed shape, or collect with TorchRL's MultiAsyncCollector, which pickles each batch "
            "(OffPolicyCollector(...) itself returns one for such an env)"
        )
        self.keys = keys
