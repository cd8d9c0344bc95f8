"""Where a results file's figures come from: the keys every ``--out`` file of ``benchmarks/`` starts with.

Example (a script in ``benchmarks/`` imports it as ``from provenance import provenance``)::

    >>> sorted(provenance("sampling", load_start=0.5, load_end=1.2))
    ['benchmark', 'command', 'date', 'machine', 'torch']
"""

from __future__ import annotations

import os
import platform
import shlex
import sys
import time


def provenance(benchmark: str, load_start: float | None = None, load_end: float | None = None,
               note: str | None = None, argv: list[str] | None = None) -> dict:
    """``benchmark``, today's ``date``, the ``command`` that ran (``python benchmarks/<benchmark>.py`` with
    ``argv``, by default this process's arguments), the ``machine`` with the load average at the start and end
    where given and then ``note`` (how the runs shared it), and ``torch``.

    Example::

        >>> provenance("faults", load_start=0.31, load_end=1.02)["machine"].endswith(
        ...     "load average 0.31 at the start, 1.02 at the end")
        True
    """
    import torch  # here, so that a script's --help need not load torch

    loads = [f"{load} at the {when}" for load, when in ((load_start, "start"), (load_end, "end")) if load is not None]
    machine = "; ".join([f"{os.cpu_count()}-core {platform.machine()} CPU",
                         *([f"load average {', '.join(loads)}"] if loads else []), *([note] if note else [])])
    return {"benchmark": benchmark, "date": time.strftime("%Y-%m-%d"),  # quoted as a shell would need it
            "command": " ".join([f"python benchmarks/{benchmark}.py",
                                 shlex.join(sys.argv[1:] if argv is None else argv)]).rstrip(),
            "machine": machine, "torch": torch.__version__}
