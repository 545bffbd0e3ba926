"""Development tools, not needed to run batchq in production: the embedded Valkey server
(:mod:`batchq.dev.server`, also behind ``batchq server``), an embedded Valkey cluster
(:mod:`batchq.dev.cluster`) and the ``make demo`` run (:mod:`batchq.dev.demo`).

Nothing in the core imports this package; it imports the core (the demo uses the public
API like any application would).
"""

from __future__ import annotations

from .cluster import CLUSTER_SLOTS, EmbeddedCluster
from .server import EmbeddedServer, binary_path, serve_forever, start_embedded

__all__ = [
    "CLUSTER_SLOTS",
    "EmbeddedCluster",
    "EmbeddedServer",
    "binary_path",
    "serve_forever",
    "start_embedded",
]
