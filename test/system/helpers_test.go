package system

import (
	"fmt"
	"io"
	"sync"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// lockedWriter serialises writes from a process's stdout and stderr.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return fmt.Sprint(l.w)
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// The components log through their own processes; controller-runtime in the test
// process (envtest's clients) has nothing to say that the test needs.
func init() { ctrllog.SetLogger(logr.Discard()) }
