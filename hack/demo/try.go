package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// tryYAML is docs/demo.md's "Try it" manifests (a test keeps the two equal): an
// IPPool named outright by a NAD, a NAD that takes its pool by rail (the demo's
// rail pools carry nic.hwipam.io/rail), and a pod with both. Every NAD on the demo
// needs confDir: the node's nv-ipam.conf is under the demo's run directory, not at
// the plugin's default /etc/cni/net.d/nv-ipam.d. REGISTRY is the node's loopback
// registry (its port differs from run to run), filled in when the demo writes the
// file.
const tryYAML = `apiVersion: nv-ipam.nvidia.com/v1alpha1
kind: IPPool
metadata:
  name: try-pool
  namespace: kube-system
spec:
  subnet: 10.60.0.0/24
  perNodeBlockSize: 16
  gateway: 10.60.0.1
---
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata:
  name: try-named
  namespace: default
spec:
  config: |
    {"cniVersion": "1.0.0", "name": "try-named", "type": "macvlan", "master": "ibp24s0", "mode": "bridge",
     "ipam": {"type": "nv-ipam", "poolName": "try-pool", "confDir": "/tmp/hwipam-demo/cni/net.d/nv-ipam.d"}}
---
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata:
  name: try-rail
  namespace: default
spec:
  config: |
    {"cniVersion": "1.0.0", "name": "try-rail", "type": "macvlan", "master": "ibp64s0", "mode": "bridge",
     "ipam": {"type": "nv-ipam", "rail": "auto", "confDir": "/tmp/hwipam-demo/cni/net.d/nv-ipam.d"}}
---
apiVersion: v1
kind: Pod
metadata:
  name: try-a
  namespace: default
  annotations:
    k8s.v1.cni.cncf.io/networks: try-named,try-rail
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: app
    image: REGISTRY/busybox:hwipam
    command: [sleep, "1000000"]
`

// tryFile is where the demo writes tryYAML with its registry.
var tryFile = filepath.Join(dir, "try.yaml")

// writeTry writes tryYAML with the node's registry into tryFile.
func writeTry(registry string) error {
	if err := os.WriteFile(tryFile, []byte(strings.ReplaceAll(tryYAML, "REGISTRY", registry)), 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", tryFile, err)
	}
	return nil
}
