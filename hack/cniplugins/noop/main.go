// Command noop reads its standard input and exits 0. Benchmarks exec it to measure the
// floor: what running any Go binary per CNI call costs on this machine.
package main

import (
	"io"
	"os"
)

func main() {
	_, _ = io.Copy(io.Discard, os.Stdin)
}
