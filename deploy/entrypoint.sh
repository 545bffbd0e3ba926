#!/bin/sh
# Container entrypoint: prepare prometheus_client's multiprocess directory, then become
# `batchq worker "$@"` (exec: the supervisor is PID 1 and gets SIGTERM directly).
#
# The directory must exist and start empty: files left by an earlier run of this
# container (a restart keeps /tmp) would be summed into the new counters. batchq wipes
# it too; doing it here also covers a read-only root with an emptyDir mounted there.
set -eu

dir="${PROMETHEUS_MULTIPROC_DIR:-/tmp/batchq-metrics}"
case "$dir" in
    "" | "/")
        echo "batchq-entrypoint: refusing PROMETHEUS_MULTIPROC_DIR='$dir'" >&2
        exit 2
        ;;
esac
mkdir -p "$dir"
find "$dir" -mindepth 1 -delete
export PROMETHEUS_MULTIPROC_DIR="$dir"

exec batchq worker "$@"
