"""How long ``local_cwd`` takes to launch an app (``Runner.run`` of ``utils.echo``: the dry
run, the request on disk, the supervisor started and the replica running), with the
supervisor forked from the launcher vs started in a new interpreter, alternating in one
small single-threaded process (which is what may fork, see
``torchx/schedulers/local/launch.py``).

Usage: ``python benchmarks/bench_launch.py [PAIRS]`` (default 9); run it with the tree to
measure first on the path (``PYTHONPATH=$PWD``). Prints the medians in ms.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from typing import Dict, List


def main(pairs: int) -> None:
    os.environ["TORCHX_HOME"] = tempfile.mkdtemp()  # a script of its own: no library code
    from torchx.components.utils import echo
    from torchx.runner import get_runner
    from torchx.schedulers.local import launch

    may_fork = launch.can_fork
    if not may_fork():
        raise SystemExit("this process may not fork its supervisor (threads or too big)")
    times: Dict[str, List[float]] = {"fork": [], "exec": []}
    with get_runner() as runner:
        for i in range(2 * pairs):
            mode = "fork" if i % 2 else "exec"
            launch.can_fork = may_fork if mode == "fork" else (lambda: False)
            t0 = time.perf_counter()
            handle = runner.run(echo(msg="hi"), "local_cwd")
            times[mode].append(time.perf_counter() - t0)
            runner.wait(handle, wait_interval=0.05)
    for mode, ts in times.items():
        runs = " ".join(f"{t * 1000:.0f}" for t in ts)
        print(f"{mode}: median {statistics.median(ts) * 1000:.0f} ms ({runs})")
    print(f"load average: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 9)
