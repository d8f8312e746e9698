"""Scale-out: many gateway processes, one owner per device (see docs/scale-out.md).

``membership`` is the pure core (live set + rendezvous hashing); ``component`` its MQTT shell.
"""

from gateway.cluster.component import Cluster, Ownership
from gateway.cluster.membership import Membership, owner_of

__all__ = ["Cluster", "Membership", "Ownership", "owner_of"]
