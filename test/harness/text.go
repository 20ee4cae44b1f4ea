package harness

import (
	"strings"
	"sync"
)

// LastLines is the last n lines of s, for the tail of a log in a failure message.
func LastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// LogBuffer collects a process's output (its stdout and stderr may write at once)
// while a test reads it.
type LogBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}
