"""The EnvPool task families the engine runs, and how each family's observation becomes TorchRL keys.

EnvPool 1.2.5 registers its MuJoCo tasks in families, one Python module each
(``envpool.registration.registry.specs[id][0]``):

* ``envpool.mujoco.gym``: gymnasium's MuJoCo tasks (``HalfCheetah-v5``, ...); one flat
  ``obs`` array, the observation gymnasium returns.
* ``envpool.mujoco.playground``: C++ ports of MuJoCo Playground's robot tasks
  (``Go1JoystickFlatTerrain-v1``, ...). The locomotion and hand tasks observe a dict,
  ``state`` for the actor and ``privileged_state`` for the critic (Playground's
  asymmetric actor-critic layout); the manipulation tasks (``PandaPickCube-v1``, ...)
  observe ``state`` only.
* ``envpool.mujoco.dmc``: C++ ports of the DeepMind Control Suite (``CheetahRun-v1``, ...),
  whose observation is a dict of named parts (``position``, ``velocity``, ...).

:data:`FAMILIES` is the one table the engine (:class:`~torchrl_unilab.EnvPoolEnv`) reads:
which EnvPool entry goes to which TorchRL key. A Control Suite observation is flattened
into ``"observation"`` in the suite's own order: the order of the ``OrderedDict`` each
task's ``get_observation`` builds in ``dm_control/suite/<domain>.py``, which is also the
order of ``dm_control``'s ``flat_observation=True``. EnvPool declares, for some domains,
the union of the entries of all the domain's tasks and leaves the entries a task does not
have at zero (``HumanoidRun-v1`` carries ``position``, which only ``run_pure_state``
observes), and orders ``FishSwim-v1``'s ``target`` last; :data:`DM_CONTROL_TASK_KEYS` lists
those tasks with the suite's own entries, read from dm_control 1.0.50's
``suite/{finger,fish,humanoid,quadruped,dog}.py``. :func:`observation_layout` gives each
part's slice.

Termination and time limits, per family (``docs/guide/robot_tasks.rst`` lists them with the
sources): every family ends an episode at ``max_episode_steps`` (EnvPool's registered limit:
1,000 steps for the Control Suite, 150 to 3,000 for Playground), reported as ``truncated``;
``terminated`` is EnvPool's own ``done`` without its ``trunc`` (gymnasium's health checks,
Playground's fall and NaN checks, the Control Suite's ``get_termination``, which only ``lqr``
defines).

Examples:
    >>> layout = observation_layout("Go1JoystickFlatTerrain-v1")
    >>> layout.family, layout.dims
    ('playground', {'observation': 48, 'privileged': 123})
    >>> observation_layout("CheetahRun-v1").slices()
    {'position': slice(0, 8, None), 'velocity': slice(8, 17, None)}
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping

try:
    import envpool
    from envpool.registration import registry as _registry
except ImportError:  # pragma: no cover - envpool is a dependency
    envpool = None

__all__ = ["DM_CONTROL_TASK_KEYS", "FAMILIES", "ObservationLayout", "TaskFamily", "family_ids",
           "observation_layout", "task_family"]


@dataclasses.dataclass(frozen=True)
class TaskFamily:
    """One EnvPool task family: where it is registered and how its observation maps to TorchRL keys.

    Attributes:
        name: short name (``"gymnasium"``, ``"playground"``, ``"dm_control"``).
        module: EnvPool's registration module of the family's ids.
        keys: EnvPool observation entry -> TorchRL key; ``None``: every entry, concatenated
            into ``"observation"`` in the suite's order.
        gymnasium_fallback: whether gymnasium runs the same ids (``engine="auto"`` may fall back to it).
        suite: the original suite, for messages and docs.

    Examples:
        >>> task_family("HalfCheetah-v5").gymnasium_fallback
        True
    """

    name: str
    module: str
    keys: Mapping[str, str] | None
    gymnasium_fallback: bool
    suite: str


#: The families the engine runs, keyed by EnvPool registration module.
FAMILIES: dict[str, TaskFamily] = {
    family.module: family
    for family in (
        TaskFamily("gymnasium", "envpool.mujoco.gym", {"obs": "observation"}, True, "gymnasium MuJoCo"),
        TaskFamily("playground", "envpool.mujoco.playground",
                   {"state": "observation", "privileged_state": "privileged"}, False, "MuJoCo Playground"),
        TaskFamily("dm_control", "envpool.mujoco.dmc", None, False, "DeepMind Control Suite"),
    )
}

_HUMANOID = ("joint_angles", "head_height", "extremities", "torso_vertical", "com_velocity", "velocity")
_QUADRUPED = ("egocentric_state", "torso_velocity", "torso_upright", "imu", "force_torque")
_DOG = ("joint_angles", "joint_velocites", "torso_pelvis_height", "z_projection", "torso_com_velocity",
        "inertial_sensors", "foot_forces", "touch_sensors", "actuator_state")

#: Control Suite tasks whose EnvPool observation differs from the suite task's own: the suite's entries,
#: in its order. Every other Control Suite id observes EnvPool's entries as they are.
DM_CONTROL_TASK_KEYS: dict[str, tuple[str, ...]] = {
    "FingerSpin-v1": ("position", "velocity", "touch"),
    "FishUpright-v1": ("joint_angles", "upright", "velocity"),
    "FishSwim-v1": ("joint_angles", "upright", "target", "velocity"),
    "HumanoidRun-v1": _HUMANOID,
    "HumanoidWalk-v1": _HUMANOID,
    "HumanoidStand-v1": _HUMANOID,
    "HumanoidRunPureState-v1": ("position", "velocity"),
    "QuadrupedWalk-v1": _QUADRUPED,
    "QuadrupedRun-v1": _QUADRUPED,
    "QuadrupedEscape-v1": (*_QUADRUPED, "origin", "rangefinder"),
    "QuadrupedFetch-v1": (*_QUADRUPED, "ball_state", "target_position"),
    "DogStand-v1": _DOG,
    "DogWalk-v1": _DOG,
    "DogTrot-v1": _DOG,
    "DogRun-v1": _DOG,
}


@dataclasses.dataclass(frozen=True)
class ObservationLayout:
    """Where each EnvPool observation entry of one task goes.

    Attributes:
        env_id: the EnvPool id.
        family: the family's short name.
        parts: ``(TorchRL key, EnvPool entry, width)`` in output order; the entries of one key
            are concatenated in this order.

    Examples:
        >>> layout = observation_layout("WalkerWalk-v1")
        >>> layout.keys, layout.dims
        (('observation',), {'observation': 24})
        >>> layout.slices()["height"]
        slice(14, 15, None)
    """

    env_id: str
    family: str
    parts: tuple[tuple[str, str, int], ...]

    @property
    def keys(self) -> tuple[str, ...]:
        """The TorchRL keys written, ``"observation"`` first."""
        return tuple(dict.fromkeys(key for key, _, _ in self.parts))

    @property
    def dims(self) -> dict[str, int]:
        """Width of each TorchRL key."""
        return {key: sum(w for k, _, w in self.parts if k == key) for key in self.keys}

    def slices(self, key: str = "observation") -> dict[str, slice]:
        """Each EnvPool entry's columns within ``key`` (the Control Suite's parts of ``"observation"``)."""
        if key not in self.keys:
            raise KeyError(f"{self.env_id} writes {list(self.keys)}, not {key!r}")
        out, start = {}, 0
        for k, entry, width in self.parts:
            if k == key:
                out[entry] = slice(start, start + width)
                start += width
        return out


@functools.cache
def _canonical_ids() -> dict[str, str]:
    """Every id (aliases too) of a family in :data:`FAMILIES` -> its registration module."""
    if envpool is None:
        return {}
    registered = set(envpool.list_all_envs())
    return {env_id: spec[0] for env_id, spec in _registry.specs.items()
            if spec[0] in FAMILIES and env_id in registered}


def task_family(env_id: str) -> TaskFamily | None:
    """The family of an EnvPool id, or ``None`` when ``env_id`` is not one of :data:`FAMILIES`.

    Examples:
        >>> task_family("CheetahRun-v1").name, task_family("MuJoCoPlayground/Go1Getup-v1").name
        ('dm_control', 'playground')
        >>> task_family("Pendulum-v1") is None
        True
    """
    module = _canonical_ids().get(env_id)
    return None if module is None else FAMILIES[module]


def family_ids() -> frozenset[str]:
    """Every id of the families in :data:`FAMILIES` that EnvPool registers (aliases included).

    Examples:
        >>> {"HalfCheetah-v5", "Go1JoystickFlatTerrain-v1", "CheetahRun-v1"} <= family_ids()
        True
    """
    return frozenset(_canonical_ids())


@functools.cache
def observation_layout(env_id: str) -> ObservationLayout:
    """The :class:`ObservationLayout` of ``env_id``, read from EnvPool's spec and :data:`FAMILIES`.

    Raises ``ValueError`` for an id outside :data:`FAMILIES`, and ``RuntimeError`` when EnvPool's
    spec holds an entry the table does not place (an EnvPool version this package does not know).

    Examples:
        >>> observation_layout("HalfCheetah-v5").parts
        (('observation', 'obs', 17),)
        >>> observation_layout("PandaPickCube-v1").dims
        {'observation': 66}
    """
    family = task_family(env_id)
    if family is None:
        raise ValueError(f"{env_id!r} is not an id of EnvPool's {sorted(f.suite for f in FAMILIES.values())} "
                         "families (see torchrl_unilab.envs.task_families.family_ids())")
    arrays = envpool.make_spec(env_id).state_array_spec
    widths = {name.removeprefix("obs:"): math.prod(spec.shape) for name, spec in arrays.items()
              if name == "obs" or name.startswith("obs:")}
    if family.keys is None:
        order = DM_CONTROL_TASK_KEYS.get(env_id, tuple(widths))
        parts = tuple(("observation", entry, widths[entry]) for entry in order)
    else:
        unknown = sorted(set(widths) - set(family.keys))
        if unknown:
            raise RuntimeError(f"EnvPool's {env_id} observes {unknown}, which the {family.name} layout does not "
                               f"place (known: {sorted(family.keys)}); this envpool version is not supported")
        # "observation" first, whatever EnvPool's order
        parts = tuple(sorted(((family.keys[e], e, w) for e, w in widths.items()),
                             key=lambda part: part[0] != "observation"))
    return ObservationLayout(env_id, family.name, parts)
