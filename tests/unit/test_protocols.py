"""Every scheduler (local, cluster, remote) satisfies `SandboxScheduler` and every session
`SandboxSession`. The functions
below are checked by mypy (`make lint` type-checks this file with the package under --strict),
so a signature that drifts on either side fails there; the test checks the schedulers' members
at run time too."""

from __future__ import annotations

from exec_sandbox import Scheduler, SchedulerConfig, Session
from exec_sandbox.cluster import ClusterScheduler, ClusterSession
from exec_sandbox.protocols import SandboxScheduler, SandboxSession
from exec_sandbox.remote import RemoteScheduler, RemoteSession


def schedulers_conform(
    local: Scheduler, cluster: ClusterScheduler, remote: RemoteScheduler
) -> list[SandboxScheduler]:
    return [local, cluster, remote]


def sessions_conform(
    local: Session, cluster: ClusterSession, remote: RemoteSession
) -> list[SandboxSession]:
    return [local, cluster, remote]


def test_both_schedulers_are_sandbox_schedulers(tmp_path: object) -> None:
    config = SchedulerConfig()
    assert isinstance(Scheduler(config), SandboxScheduler)
    assert isinstance(ClusterScheduler(config=config), SandboxScheduler)
    assert isinstance(RemoteScheduler("/nonexistent.sock", config=config), SandboxScheduler)


def test_a_scheduler_without_delete_snapshot_is_not_one() -> None:
    class Partial:
        async def run(self, code: str) -> None: ...

    assert not isinstance(Partial(), SandboxScheduler)
