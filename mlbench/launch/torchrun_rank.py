"""A rank of a node under torchrun's static rendezvous (`--launcher torchrun`): claims its node rank, then trains.

The static rendezvous counts the nodes that connect, not which: a node started with another's --node-rank joined,
was given that node's global ranks, and its ranks hung in the process group's setup (or took part in the other
node's). Here each rank first claims its node rank in the rendezvous store (node 0's torchrun) for its node, by
the mark its supervisor gave it (torchrun.NODE_TOKEN). The first node's claim holds; the ranks of a node that came
second stop before the process group, saying why to their supervisor (a `stopped` event, as rank 0's would be).
Node 0's ranks claim only where the store is their own machine's: a second node 0 on another host meets the first
one's store, and would otherwise take node rank 0 from the node that serves the run's store. A rank whose claim
holds then shares, through the store, where node 0's supervisor hears which rank of another node failed first
(node_failures): the nodes may share no filesystem, and the store goes with node 0's ranks.

`python -m mlbench.launch.torchrun_rank PLAN.json`, as torchrun starts it; then `python -m mlbench.train PLAN.json`
in the same process (torch imported once)."""

from mlbench.launch import lifeline

lifeline.install_pdeathsig()  # first, as in mlbench.train: a rank never outlives its launcher, even while importing

import contextlib  # noqa: E402 - after the lifeline
import json  # noqa: E402
import os  # noqa: E402
import runpy  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Mapping  # noqa: E402
from datetime import timedelta  # noqa: E402
from pathlib import Path  # noqa: E402

from mlbench.launch import node_failures  # noqa: E402
from mlbench.launch.torchrun import NODE_TOKEN  # noqa: E402
from mlbench.run_plan import RunPlan  # noqa: E402

STOP_EXIT = 4  # this rank may not train: another node holds its node rank, or node 0 is gone
CLAIM_TIMEOUT_S = 30.0  # the store is up (torchrun has just met it), unless node 0 has ended since
LOCAL_TIMEOUT_S = 5.0  # node 0's own torchrun serves the store on this machine: it answers at once


def why_not(env: Mapping[str, str]) -> str:
    """Why this rank must stop ("" if it may train): another node claimed its node rank (GROUP_RANK) first, its
    node is a second node 0 whose rendezvous is another machine's, or the store is gone (node 0 ended before this
    node's ranks started). A rank that may train has shared where node 0 hears failures (_share_failures_port)."""
    from torch.distributed import DistError

    addr = f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
    node, mine, run = env["GROUP_RANK"], env[NODE_TOKEN], env["TORCHELASTIC_RUN_ID"]
    last = int(env["GROUP_WORLD_SIZE"]) - 1
    try:
        store = _store(env["MASTER_ADDR"], int(env["MASTER_PORT"]), CLAIM_TIMEOUT_S)
        if node == "0" and not _hosts_rendezvous(store, int(env["MASTER_PORT"]), f"mlbench/{run}/host/{mine}"):
            return (f"two nodes were started with --node-rank 0: the rendezvous at {addr} is another machine's, "
                    f"where node 0 runs (this node's torchrun started a store of its own that no node joins); this "
                    f"one stops. Start node 0 once, on the host --rdzv-endpoint names, and every other node with its "
                    f"own --node-rank, {'1' if last == 1 else f'1 to {last}'}")
        holder = store.compare_set(f"mlbench/{run}/node{node}", "", mine).decode()
    except DistError:
        return (f"node 0 ended before node {node}'s ranks started (its rendezvous at {addr} no longer answers); "
                f"see node 0's record")
    if holder == mine:
        _share_failures_port(store, env)
        return ""
    return (f"two nodes were started with --node-rank {node}: the other joined the rendezvous first and trains; "
            f"this one stops. Give every node its own --node-rank, 0 to {last}")


def _share_failures_port(store, env: Mapping[str, str]) -> None:
    """Where node 0's supervisor hears which rank of another node failed first (node_failures): node 0's ranks
    post its port in the store (nothing where it has none: no other node waits long); another node's first rank
    waits for it (node 0's ranks post it as they start: this node's could not train without them) and leaves it
    for its own supervisor. Best effort: a run whose port is not shared only names node 0's ranks."""
    from torch.distributed import DistError

    key = node_failures.key(env["TORCHELASTIC_RUN_ID"])
    with contextlib.suppress(DistError, OSError):
        if env["GROUP_RANK"] == "0":
            store.set(key, env.get(node_failures.PORT, ""))
        # the get waits for the key up to the store's timeout (CLAIM_TIMEOUT_S)
        elif env.get("LOCAL_RANK") == "0" and node_failures.FILE in env and (port := store.get(key).decode()):
            Path(env[node_failures.FILE]).write_text(port)


def _store(host: str, port: int, timeout_s: float):
    from torch.distributed import TCPStore

    return TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s), wait_for_workers=False)


def _hosts_rendezvous(store, port: int, key: str) -> bool:
    """Whether the rendezvous store the endpoint reaches (`store`) is this machine's own: node 0's torchrun serves
    its store on the endpoint's port on every address of its machine, whatever host the endpoint names, and talks
    to the store the endpoint reaches. A second node 0 on another host serves one nobody joins, and meets the
    first one's: a mark written through the endpoint is not found through this machine's own port. Where this
    machine's port does not answer (a torch that serves elsewhere), nothing is concluded."""
    from torch.distributed import DistError

    store.set(key, "1")
    try:
        return _store("localhost", port, LOCAL_TIMEOUT_S).check([key])
    except DistError:
        return True


def main() -> None:
    env = os.environ
    if NODE_TOKEN in env and (why := why_not(env)):
        print(f"error: {why}", file=sys.stderr, flush=True)
        if env.get("LOCAL_RANK") == "0":  # one line for the node's supervisor, which reads it as the reason
            with open(RunPlan.load(sys.argv[1]).events_path, "a") as f:
                f.write(json.dumps({"event": "stopped", "time": time.time(), "status": "aborted", "step": 0,
                                    "reason": why}) + "\n")
        sys.exit(STOP_EXIT)
    runpy.run_module("mlbench.train", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
