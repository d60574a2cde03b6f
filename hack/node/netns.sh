#!/bin/sh
# Runs a command (make e2e-node: the node tests) in a network namespace of its own that reaches
# nothing: loopback alone, holding the node's address 10.255.0.1 besides 127.0.0.1 (kubelet
# refuses a loopback node IP). Every hostNetwork pod of the node listens in it alone.
#
# Usage: hack/node/netns.sh COMMAND [ARGS...]   (as root)
set -eu
if [ "${1:-}" = "--inside" ]; then
  shift
  ip link set lo up
  ip addr add 10.255.0.1/32 dev lo
  exec "$@"
fi
exec unshare --net --fork -- "$0" --inside "$@"
