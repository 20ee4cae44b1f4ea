#include "go_asm.h"
#include "textflag.h"

// entry is the plugin's ELF entry point when it is linked with -E main.entry
// (the Makefile does). Before the Go runtime starts, it sets the thread's timer
// slack to 10 ms (saving what it was), which the threads the runtime makes
// before main inherit, sysmon among them; it saves the process's CPU set and
// narrows it to the CPU the process runs on, so that the runtime sizes itself
// for one CPU (GOMAXPROCS 1). See entry_linux_amd64.go for both. Then it jumps
// to the runtime's own entry, as if it had never run. A failed system call
// leaves the slack, or the CPU set, as it is.
TEXT ·entry(SB),NOSPLIT|NOFRAME,$0
	MOVQ	$157, AX	// prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0)
	MOVQ	$30, DI
	MOVQ	$0, SI
	MOVQ	$0, DX
	MOVQ	$0, R10
	MOVQ	$0, R8
	SYSCALL
	CMPQ	AX, $0
	JLE	affinity
	MOVQ	AX, ·savedSlack(SB)
	MOVQ	$157, AX	// prctl(PR_SET_TIMERSLACK, runtimeSlackNs, 0, 0, 0)
	MOVQ	$29, DI
	MOVQ	$const_runtimeSlackNs, SI
	MOVQ	$0, DX
	MOVQ	$0, R10
	MOVQ	$0, R8
	SYSCALL
	CMPQ	AX, $0
	JNE	affinity
	MOVB	$1, ·slackSet(SB)
affinity:
	MOVQ	$204, AX	// sched_getaffinity(0, 128, &savedMask)
	MOVQ	$0, DI
	MOVQ	$128, SI
	LEAQ	·savedMask(SB), DX
	SYSCALL
	CMPQ	AX, $0
	JLE	runtime
	MOVQ	AX, ·savedLen(SB)
	MOVQ	$309, AX	// getcpu(&startCPU, NULL, NULL)
	LEAQ	·startCPU(SB), DI
	MOVQ	$0, SI
	MOVQ	$0, DX
	SYSCALL
	CMPQ	AX, $0
	JNE	runtime
	MOVL	·startCPU(SB), AX
	CMPQ	AX, $1024
	JAE	runtime
	BTSQ	AX, ·oneMask(SB)
	MOVQ	$203, AX	// sched_setaffinity(0, 128, &oneMask)
	MOVQ	$0, DI
	MOVQ	$128, SI
	LEAQ	·oneMask(SB), DX
	SYSCALL
	CMPQ	AX, $0
	JNE	runtime
	MOVB	$1, ·narrowed(SB)
runtime:
	JMP	_rt0_amd64_linux(SB)
