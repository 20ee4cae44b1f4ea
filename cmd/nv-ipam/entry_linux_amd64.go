package main

import (
	"syscall"
	"unsafe"
)

// The plugin lives for one CNI call, on one goroutine. Two things the Go
// runtime does at start-up cost such a process more than its call; the entry
// point (entry_linux_amd64.s) changes both before the runtime starts, and main
// undoes them for its own thread first thing (undoEntry).
//
// Sysmon, the runtime's monitor thread, sleeps 20 µs at a time while any
// processor is busy (doubling only after a millisecond of finding nothing to
// do), and wakes at once again whenever a goroutine makes a system call. The
// plugin's call is a millisecond or two of work and system calls, so sysmon
// woke some 25 times per exec; with 16 plugins sharing 2 CPUs, where each
// lives for 15-20 ms, 60 context switches per exec against the floor's 40, and
// 0.2-0.3 ms of CPU. A thread's timer slack lets the kernel end its sleeps up
// to that much later, to batch wake-ups, and a new thread inherits it: set to
// 10 ms before the runtime makes sysmon, it wakes a few times per exec. Sysmon
// retakes a processor from a blocked system call, preempts a goroutine that
// runs for 10 ms and polls the network when nothing else does: a one-goroutine
// plugin needs none of them soon, and its deadlines are seconds long.
//
// The runtime sizes itself at start-up for every CPU the process may use: with
// two or more, its first goroutines (the garbage collector's) start a second
// thread that spins looking for work, and while the plugin waits for the
// daemon, sysmon wakes every 20 µs for the first millisecond because a
// processor is idle. Measured here on 2 CPUs, that is 0.2-0.35 ms of CPU per
// exec (of about 2), and 7-12 % of the throughput of concurrent execs.
// GOMAXPROCS=1 in the environment removes it, but a runtime execs the plugin
// with its own environment; so the entry point narrows the CPU set to one CPU
// before the runtime reads it.
var (
	savedMask [16]uint64 // the CPU set the process was started with
	savedLen  int64      // its length in bytes, as the kernel returned it; 0 if not saved
	oneMask   [16]uint64 //nolint:unused // written by entry (the .s file): the CPU the process started on
	startCPU  uint32     //nolint:unused // written by entry
	narrowed  bool       // the entry point narrowed the CPU set

	savedSlack int64 // the timer slack (ns) the process was started with, written by entry
	slackSet   bool  // the entry point set runtimeSlackNs
)

// runtimeSlackNs is the timer slack, in nanoseconds, of the threads made
// before main (the .s file reads it as const_runtimeSlackNs).
const runtimeSlackNs = 10_000_000 //nolint:unused // read by entry (the .s file)

// entry is the ELF entry point with -E main.entry (see the .s file). It is
// never called from Go.
func entry()

var _ = entry // kept: the linker looks it up by name

// undoEntry gives the main thread back the CPU set and the timer slack the
// process was started with. Threads the runtime made before main (sysmon among
// them), and threads they make later, keep the one CPU and the slack: the
// process lives for one call.
func undoEntry() {
	if narrowed {
		_, _, _ = syscall.RawSyscall(syscall.SYS_SCHED_SETAFFINITY, 0, uintptr(savedLen), uintptr(unsafe.Pointer(&savedMask)))
	}
	if slackSet {
		_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_TIMERSLACK, uintptr(savedSlack), 0)
	}
}
