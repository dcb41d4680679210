package install

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
)

// ClaimsEntry is the entry `rdma-netns install --claims-entry` appends to
// the node's primary network: the plugin's "claims" mode, which attaches
// the NICs of a pod's claims that ask for it when the pod's sandbox is
// made (plugin/claims.go). Only its type and "claims" identify it.
func ClaimsEntry(name string) map[string]any {
	// The entry attaches NICs no NAD names: its log, in the node's
	// /var/log/rdma-netns, is where an operator finds what it did.
	return map[string]any{"type": name, "claims": true, "logFile": ClaimsLogFile}
}

// ClaimsLogFile is the claims entry's log file in /var/log/rdma-netns.
const ClaimsLogFile = "/var/log/rdma-netns/claims.log"

// multusTypes are the plugin types of Multus's own configuration: with
// Multus the node's primary file is Multus's, and the network it
// delegates the pod's first interface to (its cluster network, the first
// other file) is where the entry goes, so that it runs with and without
// Multus alike.
var multusTypes = map[string]bool{"multus": true, "multus-shim": true}

// PrimaryNetwork is the file of the node's primary network in the CNI
// configuration directory dir: the first .conflist, .conf or .json file
// by name, as the runtime picks it (libcni's order), passing over
// Multus's own file (whose cluster network is then the first other one).
func PrimaryNetwork(dir string) (string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return "", fmt.Errorf("cannot read the CNI configuration directory %s: %w (mount the host's /etc/cni/net.d there, or pass --cni-conf-dir)", dir, err)
	}
	var names []string
	for _, e := range ents {
		switch filepath.Ext(e.Name()) {
		case ".conflist", ".conf", ".json":
			if e.Type().IsRegular() {
				names = append(names, e.Name())
			}
		}
	}
	sort.Strings(names)
	for _, n := range names {
		path := filepath.Join(dir, n)
		types, err := pluginTypes(path)
		if err != nil {
			return "", err
		}
		if !anyOf(types, multusTypes) {
			return path, nil
		}
	}
	return "", fmt.Errorf("no network configuration in %s but Multus's: the node has no primary network yet (its CNI installs one); nothing was changed", dir)
}

func anyOf(types []string, set map[string]bool) bool {
	for _, t := range types {
		if set[t] {
			return true
		}
	}
	return false
}

// pluginTypes are the types of the plugins a configuration file runs.
func pluginTypes(path string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read %s: %w", path, err)
	}
	var conf struct {
		Type    string `json:"type"`
		Plugins []struct {
			Type string `json:"type"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(data, &conf); err != nil {
		return nil, fmt.Errorf("%s is not a network configuration (JSON): %w", path, err)
	}
	types := []string{conf.Type}
	for _, p := range conf.Plugins {
		types = append(types, p.Type)
	}
	return types, nil
}

// EnsureClaimsEntry makes the primary network's plugin list (PrimaryNetwork)
// end with the claims entry of the plugin installed as name, and reports
// the file and whether it changed it. The file is rewritten atomically
// (a temporary file in its directory, synced, renamed over it, its mode
// kept), with every other key and plugin as they were, so the runtime
// never reads half a file; an entry already there is left. A .conf file
// holds one plugin and no chain: it is refused, nothing changed.
func EnsureClaimsEntry(dir, name string) (string, bool, error) {
	path, err := PrimaryNetwork(dir)
	if err != nil {
		return "", false, err
	}
	changed, err := editPlugins(path, func(plugins []json.RawMessage) ([]json.RawMessage, bool, error) {
		if i := claimsEntryAt(plugins, name); i >= 0 {
			return plugins, false, nil
		}
		entry, err := json.Marshal(ClaimsEntry(name))
		if err != nil {
			return nil, false, err
		}
		return append(plugins, entry), true, nil
	})
	return path, changed, err
}

// RemoveClaimsEntry takes the claims entry out of the primary network,
// if it is there, as EnsureClaimsEntry writes.
func RemoveClaimsEntry(dir, name string) (string, bool, error) {
	path, err := PrimaryNetwork(dir)
	if err != nil {
		return "", false, err
	}
	changed, err := editPlugins(path, func(plugins []json.RawMessage) ([]json.RawMessage, bool, error) {
		i := claimsEntryAt(plugins, name)
		if i < 0 {
			return plugins, false, nil
		}
		return append(plugins[:i:i], plugins[i+1:]...), true, nil
	})
	return path, changed, err
}

// claimsEntryAt is the index of the claims entry among plugins, or -1.
func claimsEntryAt(plugins []json.RawMessage, name string) int {
	for i, raw := range plugins {
		var p struct {
			Type   string `json:"type"`
			Claims bool   `json:"claims"`
		}
		if json.Unmarshal(raw, &p) == nil && p.Type == name && p.Claims {
			return i
		}
	}
	return -1
}

// editPlugins rewrites the "plugins" list of the conflist at path with
// edit, when edit says it changed it.
func editPlugins(path string, edit func([]json.RawMessage) ([]json.RawMessage, bool, error)) (bool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return false, fmt.Errorf("cannot read %s: %w", path, err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		return false, fmt.Errorf("%s is not a network configuration (JSON): %w; nothing was changed", path, err)
	}
	raw, ok := top["plugins"]
	if !ok {
		return false, fmt.Errorf("%s holds one plugin, not a list (a .conf file): the runtime runs no chain from it, so rdma-netns cannot follow the primary plugin there; have the node's CNI write a .conflist; nothing was changed", path)
	}
	var plugins []json.RawMessage
	if err := json.Unmarshal(raw, &plugins); err != nil {
		return false, fmt.Errorf("%s: \"plugins\" is not a list: %w; nothing was changed", path, err)
	}
	plugins, changed, err := edit(plugins)
	if err != nil || !changed {
		return false, err
	}
	if top["plugins"], err = json.Marshal(plugins); err != nil {
		return false, err
	}
	out, err := json.MarshalIndent(top, "", "  ")
	if err != nil {
		return false, err
	}
	return true, replaceFile(path, append(out, '\n'))
}

// replaceFile writes data over path atomically, keeping path's mode.
func replaceFile(path string, data []byte) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	// A dotted name without a configuration's extension: the runtime's
	// loader never reads the temporary file as a network.
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".rdma-netns-")
	if err != nil {
		return fmt.Errorf("cannot write in %s: %w; %s is unchanged", dir, err, path)
	}
	tmp := f.Name()
	werr := func() error {
		if _, err := f.Write(data); err != nil {
			return err
		}
		if err := f.Chmod(fi.Mode().Perm()); err != nil {
			return err
		}
		return f.Sync()
	}()
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp, path)
	}
	if werr != nil {
		os.Remove(tmp)
		return fmt.Errorf("cannot replace %s: %w; it is unchanged", path, werr)
	}
	return syncDir(dir)
}

// FindClaimsEntry reports the primary network's file and whether its
// plugin list has the claims entry of the plugin installed as name.
func FindClaimsEntry(dir, name string) (string, bool, error) {
	path, err := PrimaryNetwork(dir)
	if err != nil {
		return "", false, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return path, false, err
	}
	var conf struct {
		Plugins []json.RawMessage `json:"plugins"`
	}
	if err := json.Unmarshal(data, &conf); err != nil {
		return path, false, fmt.Errorf("%s is not a network configuration (JSON): %w", path, err)
	}
	return path, claimsEntryAt(conf.Plugins, name) >= 0, nil
}
