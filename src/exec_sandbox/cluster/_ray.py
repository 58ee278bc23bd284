"""The only module that imports Ray: a typed boundary (Ray's own annotations are partial and
change between releases, so nothing else of this package sees its types).

Ray is an optional dependency (`pip install 'exec-sandbox[ray]'`); importing this module
without it raises VmConfigError naming the extra."""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator
from typing import Any

from ..errors import VmConfigError

try:
    _ray: Any = importlib.import_module("ray")
    _exceptions: Any = importlib.import_module("ray.exceptions")
    _strategies: Any = importlib.import_module("ray.util.scheduling_strategies")
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise VmConfigError("exec_sandbox.cluster needs Ray: pip install 'exec-sandbox[ray]'") from exc

# Every failure of Ray itself (a dead or unschedulable actor, a lost node or object); errors of
# the host's own code never take this form: the host returns them as values (host.py).
RayError: type[Exception] = _exceptions.RayError
Handle = Any  # an ActorHandle
Ref = Any  # an ObjectRef


def is_initialized() -> bool:
    return bool(_ray.is_initialized())


def init(address: str | None, namespace: str) -> None:
    _ray.init(address=address, namespace=namespace, log_to_driver=False, ignore_reinit_error=True)


def shutdown() -> None:
    _ray.shutdown()


def alive_nodes(resource: str) -> list[str]:
    """Ids of the live nodes that advertise `resource`, sorted."""
    return sorted(
        node["NodeID"]
        for node in _ray.nodes()
        if node.get("Alive") and node.get("Resources", {}).get(resource, 0) >= 1
    )


def host_actor(
    cls: type, name: str, namespace: str, node_id: str, resource: str, *args: Any
) -> Handle:
    """The named, detached async actor of cls on node_id, created if it does not exist yet.

    It needs one unit of `resource` (a node advertising 1 holds exactly one host) and is pinned
    to its node (soft=False: if the node dies, the actor dies with it, and calls to it fail at
    once instead of waiting for a node that will not return). A process crash restarts it on
    its node, empty (max_restarts); no call is retried by Ray (max_task_retries=0): an exec is
    not idempotent."""
    remote = _ray.remote(cls)
    return remote.options(
        name=name,
        namespace=namespace,
        lifetime="detached",
        get_if_exists=True,
        num_cpus=0,
        resources={resource: 1},
        max_restarts=-1,
        max_task_retries=0,
        max_concurrency=1000,
        scheduling_strategy=_strategies.NodeAffinitySchedulingStrategy(node_id, soft=False),
    ).remote(*args)


def get_actor(name: str, namespace: str) -> Handle | None:
    try:
        return _ray.get_actor(name, namespace=namespace)
    except ValueError:
        return None


def kill(handle: Handle) -> None:
    _ray.kill(handle, no_restart=True)


def call(handle: Handle, method: str, *args: Any) -> Ref:
    """Submit handle.method(*args); await the returned ref for its value."""
    return getattr(handle, method).remote(*args)


async def stream(handle: Handle, method: str, *args: Any) -> AsyncIterator[Any]:
    """The items an async-generator method yields, as they come (Ray's streaming generator)."""
    generator = getattr(handle, method).options(num_returns="streaming").remote(*args)
    async for ref in generator:
        yield await ref


def put(value: Any) -> Ref:
    """Into the object store: large payloads travel as a reference, not inside a call."""
    return _ray.put(value)


def node_id() -> str:
    """The node the calling worker runs on."""
    return str(_ray.get_runtime_context().get_node_id())
