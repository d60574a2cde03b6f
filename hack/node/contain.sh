#!/bin/sh
# Runs the real node's containerd and kubelet (make e2e-node), contained: kubelet rewrites
# kernel tunables as root (vm.overcommit_memory, vm.panic_on_oom, kernel.panic,
# kernel.panic_on_oops, kernel.keys.root_maxkeys, kernel.keys.root_maxbytes), which on a
# machine of ours would turn any kernel oops into a reboot. Here each of them is a file of the
# node's own, bind-mounted over its /proc/sys entry in a private mount namespace: kubelet reads
# and writes the file, the kernel's value stays. /run is a tmpfs of the namespace (containerd's
# and runc's state, the shims' sockets).
#
# Start it only as test/support/node does:
#   HOST_MNT_NS=$(readlink /proc/self/ns/mnt) \
#   unshare --mount --propagation private --fork --kill-child=SIGTERM -- \
#     hack/node/contain.sh DIR RUNTIME_BIN KUBELET [kubelet flags...]
# It refuses to start kubelet when it runs in the mount namespace it was started from, or when
# any of the tunables is not its own file. SIGTERM stops kubelet, then containerd.
set -eu

dir=$1 bin=$2 kubelet=$3
shift 3
tunables="vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops kernel/keys/root_maxkeys kernel/keys/root_maxbytes"

fail() { echo "contain.sh: $*" >&2; exit 1; }

[ -n "${HOST_MNT_NS:-}" ] || fail "HOST_MNT_NS is not set: start it as test/support/node does"
[ "$(readlink /proc/self/ns/mnt)" != "$HOST_MNT_NS" ] || fail "running in the host's mount namespace: start it under unshare --mount --propagation private"

mkdir -p "$dir/sysctl" "$dir/logs"
for t in $tunables; do
  f="$dir/sysctl/$(echo "$t" | tr / .)"
  cat "/proc/sys/$t" >"$f"
  mount --bind "$f" "/proc/sys/$t"
done
# Each tunable must now be the node's file: a mount of its own, over that path, in this
# namespace alone.
for t in $tunables; do
  findmnt --noheadings --mountpoint "/proc/sys/$t" >/dev/null || fail "/proc/sys/$t is not contained"
done
mount -t tmpfs -o mode=0755 exit-guard-node-run /run
# What containerd, its CNI plugins and kubelet write at fixed paths outside their configured
# folders (libcni's cache in /var/lib/cni, containerd's opt plugin in /opt/containerd, kubelet's
# /var/log/containers links): tmpfs of the namespace over their parents, gone with it.
for d in /var/lib /opt /var/log; do
  mount -t tmpfs -o mode=0755 exit-guard-node "$d"
done

PATH="$bin:$PATH"
export PATH
"$bin/containerd" --config "$dir/containerd.toml" >>"$dir/logs/containerd.log" 2>&1 &
cpid=$!
i=0
until [ -S "$dir/containerd/containerd.sock" ]; do
  i=$((i + 1))
  [ "$i" -lt 600 ] || { kill "$cpid"; fail "containerd did not open its socket in 60 s (its log: $dir/logs/containerd.log)"; }
  kill -0 "$cpid" 2>/dev/null || fail "containerd exited (its log: $dir/logs/containerd.log)"
  sleep 0.1
done

"$kubelet" "$@" >>"$dir/logs/kubelet.log" 2>&1 &
kpid=$!
stop() {
  kill -TERM "$kpid" 2>/dev/null || true
  wait "$kpid" 2>/dev/null || true
  kill -TERM "$cpid" 2>/dev/null || true
  wait "$cpid" 2>/dev/null || true
  exit 0
}
trap stop TERM INT
# Either exiting ends the node.
while kill -0 "$kpid" 2>/dev/null && kill -0 "$cpid" 2>/dev/null; do
  sleep 1 &
  wait $! || true
done
echo "contain.sh: kubelet or containerd exited (logs in $dir/logs)" >&2
stop
