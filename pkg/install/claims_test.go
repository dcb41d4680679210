package install

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const bridgeConflist = `{
  "cniVersion": "1.0.0",
  "name": "cbr0",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}`

const multusConf = `{"cniVersion": "0.3.1", "name": "multus-cni-network", "type": "multus-shim", "logLevel": "verbose"}`

func pluginList(t *testing.T, path string) []map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Name    string           `json:"name"`
		Plugins []map[string]any `json:"plugins"`
	}
	if err := json.Unmarshal(data, &c); err != nil {
		t.Fatalf("%s: %v\n%s", path, err, data)
	}
	if c.Name != "cbr0" {
		t.Fatalf("%s lost its name: %s", path, data)
	}
	return c.Plugins
}

// The entry goes last in the primary network's chain, once: after the
// primary plugin and the others, which keep their settings, and the
// file its mode. Multus's own file, first by name, is passed over for
// the cluster network it delegates to. Removing it restores the chain.
func TestClaimsEntry(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "00-multus.conf"), multusConf, 0o600)
	bridge := filepath.Join(dir, "10-bridge.conflist")
	writeFile(t, bridge, bridgeConflist, 0o640)
	writeFile(t, filepath.Join(dir, "20-other.conflist"), strings.Replace(bridgeConflist, "cbr0", "other", 1), 0o644)

	for i, wantChanged := range []bool{true, false} {
		path, changed, err := EnsureClaimsEntry(dir, "rdma-netns")
		if err != nil || path != bridge || changed != wantChanged {
			t.Fatalf("EnsureClaimsEntry #%d = %s, %v, %v; want %s, %v", i+1, path, changed, err, bridge, wantChanged)
		}
	}
	ps := pluginList(t, bridge)
	if len(ps) != 3 || ps[0]["type"] != "bridge" || ps[1]["type"] != "portmap" || ps[2]["type"] != "rdma-netns" || ps[2]["claims"] != true {
		t.Fatalf("plugins %v: want bridge, portmap, then the claims entry once", ps)
	}
	if ipam, _ := ps[0]["ipam"].(map[string]any); ipam["type"] != "host-local" {
		t.Fatalf("bridge's settings changed: %v", ps[0])
	}
	if fi, _ := os.Stat(bridge); fi.Mode().Perm() != 0o640 {
		t.Fatalf("mode %v, want 0640 kept", fi.Mode().Perm())
	}
	if data, _ := os.ReadFile(filepath.Join(dir, "00-multus.conf")); string(data) != multusConf {
		t.Fatalf("Multus's file changed: %s", data)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 3 {
		t.Fatalf("files left in %s: %v", dir, ents)
	}

	if _, changed, err := RemoveClaimsEntry(dir, "rdma-netns"); err != nil || !changed {
		t.Fatalf("RemoveClaimsEntry = %v, %v", changed, err)
	}
	if ps := pluginList(t, bridge); len(ps) != 2 || ps[1]["type"] != "portmap" {
		t.Fatalf("plugins after removal %v", ps)
	}
	if _, changed, err := RemoveClaimsEntry(dir, "rdma-netns"); err != nil || changed {
		t.Fatalf("RemoveClaimsEntry again = %v, %v; want nothing to do", changed, err)
	}
}

// A primary network the entry cannot follow is refused, the file left as
// it was: a single-plugin .conf, a file that is not JSON, a directory
// with nothing but Multus's file.
func TestClaimsEntryRefused(t *testing.T) {
	for _, tt := range []struct {
		name, file, content, want string
	}{
		{"one plugin", "10-bridge.conf", `{"cniVersion":"1.0.0","name":"cbr0","type":"bridge"}`, "holds one plugin"},
		{"not JSON", "10-bridge.conflist", `{"plugins": [`, "not a network configuration"},
		{"only Multus", "00-multus.conf", multusConf, "no network configuration"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, tt.file)
			writeFile(t, path, tt.content, 0o644)
			_, changed, err := EnsureClaimsEntry(dir, "rdma-netns")
			if err == nil || changed || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("EnsureClaimsEntry = %v, %v; want an error saying %q", changed, err, tt.want)
			}
			if data, _ := os.ReadFile(path); string(data) != tt.content {
				t.Fatalf("%s changed: %s", path, data)
			}
		})
	}
}

// `rdma-netns install --claims-entry` appends the entry only after the
// binary is in place: a chain naming a missing plugin fails every pod.
func TestInstallClaimsEntryAfterBinary(t *testing.T) {
	bin, conf := t.TempDir(), t.TempDir()
	bridge := filepath.Join(conf, "10-bridge.conflist")
	writeFile(t, bridge, bridgeConflist, 0o644)
	var out, errb strings.Builder
	// An unusable destination: the copy fails, and the entry must not
	// be written.
	if code := Main([]string{"--dest", filepath.Join(bin, "missing"), "--claims-entry", "--cni-conf-dir", conf}, "test", &out, &errb); code != 1 {
		t.Fatalf("exit %d, want 1: %s", code, errb.String())
	}
	if ps := pluginList(t, bridge); len(ps) != 2 {
		t.Fatalf("the entry was written though the binary was not installed: %v", ps)
	}
	if code := Main([]string{"--dest", bin, "--claims-entry", "--cni-conf-dir", conf}, "test", &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if _, err := os.Stat(filepath.Join(bin, "rdma-netns")); err != nil {
		t.Fatal(err)
	}
	if ps := pluginList(t, bridge); len(ps) != 3 || ps[2]["claims"] != true {
		t.Fatalf("plugins %v, want the claims entry last", ps)
	}
	if !strings.Contains(out.String(), "appended the claims entry") {
		t.Fatalf("output %q does not say so", out.String())
	}
}

// The installer's container puts the entry back when the network's file
// is written again without it, but only while the binary it names is in
// place: without it the entry would fail every pod of the node.
func TestKeepClaimsEntryOnlyBesideTheBinary(t *testing.T) {
	old := claimsEntryRepair
	claimsEntryRepair = 20 * time.Millisecond
	t.Cleanup(func() { claimsEntryRepair = old })
	conf, bin := t.TempDir(), t.TempDir()
	bridge := filepath.Join(conf, "10-bridge.conflist")
	writeFile(t, bridge, bridgeConflist, 0o644)
	writeFile(t, filepath.Join(bin, "rdma-netns"), "#!/bin/true\n", 0o755)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	keepClaimsEntry(ctx, Options{Dest: bin, Name: "rdma-netns", CNIConfDir: conf}, io.Discard, io.Discard)
	has := func() bool { _, found, _ := FindClaimsEntry(conf, "rdma-netns"); return found }
	waitFor := func(want bool) bool {
		for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if has() == want {
				return true
			}
		}
		return false
	}
	// The network's agent writes its file again, without the entry.
	writeFile(t, bridge, bridgeConflist, 0o644)
	if !waitFor(true) {
		t.Fatal("the entry was not put back beside the binary")
	}
	if err := os.Remove(filepath.Join(bin, "rdma-netns")); err != nil {
		t.Fatal(err)
	}
	writeFile(t, bridge, bridgeConflist, 0o644)
	time.Sleep(10 * claimsEntryRepair)
	if has() {
		t.Fatal("the entry was put back though its binary is gone")
	}
}
