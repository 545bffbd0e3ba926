"""The batchq benchmark harness: ``python -m bench SCENARIO`` (see bench/README.md).

Not part of the installed package: it lives in the repository checkout only. Modules
that peers' virtualenvs import (``bench.record``, ``bench.peers.*_app``,
``bench.peers.driver``) need nothing but the standard library, redis-py and the peer.
"""
