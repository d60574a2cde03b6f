#!/bin/sh
# Runs a command (make e2e-node: the node tests) in a network namespace of its own that reaches
# nothing outside it: loopback, and the bridge eg-br0 of the node's pod network, 10.88.0.0/16,
# holding 10.88.0.1 (the node's address and the API server's). The CNI bridge plugin plugs each
# pod into it; every address of the node, its pods and its API server is in this namespace
# alone.
#
# Usage: hack/node/netns.sh COMMAND [ARGS...]   (as root)
set -eu
if [ "${1:-}" = "--inside" ]; then
  shift
  ip link set lo up
  ip link add name eg-br0 type bridge
  ip addr add 10.88.0.1/16 dev eg-br0
  ip link set eg-br0 up
  exec "$@"
fi
exec unshare --net --fork -- "$0" --inside "$@"
