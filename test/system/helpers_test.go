package system

import (
	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// The components log through their own processes; controller-runtime in the test
// process (envtest's clients) has nothing to say that the test needs.
func init() { ctrllog.SetLogger(logr.Discard()) }
