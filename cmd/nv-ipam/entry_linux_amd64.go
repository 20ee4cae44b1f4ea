package main

import (
	"syscall"
	"unsafe"
)

// The plugin lives for one CNI call, on one goroutine. The Go runtime sizes
// itself at start-up for every CPU the process may use: with two or more, its
// first goroutines (the garbage collector's) start a second thread that spins
// looking for work, and while the plugin waits for the daemon, sysmon wakes
// every 20 µs for the first millisecond because a processor is idle. Measured
// here on 2 CPUs, that is 0.2-0.35 ms of CPU per exec (of about 2), and 7-12 %
// of the throughput of concurrent execs. GOMAXPROCS=1 in the environment
// removes it, but a runtime execs the plugin with its own environment; so the
// entry point (entry_linux_amd64.s) narrows the CPU set to one CPU before the
// runtime reads it, and main gives the whole set back first thing.
var (
	savedMask [16]uint64 // the CPU set the process was started with
	savedLen  int64      // its length in bytes, as the kernel returned it; 0 if not saved
	oneMask   [16]uint64 //nolint:unused // written by entry (the .s file): the CPU the process started on
	startCPU  uint32     //nolint:unused // written by entry
	narrowed  bool       // the entry point narrowed the CPU set
)

// entry is the ELF entry point with -E main.entry (see the .s file). It is
// never called from Go.
func entry()

var _ = entry // kept: the linker looks it up by name

// restoreCPUs gives the process's thread back the CPU set it was started with.
// Threads the runtime made before main (sysmon among them), and threads they
// make later, keep the one CPU: the process lives for one call.
func restoreCPUs() {
	if narrowed {
		_, _, _ = syscall.RawSyscall(syscall.SYS_SCHED_SETAFFINITY, 0, uintptr(savedLen), uintptr(unsafe.Pointer(&savedMask)))
	}
}
