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

// tryNICYAML is docs/demo.md's "A NIC claim" manifests (a test keeps the two
// equal, test/realnode runs them): a ResourceClaimTemplate for any NIC port that
// can be prepared, called net1 in the pod, and a pod with it. On the demo that is
// whichever of ibp79s0 and ibp94s0 demo-gpu does not hold: the NAD rails' ports
// are withheld (the demo's pods use them), the other rails have no link on the
// host. REGISTRY as in tryYAML.
const tryNICYAML = `apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: try-nic
  namespace: default
spec:
  spec:
    devices:
      requests:
      - name: nic
        exactly:
          deviceClassName: nic.hwipam.io
          selectors:
          - cel:
              expression: device.attributes["nic.hwipam.io"].preparable
      config:
      - requests: [nic]
        opaque:
          driver: nic.hwipam.io
          parameters:
            apiVersion: nic.hwipam.io/v1alpha1
            kind: NicConfig
            interfaceName: net1
---
apiVersion: v1
kind: Pod
metadata:
  name: try-nic
  namespace: default
spec:
  terminationGracePeriodSeconds: 0
  resourceClaims:
  - name: nic
    resourceClaimTemplateName: try-nic
  containers:
  - name: app
    image: REGISTRY/busybox:hwipam
    command: [sleep, "1000000"]
    resources:
      claims:
      - name: nic
`

// tryFile and tryNICFile are where the demo writes tryYAML and tryNICYAML
// with its registry.
var (
	tryFile    = filepath.Join(dir, "try.yaml")
	tryNICFile = filepath.Join(dir, "try-nic.yaml")
)

// writeTry writes tryYAML and tryNICYAML with the node's registry into
// tryFile and tryNICFile.
func writeTry(registry string) error {
	for file, manifests := range map[string]string{tryFile: tryYAML, tryNICFile: tryNICYAML} {
		if err := os.WriteFile(file, []byte(strings.ReplaceAll(manifests, "REGISTRY", registry)), 0o644); err != nil {
			return fmt.Errorf("writing %s: %w", file, err)
		}
	}
	return nil
}
