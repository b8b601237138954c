"""`schooner cluster up | status | kill-node | down`: a multi-node Ray cluster on this machine.

    schooner cluster up --local-nodes 3 [--cpus 1] [--head-cpus 0] [--node NAME:CPUS:RESOURCES_JSON ...]
                        [--state-dir D]
    schooner cluster status [--state-dir D]
    schooner cluster kill-node NAME [--state-dir D]     # SIGKILL one node, like a preempted host
    schooner cluster down [--state-dir D]

`up --local-nodes N` starts a head node named `head` and N worker nodes `node-0` ... `node-{N-1}`. The head
holds the cluster's state (Ray's GCS) and every driver's connection: killing it ends the cluster and the
drivers with it, which no real preemption does. So by default it offers no CPUs and runs no steps: steps
land on the worker nodes, and killing one of them is a preempted host (`--head-cpus C` lets the head run
steps too). `kill-node` of the head says what it does.

`up` prints the environment a driver needs (`RAY_ADDRESS`, the auth token path); with it exported,
`schooner run EXP.py --cluster ray --shared-prefix` runs on the cluster (every node of a local cluster sees
this machine's disk).
"""

from __future__ import annotations

import argparse
import json
import shlex

from rich.markup import escape

from schooner.cluster._local_ray import DEFAULT_STATE_DIR, LocalNode, LocalRayCluster


def add_cluster_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "cluster", help="start, inspect, break or stop a multi-node Ray cluster on this machine"
    )
    cmds = p.add_subparsers(dest="cluster_command", required=True)
    up = cmds.add_parser("up", help="start a head and worker nodes, each its own raylet")
    up.add_argument(
        "--local-nodes",
        type=int,
        default=None,
        metavar="N",
        help="N worker nodes of --cpus CPUs each, after a head node (named 'head' unless --node gives one)",
    )
    up.add_argument("--cpus", type=float, default=1.0, help="CPUs of each node started by --local-nodes")
    up.add_argument(
        "--head-cpus",
        type=float,
        default=0.0,
        help="CPUs the head started by --local-nodes offers to steps (default 0: steps run on worker nodes "
        "only, so killing one is a preemption and never takes the cluster and its drivers down)",
    )
    up.add_argument(
        "--node",
        action="append",
        default=[],
        metavar="NAME:CPUS[:RESOURCES]",
        help='a node of its own, e.g. \'tpu-host:1:{"TPU-v5p-8-head": 1, "TPU": 4}\' (repeatable; the first '
        "node given is the head)",
    )
    for name in ("up", "status", "kill-node", "down"):
        target = up if name == "up" else cmds.add_parser(name, help=_HELP[name])
        if name == "kill-node":
            target.add_argument("name", help="the node to kill")
        target.add_argument(
            "--state-dir", default=DEFAULT_STATE_DIR, help="where the cluster's state is kept"
        )


_HELP = {
    "status": "the local cluster's address and its nodes",
    "kill-node": "SIGKILL every process of one node (a preempted host)",
    "down": "stop every node of the local cluster",
}


def parse_node(text: str) -> LocalNode:
    """`NAME:CPUS[:RESOURCES_JSON]` -> LocalNode (the error names the text and the expected form)."""
    name, _, rest = text.partition(":")
    cpus, _, res = rest.partition(":")
    try:
        resources = json.loads(res) if res else {}
        return LocalNode(name, float(cpus or 1), resources)
    except (ValueError, TypeError) as e:
        raise ValueError(
            f"--node {text!r}: expected NAME:CPUS[:RESOURCES_JSON], e.g. 'tpu:1:{{\"TPU-v5p-8-head\": 1}}' ({e})"
        ) from None


def cmd_cluster(ns: argparse.Namespace, console: object) -> int:
    print_ = console.print  # type: ignore[attr-defined]
    if ns.cluster_command == "up":
        try:
            nodes = [parse_node(t) for t in ns.node]
        except ValueError as e:
            print_(f"[bold red]error:[/] {e}")
            return 2
        if ns.local_nodes:
            if not nodes:
                nodes = [LocalNode("head", ns.head_cpus)]
            nodes += [LocalNode(f"node-{i}", ns.cpus) for i in range(ns.local_nodes)]
        if not nodes:
            print_("[bold red]error:[/] give --local-nodes N or --node NAME:CPUS[:RESOURCES]")
            return 2
        try:
            LocalRayCluster.load(ns.state_dir)
            print_(
                f"[bold red]error:[/] a local cluster is already up ({ns.state_dir}); `schooner cluster down`"
            )
            return 2
        except FileNotFoundError:
            pass
        try:
            cluster = LocalRayCluster(nodes, state_dir=ns.state_dir).start()
        except (
            RuntimeError,
            TimeoutError,
        ) as e:  # `ray start` failed or kept timing out: the reason, the fix
            print_(f"[bold red]error:[/] {escape(str(e))}")
            return 1
        print_(f"local Ray cluster up at {cluster.address}: {', '.join(n.name for n in cluster.nodes)}")
        head = cluster.nodes[0]
        if not head.cpus and not head.resources:
            print_(f"the head ({head.name}) runs no steps: they land on the worker nodes")
        print_("for drivers:")
        for k, v in cluster.env().items():
            print(f"export {k}={shlex.quote(v)}")
        return 0
    try:
        cluster = LocalRayCluster.load(ns.state_dir)
    except FileNotFoundError as e:
        print_(f"[bold red]error:[/] {e}")
        return 2
    if ns.cluster_command == "status":
        print_(f"local Ray cluster at {cluster.address} (state in {ns.state_dir})")
        alive = cluster.alive()
        for i, n in enumerate(cluster.nodes):
            res = f" {json.dumps(dict(n.resources))}" if n.resources else ""
            role = (
                " (head" + (", runs no steps)" if not n.cpus and not n.resources else ")") if i == 0 else ""
            )
            print_(f"  {n.name}: {'up' if alive[n.name] else 'DOWN'}, {n.cpus:g} CPU{res}{role}")
        return 0
    if ns.cluster_command == "kill-node":
        try:
            cluster.kill_node(ns.name)
        except KeyError as e:
            print_(f"[bold red]error:[/] {e.args[0]}")
            return 2
        print_(f"killed node {ns.name} (SIGKILL to all its processes)")
        if ns.name == cluster.nodes[0].name:
            workers = ", ".join(n.name for n in cluster.nodes[1:]) or "none"
            print_(
                f"[yellow]note:[/] {ns.name} is the head: it held the cluster's state and every driver's "
                "connection, so the cluster is gone and its drivers fail (no retry survives that). To simulate "
                f"a preempted host, kill a worker node instead ({workers}); `schooner cluster down` cleans up."
            )
        return 0
    cluster.stop()
    print_("local Ray cluster stopped")
    return 0
