package cririg

import (
	"bufio"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The CNI trace: a directory of wrappers, one per plugin, that log each
// call and exec the real plugin. containerd runs them when Options.CNIBinDir
// points at TraceDir/bin (containerd also passes that directory on as
// CNI_PATH, so host-device finds the traced static IPAM through it).
const (
	TraceDir  = Dir + "/cni-trace"
	traceLog  = TraceDir + "/calls"
	holdFlag  = TraceDir + "/hold"
	heldFlag  = TraceDir + "/held"
	traceBody = `#!/bin/sh
# cririg's CNI trace: log the call, optionally hold it before and after the
# real plugin runs (stdin, stdout and stderr are containerd's), log how it
# exited. A SIGKILLed wrapper logs nothing more: its pid tells it is gone.
p=${0##*/}
for s in HUP INT PIPE TERM USR1 USR2 ALRM; do
  trap "echo \"\$p \$CNI_COMMAND-EXIT ${CNI_CONTAINERID:--} sig=$s\" >> %[1]s; exit 1" $s
done
hold() {
  if [ -e "%[2]s.$p.$1" ]; then
    echo "$CNI_CONTAINERID" > "%[3]s.$p.$1"
    while [ -e "%[2]s.$p.$1" ]; do sleep 0.05; done
  fi
}
echo "$p $CNI_COMMAND ${CNI_CONTAINERID:--} ${CNI_NETNS:--} ${CNI_IFNAME:--} ${CNI_ARGS:--} pid=$$" >> %[1]s
hold "$CNI_COMMAND"
%[4]s/$p "$@"
rc=$?
hold "$CNI_COMMAND-RESULT"
echo "$p $CNI_COMMAND-EXIT ${CNI_CONTAINERID:--} rc=$rc" >> %[1]s
exit $rc
`
)

// TraceCNI writes wrappers for every plugin in CNIBinDir into TraceDir/bin
// and returns that directory, for Options.CNIBinDir. The log starts empty.
// later names plugins not installed yet that get a wrapper too (a
// DaemonSet installs them into CNIBinDir once the node runs); until then
// calling them fails as calling the missing plugin would.
func TraceCNI(later ...string) (string, error) {
	bin := filepath.Join(TraceDir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return "", err
	}
	plugins, err := os.ReadDir(CNIBinDir)
	if err != nil {
		return "", err
	}
	body := fmt.Sprintf(traceBody, traceLog, holdFlag, heldFlag, CNIBinDir)
	names := later
	for _, p := range plugins {
		names = append(names, p.Name())
	}
	for _, name := range names {
		if err := os.WriteFile(filepath.Join(bin, name), []byte(body), 0o755); err != nil {
			return "", err
		}
	}
	return bin, os.WriteFile(traceLog, nil, 0o644)
}

// Call is one plugin call containerd made.
type Call struct {
	Plugin, Command, ContainerID, Netns, IfName string
	Args                                        map[string]string // CNI_ARGS
	PID                                         int               // the wrapper's
}

// Calls reads the trace log.
func Calls() ([]Call, error) {
	f, err := os.Open(traceLog)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var calls []Call
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 5 || strings.HasSuffix(fs[1], "-EXIT") {
			continue
		}
		c := Call{Plugin: fs[0], Command: fs[1], ContainerID: fs[2], Netns: fs[3], IfName: fs[4], Args: map[string]string{}}
		if c.Netns == "-" {
			c.Netns = ""
		}
		if len(fs) > 6 {
			c.PID, _ = strconv.Atoi(strings.TrimPrefix(fs[6], "pid="))
		}
		if len(fs) > 5 && fs[5] != "-" {
			for _, kv := range strings.Split(fs[5], ";") {
				k, v, _ := strings.Cut(kv, "=")
				c.Args[k] = v
			}
		}
		calls = append(calls, c)
	}
	return calls, sc.Err()
}

// Exits are the exit statuses ("rc=0", "sig=TERM") the trace logged for
// plugin's calls of command for the container, in order.
func Exits(plugin, command, containerID string) ([]string, error) {
	data, err := os.ReadFile(traceLog)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range strings.Split(string(data), "\n") {
		fs := strings.Fields(l)
		if len(fs) == 4 && fs[0] == plugin && fs[1] == command+"-EXIT" && fs[2] == containerID {
			out = append(out, fs[3])
		}
	}
	return out, nil
}

// ResetCalls empties the trace log.
func ResetCalls() error { return os.WriteFile(traceLog, nil, 0o644) }

// Hold makes the next calls of plugin with command (e.g. "rdma-netns",
// "ADD") wait before running the real plugin, until Release. With command
// "ADD-RESULT" (any command and "-RESULT") they wait after the real plugin
// has done its work and written its result, before they exit.
func Hold(plugin, command string) error {
	os.Remove(heldFlag + "." + plugin + "." + command)
	return os.WriteFile(holdFlag+"."+plugin+"."+command, nil, 0o644)
}

// WaitHeld waits until a call is held by Hold and returns its container id.
func WaitHeld(plugin, command string, timeout time.Duration) (string, error) {
	var id string
	err := Wait(timeout, "a held "+plugin+" "+command, func() (bool, error) {
		data, err := os.ReadFile(heldFlag + "." + plugin + "." + command)
		id = strings.TrimSpace(string(data))
		return err == nil && id != "", nil
	})
	return id, err
}

// Release lets held calls run.
func Release(plugin, command string) error {
	os.Remove(heldFlag + "." + plugin + "." + command)
	return os.Remove(holdFlag + "." + plugin + "." + command)
}

// WaitCallsDone waits until every traced call has exited, including the
// ones a killed containerd left running, and returns how many there were
// and how many exited with SIGPIPE (141): a plugin whose containerd died
// is killed when it writes its result to the pipe nobody reads any more.
// A call whose wrapper was SIGKILLed (Killed) counts as exited.
func WaitCallsDone(timeout time.Duration) (calls, sigpipe int, err error) {
	err = Wait(timeout, "every traced CNI call exited", func() (bool, error) {
		data, err := os.ReadFile(traceLog)
		if err != nil {
			return false, err
		}
		starts, pipes := 0, 0
		running := map[string]int{} // plugin, command, container -> calls not exited
		pids := map[string][]int{}
		for _, l := range strings.Split(string(data), "\n") {
			fs := strings.Fields(l)
			switch {
			case len(fs) >= 4 && strings.HasSuffix(fs[1], "-EXIT"):
				running[fs[0]+" "+strings.TrimSuffix(fs[1], "-EXIT")+" "+fs[2]]--
				if fs[3] == "rc=141" {
					pipes++
				}
			case len(fs) >= 5:
				starts++
				running[fs[0]+" "+fs[1]+" "+fs[2]]++
				if len(fs) > 6 {
					pid, _ := strconv.Atoi(strings.TrimPrefix(fs[6], "pid="))
					pids[fs[0]+" "+fs[1]+" "+fs[2]] = append(pids[fs[0]+" "+fs[1]+" "+fs[2]], pid)
				}
			}
		}
		calls, sigpipe = starts, pipes
		var left []string
		for k, n := range running {
			if n != 0 && !allGone(pids[k]) {
				left = append(left, fmt.Sprintf("%s (%d)", k, n))
			}
		}
		if len(left) > 0 {
			return false, fmt.Errorf("still running: %v", left)
		}
		return true, nil
	})
	return calls, sigpipe, err
}

// Killed are the calls whose wrapper is gone without logging an exit: it
// was SIGKILLed (the trap logs every other signal), as libcni kills a
// plugin when containerd cancels the call's context.
func Killed() ([]Call, error) {
	calls, err := Calls()
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(traceLog)
	if err != nil {
		return nil, err
	}
	exits := map[string]int{}
	for _, l := range strings.Split(string(data), "\n") {
		if fs := strings.Fields(l); len(fs) >= 4 && strings.HasSuffix(fs[1], "-EXIT") {
			exits[fs[0]+" "+strings.TrimSuffix(fs[1], "-EXIT")+" "+fs[2]]++
		}
	}
	var killed []Call
	for _, c := range calls {
		k := c.Plugin + " " + c.Command + " " + c.ContainerID
		if exits[k] > 0 {
			exits[k]--
			continue
		}
		if c.PID != 0 && allGone([]int{c.PID}) {
			killed = append(killed, c)
		}
	}
	return killed, nil
}

// allGone tells whether no process of pids exists any more (and there is
// at least one).
func allGone(pids []int) bool {
	for _, pid := range pids {
		if pid == 0 || syscall.Kill(pid, 0) != syscall.ESRCH {
			return false
		}
	}
	return len(pids) > 0
}

// PrintCallCounts prints, under title, how often the runtime called each
// plugin with each command over the whole trace (a DEL without a netns,
// as RemovePodSandbox makes it, apart), for the notes on what a real
// runtime does. A trace that cannot be read is said on stderr.
func PrintCallCounts(title string) {
	calls, err := Calls()
	if err != nil {
		fmt.Fprintln(os.Stderr, "cni trace:", err)
		return
	}
	counts := map[string]int{}
	for _, c := range calls {
		k := c.Plugin + " " + c.Command
		if c.Command == "DEL" && c.Netns == "" {
			k += " (no netns)"
		}
		counts[k]++
	}
	fmt.Printf("=== %s ===\n", title)
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		fmt.Printf("%-32s %d\n", k, counts[k])
	}
}
