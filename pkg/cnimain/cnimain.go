// Package cnimain runs a CNI plugin's verbs under the CNI exec protocol: the
// CNI_* environment and the network configuration on stdin in, the result or
// a CNI error on stdout.
//
// It follows the CNI library's skel package: the same variables required per
// verb, the same validation of container ID, interface and network names, the
// same version checks and error codes. One check is left to the verbs: skel
// refuses, after ADD or DEL has run, a CNI_NETNS that is the plugin's own
// netns; the verb can refuse it before changing anything, from the identity
// of the netns it reads anyway (two stats of netns files cost ~0.5 ms of
// every exec in the test VM). It exists because skel's name check is
// a regular expression compiled at package init, and regexp also keeps the
// unicode category tables, which are built at init too: together ~2 ms of
// every exec in the test VM (GODEBUG=inittrace=1), paid on every ADD and DEL
// whether or not anything is validated.
package cnimain

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"slices"
	"strings"
	"unicode"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
)

// CmdArgs is one invocation: the CNI_* variables and the configuration.
type CmdArgs struct {
	ContainerID   string
	Netns         string
	IfName        string
	Args          string
	Path          string
	NetnsOverride string
	StdinData     []byte
}

// Funcs are the verbs; a nil verb succeeds without doing anything.
type Funcs struct {
	Add    func(*CmdArgs) error
	Del    func(*CmdArgs) error
	Check  func(*CmdArgs) error
	GC     func(*CmdArgs) error
	Status func(*CmdArgs) error
}

// Exec is what one exec of the plugin is given by its runtime.
type Exec struct {
	Getenv func(string) string
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
}

// Main runs the verb the environment names and exits 1 with the CNI error
// on stdout when it fails.
func Main(funcs Funcs, info version.PluginInfo, about string) {
	x := Exec{Getenv: os.Getenv, Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr}
	if e := x.Run(funcs, info, about); e != nil {
		if err := e.Print(); err != nil {
			log.Print("Error writing error JSON to stdout: ", err)
		}
		os.Exit(1)
	}
}

// The CNI_* variables in the order errors list them, and the verbs that
// require each. Only a required variable is validated, as skel does.
var envVars = []struct {
	name     string
	required []string
	validate func(string) *types.Error
}{
	{"CNI_COMMAND", nil, nil},
	{"CNI_CONTAINERID", []string{"ADD", "CHECK", "DEL"}, validateContainerID},
	{"CNI_NETNS", []string{"ADD", "CHECK"}, nil},
	{"CNI_IFNAME", []string{"ADD", "CHECK", "DEL"}, validateInterfaceName},
	{"CNI_ARGS", nil, nil},
	{"CNI_PATH", []string{"ADD", "CHECK", "DEL", "GC", "STATUS"}, nil},
	{"CNI_NETNS_OVERRIDE", nil, nil},
}

// minVersion is the first configuration version that has each verb.
var minVersion = map[string]string{
	"ADD":    "0.1.0",
	"DEL":    "0.1.0",
	"CHECK":  "0.4.0",
	"GC":     "1.1.0",
	"STATUS": "1.1.0",
}

// Run runs the verb and returns the CNI error to report, nil on success.
func (x Exec) Run(funcs Funcs, info version.PluginInfo, about string) *types.Error {
	cmd := x.Getenv("CNI_COMMAND")
	if cmd == "" && about != "" {
		fmt.Fprintln(x.Stderr, about)
		fmt.Fprintf(x.Stderr, "CNI protocol versions supported: %s\n", strings.Join(info.SupportedVersions(), ", "))
		return nil
	}
	if cmd == "VERSION" {
		if err := info.Encode(x.Stdout); err != nil {
			return types.NewError(types.ErrIOFailure, err.Error(), "")
		}
		return nil
	}
	verb := map[string]func(*CmdArgs) error{
		"ADD": funcs.Add, "DEL": funcs.Del, "CHECK": funcs.Check, "GC": funcs.GC, "STATUS": funcs.Status,
	}
	toCall, known := verb[cmd]
	if !known && cmd != "" {
		return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("unknown CNI_COMMAND: %v", cmd), "")
	}

	vals := make(map[string]string, len(envVars))
	var missing []string
	for _, v := range envVars {
		val := x.Getenv(v.name)
		vals[v.name] = val
		req := v.name == "CNI_COMMAND" || slices.Contains(v.required, cmd)
		switch {
		case val == "" && req:
			missing = append(missing, v.name)
		case val != "" && req && v.validate != nil:
			if err := v.validate(val); err != nil {
				return err
			}
		}
	}
	if len(missing) > 0 {
		return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("required env variables [%s] missing", strings.Join(missing, ",")), "")
	}

	stdin, err := io.ReadAll(x.Stdin)
	if err != nil {
		return types.NewError(types.ErrIOFailure, fmt.Sprintf("error reading from stdin: %v", err), "")
	}
	confVersion, e := checkConfig(stdin)
	if e != nil {
		return e
	}
	if e := checkVersion(cmd, confVersion, info); e != nil {
		return e
	}
	args := &CmdArgs{
		ContainerID:   vals["CNI_CONTAINERID"],
		Netns:         vals["CNI_NETNS"],
		IfName:        vals["CNI_IFNAME"],
		Args:          vals["CNI_ARGS"],
		Path:          vals["CNI_PATH"],
		NetnsOverride: vals["CNI_NETNS_OVERRIDE"],
		StdinData:     stdin,
	}
	if toCall == nil {
		return nil
	}
	if err := toCall(args); err != nil {
		var te *types.Error
		if errors.As(err, &te) {
			return te
		}
		return types.NewError(types.ErrInternal, err.Error(), "")
	}
	return nil
}

// checkConfig decodes the name and version once for every check that needs
// them; the verb decodes the rest.
func checkConfig(stdin []byte) (confVersion string, e *types.Error) {
	var conf struct {
		Name       string `json:"name"`
		CNIVersion string `json:"cniVersion"`
	}
	if err := json.Unmarshal(stdin, &conf); err != nil {
		return "", types.NewError(types.ErrDecodingFailure, fmt.Sprintf("error unmarshall network config: %v", err), "")
	}
	if conf.Name == "" {
		return "", types.NewError(types.ErrInvalidNetworkConfig, "missing network name", "")
	}
	if !validName(conf.Name) {
		return "", types.NewError(types.ErrInvalidNetworkConfig, "invalid characters found in network name", conf.Name)
	}
	if conf.CNIVersion == "" {
		return "0.1.0", nil // what the spec says an unversioned config is
	}
	return conf.CNIVersion, nil
}

// checkVersion requires the configuration to be new enough for the verb and
// a version the plugin speaks.
func checkVersion(cmd, confVersion string, info version.PluginInfo) *types.Error {
	newEnough, err := version.GreaterThanOrEqualTo(confVersion, minVersion[cmd])
	if err != nil {
		return types.NewError(types.ErrDecodingFailure, err.Error(), "")
	}
	if !newEnough {
		return types.NewError(types.ErrIncompatibleCNIVersion, fmt.Sprintf("config version does not allow %s", cmd), "")
	}
	if e := (&version.Reconciler{}).Check(confVersion, info); e != nil {
		return types.NewError(types.ErrIncompatibleCNIVersion, "incompatible CNI versions", e.Details())
	}
	return nil
}

// NetnsOverridden reports whether the runtime set CNI_NETNS_OVERRIDE: it
// runs the plugin inside the container's netns on purpose, so CNI_NETNS may
// be the plugin's own.
func (a *CmdArgs) NetnsOverridden() bool {
	return strings.EqualFold(a.NetnsOverride, "true") || a.NetnsOverride == "1"
}

// validName is the rule CNI applies to container IDs and network names:
// an ASCII letter or digit, then letters, digits, '_', '.' or '-'.
func validName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || c != '_' && c != '.' && c != '-') {
			return false
		}
	}
	return s != ""
}

func validateContainerID(id string) *types.Error {
	if !validName(id) {
		return types.NewError(types.ErrInvalidEnvironmentVariables, "invalid characters in containerID", id)
	}
	return nil
}

// maxIfNameLen is IFNAMSIZ less the terminating NUL.
const maxIfNameLen = 15

// validateInterfaceName applies the kernel's rules for a netdev name.
func validateInterfaceName(name string) *types.Error {
	if len(name) > maxIfNameLen {
		return types.NewError(types.ErrInvalidEnvironmentVariables, "interface name is too long", fmt.Sprintf("interface name should be less than %d characters", maxIfNameLen+1))
	}
	if name == "." || name == ".." {
		return types.NewError(types.ErrInvalidEnvironmentVariables, "interface name is . or ..", "")
	}
	if strings.ContainsFunc(name, func(r rune) bool { return r == '/' || r == ':' || unicode.IsSpace(r) }) {
		return types.NewError(types.ErrInvalidEnvironmentVariables, "interface name contains / or : or whitespace characters", "")
	}
	return nil
}
