"""The ``compile`` section of the recipes: ``torch.compile`` and CUDA graphs around the update step.

It follows TorchRL's sota scripts (``sota-implementations/sac/sac.py``) and
LeanRL (torch.compile plus CUDA graphs for the whole update: CleanRL's SAC went
from 127 to 725 updates/s on an H100 in LeanRL's figures):

* ``compile.compile=true`` compiles the update with
  :func:`torchrl.compile_with_warmup` on a GPU (the first call runs
  eagerly). A ``compile.compile_mode`` of ``null`` becomes ``"default"`` when
  CUDA graphs wrap the update and ``"reduce-overhead"`` (inductor's own CUDA
  graphs) otherwise, as TorchRL does. On the CPU the update is compiled with
  ``compile.compile_mode`` as given, as before: it is no faster there than the
  tensor-level loss, so the CPU default stays ``compile.compile=false``.
* ``compile.cudagraphs=true`` on CUDA wraps the (compiled or eager) update in
  tensordict's :class:`~tensordict.nn.CudaGraphModule`: after ``warmup`` eager
  calls on a side stream, each update is the replay of one captured graph.
  On the CPU there are no CUDA graphs: the setting is ignored with a warning.

A captured graph replays the Python it saw once: an update with a branch
(TD3's and CrossQ's delayed actor step) needs one graph per branch:
:func:`compile_delayed_update` compiles each variant on its own.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDict
from tensordict.nn import CudaGraphModule
from torchrl import compile_with_warmup

__all__ = ["compile_delayed_update", "compile_update"]

#: Eager calls before CUDA graphs capture the update (TorchRL's sota scripts use 5).
CUDAGRAPH_WARMUP = 5


def compile_update(update: Callable[..., Any], compile_cfg: Any, device: torch.device | str) -> Callable[..., Any]:
    """``update`` compiled as the ``compile`` section asks for the learner's ``device``.

    Args:
        update: ``update(batch) -> {name: tensor}`` (or ``None``), one gradient
            step on a TensorDict batch, returning detached tensors.
        compile_cfg: the recipe's ``compile`` section, or any mapping with
            its keys (``compile``, ``compile_mode``, ``cudagraphs``; missing
            keys count as off).
        device: the learner's device.

    Returns:
        A callable with ``update``'s signature. Under CUDA graphs it returns a
        TensorDict with the same entries, copied out of the graph's buffers;
        in inductor's ``"reduce-overhead"`` mode, copies too, since the next
        replay overwrites its outputs.

    Examples:
        >>> import torch
        >>> step = lambda batch: {"loss": batch["x"].sum()}
        >>> compile_update(step, {"compile": False, "cudagraphs": False}, "cpu") is step
        True
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     same = compile_update(step, {"compile": False, "cudagraphs": True}, "cpu") is step
        >>> same, str(caught[0].message)
        (True, 'compile.cudagraphs=true is ignored on network.device=cpu: CUDA graphs need a CUDA device')
    """
    device = torch.device(device)
    compile_on, mode = bool(compile_cfg.get("compile", False)), compile_cfg.get("compile_mode")
    cudagraphs = bool(compile_cfg.get("cudagraphs", False))
    if device.type != "cuda":
        if cudagraphs:
            warnings.warn(f"compile.cudagraphs=true is ignored on network.device={device.type}: CUDA graphs need a "
                          "CUDA device", UserWarning, stacklevel=2)
        # As the recipes always did on the CPU: torch.compile with the mode given.
        return torch.compile(update, mode=mode) if compile_on else update
    if compile_on:
        if mode in (None, ""):
            mode = "default" if cudagraphs else "reduce-overhead"
        compiled = compile_with_warmup(update, mode=mode, warmup=1)
        update = _marking_steps(compiled) if mode == "reduce-overhead" else compiled
    if cudagraphs:
        # CudaGraphModule hands out TensorDicts (it copies the outputs of each replay out of the graph's pool).
        update = CudaGraphModule(_returning_tensordict(update), in_keys=[], out_keys=[], warmup=CUDAGRAPH_WARMUP,
                                 device=device)
    return update


def compile_delayed_update(update: Callable[..., Any], compile_cfg: Any,
                           device: torch.device | str) -> dict[bool, Callable[..., Any]]:
    """``{update_actor: update(batch)}``: ``update(batch, update_actor)`` compiled by :func:`compile_update` once per
    value of ``update_actor``, for the recipes whose actor steps every ``optim.policy_update_delay``-th update.

    One compiled callable per branch: a CUDA graph replays only the branch it captured.

    Examples:
        >>> step = lambda batch, update_actor: {"actor": torch.tensor(float(update_actor))}
        >>> updates = compile_delayed_update(step, {"compile": False}, "cpu")
        >>> updates[False](None)["actor"].item(), updates[True](None)["actor"].item()
        (0.0, 1.0)
    """
    return {flag: compile_update(functools.partial(update, update_actor=flag), compile_cfg, device)
            for flag in (False, True)}


def _returning_tensordict(update: Callable[..., Any]) -> Callable[..., TensorDict | None]:
    @functools.wraps(update)
    def wrapped(*args: Any, **kwargs: Any) -> TensorDict | None:
        out = update(*args, **kwargs)
        return out if out is None or isinstance(out, TensorDict) else TensorDict(dict(out))
    return wrapped


def _marking_steps(update: Callable[..., Any]) -> Callable[..., Any]:
    """Inductor's CUDA graphs (``"reduce-overhead"``): one step per call, outputs copied before the next replay."""
    @functools.wraps(update)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        torch.compiler.cudagraph_mark_step_begin()
        out = update(*args, **kwargs)
        return None if out is None else {key: value.clone() for key, value in out.items()}
    return wrapped
