package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strings"
	"syscall"

	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
)

// syscallCounts is what one traced plugin execution did, by category.
type syscallCounts struct {
	Total int
	Cat   map[string]int
	Paths map[string]int // sysfs and state paths touched (openat/stat/readlink)
	ByNr  map[uint64]int
}

// sysNames names the x86-64 system calls a Go process makes most.
var sysNames = map[uint64]string{
	0: "read", 1: "write", 3: "close", 5: "fstat", 8: "lseek", 9: "mmap", 10: "mprotect", 11: "munmap",
	13: "rt_sigaction", 14: "rt_sigprocmask", 15: "rt_sigreturn", 16: "ioctl", 24: "sched_yield", 28: "madvise",
	35: "nanosleep", 39: "getpid", 41: "socket", 44: "sendto", 45: "recvfrom", 49: "bind", 51: "getsockname",
	54: "setsockopt", 56: "clone", 72: "fcntl", 73: "flock", 74: "fsync", 82: "rename", 131: "sigaltstack",
	137: "statfs", 138: "fstatfs", 186: "gettid", 202: "futex", 204: "sched_getaffinity", 217: "getdents64",
	230: "clock_nanosleep", 231: "exit_group", 232: "epoll_wait", 233: "epoll_ctl", 234: "tgkill", 257: "openat",
	262: "newfstatat", 263: "unlinkat", 267: "readlinkat", 281: "epoll_pwait", 290: "eventfd2", 291: "epoll_create1",
	302: "prlimit64", 308: "setns", 318: "getrandom", 332: "statx", 435: "clone3", 60: "exit", 89: "readlink",
	4: "stat", 6: "lstat", 2: "open", 7: "poll", 23: "select", 270: "pselect6", 271: "ppoll",
}

// top lists the n most frequent system calls.
func (s syscallCounts) top(n int) string {
	type kv struct {
		nr uint64
		c  int
	}
	var all []kv
	for nr, c := range s.ByNr {
		all = append(all, kv{nr, c})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].c > all[j].c || all[i].c == all[j].c && all[i].nr < all[j].nr })
	var out []string
	for i := 0; i < len(all) && i < n; i++ {
		name := sysNames[all[i].nr]
		if name == "" {
			name = fmt.Sprintf("#%d", all[i].nr)
		}
		out = append(out, fmt.Sprintf("%s=%d", name, all[i].c))
	}
	return strings.Join(out, " ")
}

// x86-64 syscall numbers of interest.
const (
	sysOpenat     = 257
	sysNewfstatat = 262
	sysReadlinkat = 267
	sysStatx      = 332
	sysSocket     = 41
	sysSendto     = 44
	sysRecvfrom   = 45
	sysSendmsg    = 46
	sysRecvmsg    = 47
	sysSetns      = 308
	sysFsync      = 74
	sysFdatasync  = 75
	sysFlock      = 73
	sysGetdents64 = 217
	sysRename     = 82
	sysRenameat   = 264
	sysRenameat2  = 316
	sysUnlinkat   = 263
	sysNanosleep  = 35
	sysClockNS    = 230
	sysMkdirat    = 258
	sysFchmodat   = 268
	sysFchmod     = 91
)

// trace runs the plugin under ptrace(PTRACE_SYSCALL), following every
// thread, and counts the system calls that matter for the cost of a call:
// netlink sockets and requests, namespace switches, sysfs and state-file
// accesses, fsyncs, sleeps. It is a measuring tool only; nothing of it is
// in the plugin.
func trace(c rig.Call) (syscallCounts, rig.Run, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	out, err := os.CreateTemp("", "trace-out")
	if err != nil {
		return syscallCounts{}, rig.Run{}, err
	}
	defer os.Remove(out.Name())
	defer out.Close()
	in, err := os.CreateTemp("", "trace-in")
	if err != nil {
		return syscallCounts{}, rig.Run{}, err
	}
	defer os.Remove(in.Name())
	defer in.Close()
	in.Write(c.Stdin)
	in.Seek(0, 0)

	bin := c.Bin
	if bin == "" {
		bin = rig.Plugin
	}
	cmd := exec.Command(bin)
	cmd.Env = callEnv(c)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = in, out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Ptrace: true}
	if err := cmd.Start(); err != nil {
		return syscallCounts{}, rig.Run{}, err
	}
	pid := cmd.Process.Pid
	var ws syscall.WaitStatus
	if _, err := syscall.Wait4(pid, &ws, syscall.WALL, nil); err != nil {
		return syscallCounts{}, rig.Run{}, err
	}
	const opts = syscall.PTRACE_O_TRACESYSGOOD | syscall.PTRACE_O_TRACECLONE | 0x100000 /* EXITKILL */
	if err := syscall.PtraceSetOptions(pid, opts); err != nil {
		return syscallCounts{}, rig.Run{}, err
	}
	syscall.PtraceSyscall(pid, 0)

	counts := syscallCounts{Cat: map[string]int{}, Paths: map[string]int{}, ByNr: map[uint64]int{}}
	inSys := map[int]bool{}
	var exitStatus syscall.WaitStatus
	for {
		wpid, err := syscall.Wait4(-1, &ws, syscall.WALL, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			break // ECHILD: all gone
		}
		if ws.Exited() || ws.Signaled() {
			if wpid == pid {
				exitStatus = ws
			}
			delete(inSys, wpid)
			continue
		}
		if !ws.Stopped() {
			continue
		}
		sig := ws.StopSignal()
		switch {
		case sig == syscall.SIGTRAP|0x80:
			if !inSys[wpid] {
				var regs syscall.PtraceRegs
				if syscall.PtraceGetRegs(wpid, &regs) == nil {
					counts.record(wpid, &regs)
				}
			}
			inSys[wpid] = !inSys[wpid]
			syscall.PtraceSyscall(wpid, 0)
		case sig == syscall.SIGTRAP || sig == syscall.SIGSTOP:
			// clone event, exec, or a new thread's first stop
			syscall.PtraceSyscall(wpid, 0)
		default:
			syscall.PtraceSyscall(wpid, int(sig))
		}
	}
	out.Seek(0, 0)
	var buf bytes.Buffer
	buf.ReadFrom(out)
	r := rig.Run{Stdout: buf.Bytes()}
	if exitStatus.ExitStatus() != 0 {
		r.Err = fmt.Errorf("exit status %d", exitStatus.ExitStatus())
	}
	return counts, r, nil
}

func callEnv(c rig.Call) []string {
	env := []string{"PATH=" + os.Getenv("PATH"), "CNI_COMMAND=" + c.Verb, "CNI_PATH=" + rig.CNIBinDir}
	if c.Verb != "VERSION" {
		env = append(env, "CNI_CONTAINERID="+c.ContainerID, "CNI_NETNS="+c.Netns, "CNI_IFNAME="+c.IfName)
	}
	return env
}

func peekString(pid int, addr uintptr) string {
	var b []byte
	buf := make([]byte, 64)
	for len(b) < 4096 {
		n, err := syscall.PtracePeekData(pid, addr+uintptr(len(b)), buf)
		if n <= 0 || err != nil {
			break
		}
		if i := bytes.IndexByte(buf[:n], 0); i >= 0 {
			return string(append(b, buf[:i]...))
		}
		b = append(b, buf[:n]...)
	}
	return string(b)
}

func (s *syscallCounts) record(pid int, r *syscall.PtraceRegs) {
	s.Total++
	nr := r.Orig_rax
	s.ByNr[nr]++
	path := func(addr uint64) {
		p := peekString(pid, uintptr(addr))
		var cat string
		switch {
		case strings.HasPrefix(p, "/sys/"):
			cat = "sysfs path ops"
		case strings.HasPrefix(p, rig.StateDir), strings.HasPrefix(p, "/run/stress-state"):
			cat = "state path ops"
		case strings.HasPrefix(p, "/proc/"):
			cat = "/proc path ops"
		case strings.HasPrefix(p, "/run/netns"), strings.HasPrefix(p, "/var/run/netns"):
			cat = "netns path ops"
		default:
			cat = "other path ops"
		}
		s.Cat[cat]++
		if cat == "sysfs path ops" || cat == "state path ops" {
			s.Paths[p]++
		}
	}
	switch nr {
	case sysOpenat, sysNewfstatat, sysReadlinkat, sysStatx, sysMkdirat, sysFchmodat, sysUnlinkat:
		path(r.Rsi)
	case sysSocket:
		if r.Rdi == syscall.AF_NETLINK {
			switch r.Rdx {
			case 20:
				s.Cat["netlink sockets (RDMA)"]++
			case 0:
				s.Cat["netlink sockets (route)"]++
			default:
				s.Cat[fmt.Sprintf("netlink sockets (proto %d)", r.Rdx)]++
			}
		} else {
			s.Cat["other sockets"]++
		}
	case sysSendto, sysSendmsg:
		s.Cat["netlink requests (sendto)"]++
	case sysRecvfrom, sysRecvmsg:
		s.Cat["netlink reads (recvfrom)"]++
	case sysSetns:
		s.Cat["setns"]++
	case sysFsync, sysFdatasync:
		s.Cat["fsync"]++
	case sysFlock:
		s.Cat["flock"]++
	case sysGetdents64:
		s.Cat["getdents64"]++
	case sysRename, sysRenameat, sysRenameat2:
		s.Cat["rename"]++
	case sysNanosleep, sysClockNS:
		s.Cat["sleeps"]++
	}
}

func (s syscallCounts) lines() []string {
	var keys []string
	for k := range s.Cat {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := []string{fmt.Sprintf("total syscalls=%d", s.Total)}
	for _, k := range keys {
		out = append(out, fmt.Sprintf("%s=%d", k, s.Cat[k]))
	}
	return out
}
