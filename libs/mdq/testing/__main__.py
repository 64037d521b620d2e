"""``python -m mdq.testing``: run a simulated Kubernetes cluster until Ctrl-C.

Prints the kubeconfig path; then ``MDQ_K8S_KUBECONFIG=<path> mdq up --backend kubernetes``
(or ``mdq up --backend kubernetes --kubeconfig <path>``) runs mdq's services against it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from pathlib import Path

from mdq.testing.cluster import SimulatedCluster


async def serve(arguments: argparse.Namespace, work_dir: Path) -> None:
    cluster = SimulatedCluster(
        work_dir=work_dir,
        nodes=[f"{arguments.prefix}-{index}" for index in range(1, arguments.nodes + 1)],
        cpu_per_node=arguments.cpu,
        memory_mb_per_node=arguments.memory_mb,
        namespace=arguments.namespace,
        port=arguments.port,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with cluster:
        print(f"Kubernetes API emulator on {cluster.api.url}", flush=True)
        print(f"kubeconfig: {cluster.kubeconfig}", flush=True)
        await stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", default=".mdq/k8s", help="kubeconfig and pod logs go here")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--prefix", default="node")
    parser.add_argument("--cpu", type=float, default=2.0, help="cores per node")
    parser.add_argument("--memory-mb", type=int, default=4096, help="memory per node, MiB")
    parser.add_argument("--namespace", default="mdq", help="namespace of the kubeconfig")
    parser.add_argument("--port", type=int, default=0, help="0: any free port")
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    arguments = parser.parse_args()
    asyncio.run(serve(arguments, Path(arguments.dir).resolve()))


if __name__ == "__main__":
    main()
