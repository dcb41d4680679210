package nriplugin

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"

	"github.com/rdma-netns/rdma-netns/pkg/logging"
	"github.com/rdma-netns/rdma-netns/pkg/podadjust"
)

// DefaultLaunchedLog is where a runtime-launched plugin logs: the runtime
// discards its stdout and stderr.
const DefaultLaunchedLog = "/var/log/rdma-netns-nri.log"

// lockWait is how long a runtime-launched plugin waits for the lock. The
// runtime launches it while starting, before it opens the NRI socket, so
// the only holder it can find is an instance whose connection to the
// runtime's previous run has just ended and lets go at once; the wait
// stays well inside the runtime's registration timeout (5 s by default).
const lockWait = 2 * time.Second

// launchedAs tells whether the runtime launched this process from its NRI
// plugin directory (/opt/nri/plugins/IDX-NAME), and under which name. The
// runtime then hands it an inherited socket, its name and index in the
// environment; the NRI stub reads them, and any socket, name or index of
// ours would override them and break the registration.
func launchedAs() (string, bool) {
	if os.Getenv(api.PluginSocketEnvVar) == "" {
		return "", false
	}
	return os.Getenv(api.PluginIdxEnvVar) + "-" + os.Getenv(api.PluginNameEnvVar), true
}

// runLaunched serves the one connection the runtime handed over, with the
// flags from the runtime's configuration of the plugin (handed in
// Configure), and returns when the runtime closes it: the runtime starts
// the plugin again when it starts again.
func runLaunched(ctx context.Context, name string, o Options, policy podadjust.Policy) int {
	file := o.LogFile
	if file == "" {
		file = DefaultLaunchedLog
	}
	log := logging.New(file, o.LogLevel, "")
	who := fmt.Sprintf("%s, pid %d, launched by the runtime", name, os.Getpid())
	lk, holder, err := waitLock(o.Lock, who, lockWait)
	if err != nil {
		log.Errorf("%v; not serving: the DaemonSet's instance, if any, serves", err)
		return 1
	}
	if lk == nil {
		log.Errorf("another rdma-netns-nri (%s) still holds %s after %s; not serving, so that two never adjust one container", holder, o.Lock, lockWait)
		return 1
	}
	defer lk.release()
	p := newPlugin(policy, log, who)
	p.launched = true
	log.Infof("rdma-netns-nri %s: started by the runtime, holding %s", name, o.Lock)
	st, err := stub.New(p, stub.WithLogger(nriLogger{log}), stub.WithOnClose(func() {
		log.Infof("the runtime closed the NRI connection; exiting (the runtime starts the plugin again when it starts)")
	}))
	if err != nil {
		log.Errorf("cannot set up the NRI plugin: %v", err)
		return 1
	}
	if err := st.Run(ctx); err != nil && ctx.Err() == nil {
		log.Infof("connection ended: %v", err)
	}
	return 0
}

// parseConfig reads the runtime's configuration of a launched plugin
// (/etc/nri/conf.d/IDX-NAME.conf, which rdma-netns install writes): the
// plugin's own flags, separated by blanks or lines, `#` starting a
// comment. What the runtime hands over (socket, index) cannot be set, nor
// the lock, taken before the configuration arrives.
func parseConfig(config string) (Options, error) {
	var args []string
	for _, line := range strings.Split(config, "\n") {
		line, _, _ = strings.Cut(line, "#")
		args = append(args, strings.Fields(line)...)
	}
	var o Options
	fl := FlagSet(&o)
	fl.SetOutput(io.Discard)
	if err := fl.Parse(args); err != nil {
		return o, fmt.Errorf("configuration %q: %v", args, err)
	}
	if fl.NArg() > 0 {
		return o, fmt.Errorf("configuration: unexpected argument %q", fl.Arg(0))
	}
	var bad []string
	fl.Visit(func(f *flag.Flag) {
		if f.Name == "socket" || f.Name == "index" || f.Name == "lock" || f.Name == "check-config" {
			bad = append(bad, "--"+f.Name)
		}
	})
	if len(bad) > 0 {
		return o, fmt.Errorf("configuration sets %s, which the runtime (socket, index) or the command line (lock, check-config) decides for a plugin the runtime launches", strings.Join(bad, ", "))
	}
	if _, err := o.Policy(); err != nil {
		return o, fmt.Errorf("configuration: %v", err)
	}
	return o, nil
}

// configure applies the runtime's configuration of a launched plugin: the
// node's policy and where and how much to log.
func (p *plugin) configure(config string) error {
	o, err := parseConfig(config)
	if err != nil {
		p.log.Errorf("%v: not serving (fix the file in the runtime's plugin_config_path, /etc/nri/conf.d, and restart the runtime)", err)
		return err
	}
	policy, _ := o.Policy()
	if o.LogFile != "" || o.LogLevel != "info" {
		file := o.LogFile
		if file == "" {
			file = DefaultLaunchedLog
		}
		p.log = logging.New(file, o.LogLevel, "")
	}
	p.adj.Policy = policy
	p.log.Infof("rdma-netns-nri: configuration from the runtime: %s", settings(policy, o))
	return nil
}

// ConfigOK starts the line checkConfig prints for a good file.
const ConfigOK = "rdma-netns-nri: configuration ok:"

// checkConfig is --check-config: rdma-netns install runs the copy it
// installs on the configuration file it writes, to prove both.
func checkConfig(path string, w io.Writer) int {
	data, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintf(w, "rdma-netns-nri: %v\n", err)
		return 1
	}
	o, err := parseConfig(string(data))
	if err != nil {
		fmt.Fprintf(w, "rdma-netns-nri: %s: %v\n", path, err)
		return 1
	}
	policy, _ := o.Policy()
	fmt.Fprintf(w, "%s %s\n", ConfigOK, settings(policy, o))
	return 0
}
