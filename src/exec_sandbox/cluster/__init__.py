"""Many hosts, one API: `ClusterScheduler` runs `run()` and sessions over the nodes of a Ray
cluster (`pip install 'exec-sandbox[ray]'`; docs/scaling.md). Importing this package without Ray
raises VmConfigError naming the extra; the rest of exec_sandbox never imports Ray."""

from .client import HOST_RESOURCE, NAMESPACE, ClusterScheduler, ClusterSession, HostInfo

__all__ = ["HOST_RESOURCE", "NAMESPACE", "ClusterScheduler", "ClusterSession", "HostInfo"]
