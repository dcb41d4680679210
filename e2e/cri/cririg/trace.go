package cririg

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
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
# cririg's CNI trace: log the call, optionally hold it, run the real plugin
# (stdin, stdout and stderr are containerd's), log how it exited.
p=${0##*/}
for s in HUP INT PIPE TERM USR1 USR2 ALRM; do
  trap "echo \"\$p \$CNI_COMMAND-EXIT ${CNI_CONTAINERID:--} sig=$s\" >> %[1]s; exit 1" $s
done
echo "$p $CNI_COMMAND ${CNI_CONTAINERID:--} ${CNI_NETNS:--} ${CNI_IFNAME:--} ${CNI_ARGS:--}" >> %[1]s
if [ -e "%[2]s.$p.$CNI_COMMAND" ]; then
  echo "$CNI_CONTAINERID" > "%[3]s.$p.$CNI_COMMAND"
  while [ -e "%[2]s.$p.$CNI_COMMAND" ]; do sleep 0.05; done
fi
%[4]s/$p "$@"
rc=$?
echo "$p $CNI_COMMAND-EXIT ${CNI_CONTAINERID:--} rc=$rc" >> %[1]s
exit $rc
`
)

// TraceCNI writes wrappers for every plugin in CNIBinDir into TraceDir/bin
// and returns that directory, for Options.CNIBinDir. The log starts empty.
func TraceCNI() (string, error) {
	bin := filepath.Join(TraceDir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return "", err
	}
	plugins, err := os.ReadDir(CNIBinDir)
	if err != nil {
		return "", err
	}
	body := fmt.Sprintf(traceBody, traceLog, holdFlag, heldFlag, CNIBinDir)
	for _, p := range plugins {
		if err := os.WriteFile(filepath.Join(bin, p.Name()), []byte(body), 0o755); err != nil {
			return "", err
		}
	}
	return bin, os.WriteFile(traceLog, nil, 0o644)
}

// Call is one plugin call containerd made.
type Call struct {
	Plugin, Command, ContainerID, Netns, IfName string
	Args                                        map[string]string // CNI_ARGS
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

// ResetCalls empties the trace log.
func ResetCalls() error { return os.WriteFile(traceLog, nil, 0o644) }

// Hold makes the next calls of plugin with command (e.g. "rdma-netns",
// "ADD") wait before running the real plugin, until Release.
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
func WaitCallsDone(timeout time.Duration) (calls, sigpipe int, err error) {
	err = Wait(timeout, "every traced CNI call exited", func() (bool, error) {
		data, err := os.ReadFile(traceLog)
		if err != nil {
			return false, err
		}
		starts, pipes := 0, 0
		running := map[string]int{} // plugin, command, container -> calls not exited
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
			}
		}
		calls, sigpipe = starts, pipes
		var left []string
		for k, n := range running {
			if n != 0 {
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
