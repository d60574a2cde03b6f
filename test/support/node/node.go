// Package node runs a real single-node cluster for the tests of make e2e-node: the test
// API server (testenv), kube-controller-manager and kube-scheduler, and a kubelet on containerd
// and runc, all built from Go modules by hack/. kubelet and containerd run contained
// (hack/node/contain.sh): a private mount namespace whose kernel tunables are files of the
// node's own. The whole test runs in a network namespace of its own with loopback alone (make
// e2e-node starts it so), so that hostNetwork pods, the only kind without a pod network, listen
// on nothing but that loopback.
//
// Stop tears everything down and Check says what, if anything, was left behind: processes,
// cgroups, mounts, the namespace, the tunables' values, the node's folder.
package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// Name is the node's name.
const Name = "exit-guard-node"

// PauseImage is the sandbox image (hack/node-images.sh builds it from hack/node/pause).
const PauseImage = "exit-guard.local/pause:1"

// cgroupName is the node's cgroup in every cgroup v1 hierarchy: kubelet's cgroupRoot (its pods
// under kubepods), and, in the pids hierarchy, runtime (containerd, its shims, kubelet).
const cgroupName = "exit-guard-node"

// Tunables are the kernel tunables kubelet rewrites (pkg/kubelet/cm setupKernelTunables): the
// node must leave every one of them as it found it.
var Tunables = []string{"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes"}

// Cluster is a running node and its control plane.
type Cluster struct {
	Env *testenv.Env
	// Dir holds the node's state: containerd's, kubelet's, their logs and configuration.
	Dir string
	// Runtime is the folder of containerd, ctr and runc (hack/node-binaries.sh).
	Runtime string
	// Before is what Check compares with: the tunables and the host's mounts at the start.
	Before Snapshot

	nodeTunables map[string]string // what the node's tunable files held at Stop
	runtimeProc  *testenv.Process  // unshare, and in it contain.sh
	containPid   int               // contain.sh, the first process of the contained namespace
	mountNS      string            // the contained namespace, mnt:[inode]
	controllers  []*testenv.Process
	logFiles     []*os.File // the processes' log files, closed by Stop
}

// Snapshot is the state of the machine that the node must leave as it found it.
type Snapshot struct {
	Tunables map[string]string
	Mounts   string          // /proc/self/mountinfo of the test's namespace
	Paths    map[string]bool // whether each of hostPaths exists
}

// hostPaths are where kubelet, containerd and libcni write by default, outside the folders the
// node gives them: contain.sh and the node's configuration keep them off the machine.
var hostPaths = []string{"/var/lib/cni", "/var/lib/kubelet", "/var/lib/containerd", "/opt/containerd",
	"/var/log/containers", "/var/log/pods", "/usr/libexec/kubernetes", "/etc/cni", "/run/containerd"}

// TakeSnapshot reads the tunables and the test's mounts.
func TakeSnapshot() (Snapshot, error) {
	s := Snapshot{Tunables: map[string]string{}}
	for _, t := range Tunables {
		v, err := os.ReadFile(filepath.Join("/proc/sys", t)) //nolint:gosec // G304: a kernel tunable of the list
		if err != nil {
			return s, err
		}
		s.Tunables[t] = strings.TrimSpace(string(v))
	}
	s.Paths = map[string]bool{}
	for _, p := range hostPaths {
		_, err := os.Lstat(p)
		s.Paths[p] = err == nil
	}
	m, err := os.ReadFile("/proc/self/mountinfo")
	s.Mounts = string(m)
	return s, err
}

// The node's network (hack/node/netns.sh): the bridge Bridge of the test's network namespace
// holds IP, the node's address and the API server's, in Subnet, where the CNI bridge plugin
// gives each pod an address.
const (
	Bridge = "eg-br0"
	IP     = "10.88.0.1"
	Subnet = "10.88.0.0/16"
	// ServiceRange holds the Services' ClusterIPs, the kubernetes Service's IP first; pods get
	// addresses from 10.88.1.1 on.
	ServiceRange = "10.88.0.0/24"
)

// CheckIsolated returns an error unless the test runs where the node may run: as root, in a
// network namespace that reaches nothing outside it: loopback, and Bridge holding IP, with no
// port.
func CheckIsolated() error {
	const how = "run it with 'make e2e-node' (as root; it builds the node's binaries and runs the tests in a network namespace of their own, hack/node/netns.sh)"
	if os.Geteuid() != 0 {
		return errors.New("the real node needs root: " + how)
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return err
	}
	bridge := false
	for _, i := range ifs {
		switch {
		case i.Flags&net.FlagLoopback != 0:
		case i.Name == Bridge:
			out, err := exec.Command("ip", "-d", "-o", "link", "show", "dev", i.Name).Output() //nolint:gosec // G204: an interface of the test's namespace
			if err != nil || !strings.Contains(string(out), " bridge ") {
				return fmt.Errorf("%s is not a bridge (%s): %s", i.Name, strings.TrimSpace(string(out)), how)
			}
			// ip, not /sys/class/net: the test's sysfs is the host's namespace's.
			if ports, err := exec.Command("ip", "-o", "link", "show", "master", i.Name).Output(); err != nil || len(bytes.TrimSpace(ports)) > 0 { //nolint:gosec // G204: the bridge's name
				return fmt.Errorf("%s has ports already (%s): %s", i.Name, bytes.TrimSpace(ports), how)
			}
			addrs, err := i.Addrs()
			if err != nil || len(addrs) == 0 || !strings.HasPrefix(addrs[0].String(), IP+"/") {
				return fmt.Errorf("%s holds %v, want %s: %s", i.Name, addrs, IP, how)
			}
			bridge = true
		default:
			return fmt.Errorf("the test's network namespace has interface %s besides loopback and %s: %s", i.Name, Bridge, how)
		}
		if i.Flags&net.FlagUp == 0 {
			return fmt.Errorf("%s is down in the test's network namespace: %s", i.Name, how)
		}
	}
	if !bridge {
		return fmt.Errorf("no bridge %s holding the node's address %s: %s", Bridge, IP, how)
	}
	return nil
}

// Binaries says where the node's binaries are, or what builds them.
func Binaries() (assets, runtime string, err error) {
	assets, err = testenv.AssetsDir()
	if err != nil {
		return "", "", err
	}
	for _, b := range []string{"kubelet", "kube-scheduler", "kube-controller-manager", "kubectl"} {
		if _, err := os.Stat(filepath.Join(assets, b)); err != nil {
			return "", "", fmt.Errorf("no %s in %s: run 'make e2e-node' (hack/envtest-binaries.sh ensure-node builds it)", b, assets)
		}
	}
	out, err := exec.Command(filepath.Join(testenv.RepoRoot(), "hack", "node-binaries.sh"), "path").Output() //nolint:gosec // G204: this repository's script
	if err != nil {
		return "", "", fmt.Errorf("hack/node-binaries.sh path: %w", err)
	}
	runtime = strings.TrimSpace(string(out))
	for _, b := range []string{"containerd", "containerd-shim-runc-v2", "ctr", "runc"} {
		if _, err := os.Stat(filepath.Join(runtime, b)); err != nil {
			return "", "", fmt.Errorf("no %s in %s: run 'make e2e-node' (hack/node-binaries.sh builds it)", b, runtime)
		}
	}
	return assets, runtime, nil
}

// Start starts the node on env's API server (which must have been started with Options). Stop it with Stop, even when Start fails.
func Start(ctx context.Context, env *testenv.Env) (*Cluster, error) {
	if err := CheckIsolated(); err != nil {
		return nil, err
	}
	assets, runtime, err := Binaries()
	if err != nil {
		return nil, err
	}
	if err := cleanCgroups(); err != nil {
		return nil, fmt.Errorf("a node of an earlier run is still there: %w", err)
	}
	before, err := TakeSnapshot()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "exit-guard-node-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{Env: env, Dir: dir, Runtime: runtime, Before: before}
	if err := c.writeConfig(); err != nil {
		return c, err
	}
	if err := c.startControllers(assets); err != nil {
		return c, err
	}
	if err := c.startRuntime(assets); err != nil {
		return c, err
	}
	return c, c.waitReady(ctx)
}

// Options are the test API server's options for the node. It serves on IP:443, and the
// kubernetes Service's ClusterIP is IP too (the first address of its range): with no
// kube-proxy, the address and port kubelet gives every pod (KUBERNETES_SERVICE_HOST and _PORT)
// lead to it all the same. ServiceAccount admission gives pods their tokens (envtest turns it
// off); webhook calls go to a Service's endpoints rather than its ClusterIP; the API server
// reaches kubelet (logs, exec) at the node's address, not its name, which nothing resolves.
func Options() testenv.Options {
	return testenv.Options{
		APIServerAddress: IP,
		APIServerPort:    443,
		APIServerFlags: map[string]string{
			"disable-admission-plugins":       "",
			"enable-aggregator-routing":       "true",
			"advertise-address":               IP,
			"service-cluster-ip-range":        ServiceRange,
			"kubelet-preferred-address-types": "InternalIP",
		},
	}
}

func (c *Cluster) path(p ...string) string { return filepath.Join(append([]string{c.Dir}, p...)...) }

func (c *Cluster) writeConfig() error {
	for _, d := range []string{"logs", "containerd", "kubelet", "pod-logs", "cni"} {
		if err := os.MkdirAll(c.path(d), 0o750); err != nil {
			return err
		}
	}
	if err := os.WriteFile(c.path("kubeconfig"), c.Env.KubeConfig(), 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(c.path("ca.crt"), c.Env.Config.CAData, 0o644); err != nil { //nolint:gosec // G306: a CA certificate
		return err
	}
	// The pod network: the bridge plugin plugs each pod into Bridge, host-local gives it an
	// address of Subnet (its leases in the node's folder).
	cni := fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "exit-guard-node", "plugins": [
  {"type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": %q, "rangeStart": "10.88.1.1", "gateway": %q}]], "dataDir": %q}},
  {"type": "loopback"}]}`, Bridge, Subnet, IP, c.path("cni-ipam"))
	if err := os.WriteFile(c.path("cni", "10-exit-guard-node.conflist"), []byte(cni), 0o644); err != nil { //nolint:gosec // G306: no secret
		return err
	}
	containerd := fmt.Sprintf(`version = 4
root = %[1]q
state = %[2]q

[plugins.'io.containerd.server.v1.grpc']
  address = %[3]q

[plugins.'io.containerd.server.v1.ttrpc']
  address = %[4]q

[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %[5]q

[plugins.'io.containerd.cri.v1.runtime']
  # The test runs without CAP_SYS_RESOURCE: no container's OOM score below containerd's own.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'runc'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = %[6]q
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [%[7]q]
    conf_dir = %[8]q
`, c.path("containerd", "root"), c.path("containerd", "state"), c.path("containerd", "containerd.sock"),
		c.path("containerd", "containerd.sock.ttrpc"), PauseImage, filepath.Join(c.Runtime, "runc"),
		filepath.Join(c.Runtime, "cni"), c.path("cni"))
	if err := os.WriteFile(c.path("containerd.toml"), []byte(containerd), 0o644); err != nil { //nolint:gosec // G306: no secret
		return err
	}
	healthz, err := testenv.FreePort()
	if err != nil {
		return err
	}
	kubeletPort, err := testenv.FreePort()
	if err != nil {
		return err
	}
	kubelet := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %s
port: %d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %d
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /%s
failSwapOn: false
containerRuntimeEndpoint: unix://%s
podLogsDir: %s
volumePluginDir: %s
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
resolvConf: /etc/resolv.conf
# The machine's disk may be nearly full of build caches: evict on its last percent only.
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%%
  imagefs.available: 1%%
  nodefs.inodesFree: 1%%
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# Images come from ctr import alone (no registry): never pull.
serializeImagePulls: false
syncFrequency: 10s
`, IP, kubeletPort, healthz, cgroupName, c.path("containerd", "containerd.sock"), c.path("pod-logs"), c.path("volume-plugins"))
	return os.WriteFile(c.path("kubelet.yaml"), []byte(kubelet), 0o644) //nolint:gosec // G306: no secret
}

func (c *Cluster) startControllers(assets string) error {
	for _, p := range []struct {
		bin  string
		args []string
	}{
		{"kube-controller-manager", []string{"--kubeconfig=" + c.path("kubeconfig"), "--leader-elect=false", "--secure-port=0",
			"--root-ca-file=" + c.path("ca.crt"), "--controllers=*,-serviceaccount-token", "--use-service-account-credentials=false",
			"--flex-volume-plugin-dir=" + c.path("volume-plugins")}},
		{"kube-scheduler", []string{"--kubeconfig=" + c.path("kubeconfig"), "--leader-elect=false", "--secure-port=0"}},
	} {
		log, err := os.Create(c.path("logs", p.bin+".log"))
		if err != nil {
			return err
		}
		c.logFiles = append(c.logFiles, log)
		proc, err := testenv.Launch(filepath.Join(assets, p.bin), p.args, nil, log)
		if err != nil {
			return err
		}
		c.controllers = append(c.controllers, proc)
	}
	return nil
}

// startRuntime starts contain.sh under unshare, in the pids cgroup runtime of the node's
// cgroup, so that Stop finds containerd's shims, which outlive it.
func (c *Cluster) startRuntime(assets string) error {
	hostNS, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return err
	}
	for _, h := range hierarchies() {
		if err := os.MkdirAll(filepath.Join(h, cgroupName), 0o755); err != nil { //nolint:gosec // G301: a cgroup, as kubelet makes them
			return err
		}
	}
	pidsRuntime := filepath.Join("/sys/fs/cgroup/pids", cgroupName, "runtime")
	if err := os.MkdirAll(pidsRuntime, 0o755); err != nil { //nolint:gosec // G301: a cgroup, as kubelet makes them
		return err
	}
	log, err := os.Create(c.path("logs", "contain.log"))
	if err != nil {
		return err
	}
	c.logFiles = append(c.logFiles, log)
	args := []string{"--mount", "--propagation", "private", "--fork", "--kill-child=SIGTERM", "--",
		filepath.Join(testenv.RepoRoot(), "hack", "node", "contain.sh"), c.Dir, c.Runtime, filepath.Join(assets, "kubelet"),
		"--config=" + c.path("kubelet.yaml"), "--kubeconfig=" + c.path("kubeconfig"), "--root-dir=" + c.path("kubelet"),
		"--node-ip=" + IP, "--hostname-override=" + Name, "--v=2"}
	// The child joins the cgroup before it execs unshare: everything it starts is in it.
	cmd := exec.Command("sh", append( //nolint:gosec // G204: this repository's contain.sh and the node's binaries
		[]string{"-c", `echo $$ > "$0/cgroup.procs" && exec unshare "$@"`, pidsRuntime}, args...)...)
	c.runtimeProc, err = testenv.LaunchCmd(cmd, append(os.Environ(), "HOST_MNT_NS="+hostNS), log)
	if err != nil {
		return err
	}
	// The contained namespace: that of the unshare's child, once it has one.
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if pid, ns := c.contained(hostNS); ns != "" {
			c.containPid, c.mountNS = pid, ns
			return nil
		}
		if c.runtimeProc.Exited() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	out, _ := os.ReadFile(log.Name())
	return fmt.Errorf("the contained runtime did not start: %s", out)
}

// contained returns unshare's child, contain.sh, and its mount namespace, once it is not
// hostNS; or "".
func (c *Cluster) contained(hostNS string) (int, string) {
	for _, pid := range cgroupProcs(filepath.Join("/sys/fs/cgroup/pids", cgroupName, "runtime")) {
		stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, not ")".
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(fields) < 2 || fields[1] != strconv.Itoa(c.runtimeProc.Pid()) {
			continue
		}
		if ns, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "ns", "mnt")); err == nil && ns != hostNS {
			return pid, ns
		}
	}
	return 0, ""
}

func (c *Cluster) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	for {
		var n corev1.Node
		err := c.Env.Client.Get(ctx, client.ObjectKey{Name: Name}, &n)
		if err == nil {
			for _, cond := range n.Status.Conditions {
				if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
					return nil
				}
			}
		}
		if c.runtimeProc.Exited() != nil {
			return fmt.Errorf("the node's runtime exited: %s", c.Logs("contain", "kubelet", "containerd"))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("node %s not Ready in 3 minutes: %s", Name, c.Logs("kubelet", "containerd"))
		case <-time.After(time.Second):
		}
	}
}

// Logs returns the last lines of the named logs of the node (kubelet, containerd, contain,
// kube-controller-manager, kube-scheduler).
func (c *Cluster) Logs(names ...string) string {
	var b strings.Builder
	for _, n := range names {
		raw, _ := os.ReadFile(c.path("logs", n+".log"))
		lines := strings.Split(strings.TrimRight(string(raw), "\n"), "\n")
		if len(lines) > 40 {
			lines = lines[len(lines)-40:]
		}
		fmt.Fprintf(&b, "\n--- %s.log, its last lines:\n%s", n, strings.Join(lines, "\n"))
	}
	return b.String()
}

// Ctr runs ctr on the node's containerd, in its k8s.io namespace (the one kubelet uses).
func (c *Cluster) Ctr(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.Runtime, "ctr"), //nolint:gosec // G204: the node's ctr
		append([]string{"--address", c.path("containerd", "containerd.sock"), "--namespace", "k8s.io"}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.Bytes(), err
}

// Import loads an image archive (hack/image's archive or files --archive) into the node.
func (c *Cluster) Import(ctx context.Context, archive string) error {
	if out, err := c.Ctr(ctx, "images", "import", "--no-unpack=false", archive); err != nil {
		return fmt.Errorf("ctr images import %s: %w\n%s", archive, err, out)
	}
	return nil
}

// Stop stops the node and its controllers and removes what they left: the processes of the
// node's cgroups, the cgroups, the node's folder (kept, with its logs, when
// EXIT_GUARD_NODE_KEEP is set). Then call Check.
func (c *Cluster) Stop() error {
	var errs []error
	if c.runtimeProc != nil {
		// unshare --fork ignores SIGTERM while it waits for its child: contain.sh gets it, stops
		// kubelet, then containerd, and unshare ends with it.
		if c.containPid != 0 {
			_ = syscall.Kill(c.containPid, syscall.SIGTERM)
		}
		select {
		case <-c.runtimeProc.Done():
		case <-time.After(60 * time.Second):
			errs = append(errs, errors.New("kubelet and containerd did not stop within 60 s of SIGTERM"))
			c.runtimeProc.Kill()
		}
	}
	for _, p := range c.controllers {
		_ = p.Stop(10 * time.Second)
	}
	for _, f := range c.logFiles {
		_ = f.Close()
	}
	if err := cleanCgroups(); err != nil {
		errs = append(errs, err)
	}
	c.nodeTunables = map[string]string{}
	for _, t := range Tunables {
		raw, _ := os.ReadFile(c.path("sysctl", strings.ReplaceAll(t, "/", "."))) //nolint:gosec // G304: the node's own file
		c.nodeTunables[t] = strings.TrimSpace(string(raw))
	}
	if c.Dir != "" && os.Getenv("EXIT_GUARD_NODE_KEEP") == "" {
		if err := os.RemoveAll(c.Dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Check says what the node left behind after Stop: a process in its mount namespace, a cgroup,
// a mount in the test's namespace, a changed tunable, its folder.
func (c *Cluster) Check() error {
	var errs []error
	now, err := TakeSnapshot()
	if err != nil {
		return err
	}
	for t, v := range c.Before.Tunables {
		if now.Tunables[t] != v {
			errs = append(errs, fmt.Errorf("%s is %s, was %s", t, now.Tunables[t], v))
		}
	}
	for p, was := range c.Before.Paths {
		if now.Paths[p] != was {
			errs = append(errs, fmt.Errorf("%s: there before %v, now %v", p, was, now.Paths[p]))
		}
	}
	// Contained, not idle: kubelet wrote its values into the node's own files.
	for t, want := range map[string]string{"kernel/panic": "10", "kernel/panic_on_oops": "1", "vm/overcommit_memory": "1"} {
		if got := c.nodeTunables[t]; got != want {
			errs = append(errs, fmt.Errorf("the node's file for %s held %q after kubelet ran, want %q: kubelet's write did not land in it", t, got, want))
		}
	}
	if now.Mounts != c.Before.Mounts {
		errs = append(errs, fmt.Errorf("the test's mounts changed:\nbefore:\n%s\nafter:\n%s", c.Before.Mounts, now.Mounts))
	}
	if c.mountNS != "" {
		if pids := inNamespace(c.mountNS); len(pids) > 0 {
			errs = append(errs, fmt.Errorf("processes %v are still in the node's mount namespace %s", pids, c.mountNS))
		}
	}
	for _, h := range hierarchies() {
		if _, err := os.Stat(filepath.Join(h, cgroupName)); err == nil {
			errs = append(errs, fmt.Errorf("cgroup %s is still there", filepath.Join(h, cgroupName)))
		}
	}
	if _, err := os.Stat(c.Dir); err == nil && os.Getenv("EXIT_GUARD_NODE_KEEP") == "" {
		errs = append(errs, fmt.Errorf("the node's folder %s is still there", c.Dir))
	}
	return errors.Join(errs...)
}

// hierarchies are the cgroup v1 hierarchies kubelet's cgroupfs driver writes: every mounted
// one, the named systemd one and the unified (v2) one included (runc writes there too).
func hierarchies() []string {
	var out []string
	for _, n := range []string{"blkio", "cpu", "cpuacct", "cpuset", "devices", "freezer", "memory", "pids", "hugetlb", "net_cls", "net_prio", "perf_event", "systemd", "unified"} {
		p := filepath.Join("/sys/fs/cgroup", n)
		if fi, err := os.Lstat(p); err == nil && fi.IsDir() {
			out = append(out, p)
		}
	}
	return out
}

func cgroupProcs(dir string) []int {
	raw, err := os.ReadFile(filepath.Join(dir, "cgroup.procs")) //nolint:gosec // G304: a cgroup of the node
	if err != nil {
		return nil
	}
	var pids []int
	for f := range strings.FieldsSeq(string(raw)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// cleanCgroups kills every process in the node's cgroups (the pids hierarchy holds each once)
// and removes the cgroups, deepest first, in every hierarchy.
func cleanCgroups() error {
	root := filepath.Join("/sys/fs/cgroup/pids", cgroupName)
	deadline := time.Now().Add(30 * time.Second)
	for {
		var left []int
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				left = append(left, cgroupProcs(p)...)
			}
			return nil
		})
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v of the node's cgroup did not die", left)
		}
		for _, pid := range left {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var errs []error
	for _, h := range hierarchies() {
		var dirs []string
		_ = filepath.WalkDir(filepath.Join(h, cgroupName), func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- { // WalkDir lists a folder before what it holds
			if err := os.Remove(dirs[i]); err != nil && !os.IsNotExist(err) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// inNamespace lists the processes whose mount namespace is ns.
func inNamespace(ns string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if got, err := os.Readlink(filepath.Join("/proc", e.Name(), "ns", "mnt")); err == nil && got == ns {
			pids = append(pids, pid)
		}
	}
	return pids
}
