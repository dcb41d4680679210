// Command image builds the DaemonSet's multi-platform image from binaries
// built beforehand, without Docker: `make image` and `make push` run it.
//
//	image build -bin-dir DIR -bins rdma-netns[,NAME...] -platforms linux/amd64,linux/arm64 -tag REF -out LAYOUT [-dir PATH] [-symlinks PATH=TARGET,...] [-files PATH=FILE,...]
//	image push -layout LAYOUT REF
//
// build reads DIR/OS_ARCH/NAME for every platform and binary and writes an
// OCI image layout (the binaries at /NAME, or PATH/NAME with -dir, where
// another project's manifest runs them; -symlinks and -files add what a
// program expects of a distribution's root, such as /var/run=../run and
// /etc/passwd); push uploads that layout's image index to a registry
// and prints the reference by digest.
//
// It is a module of its own so that go-containerregistry never becomes a
// dependency of the plugin.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `Usage:
  image build -bin-dir DIR -bins NAME[,NAME...] -platforms OS/ARCH[,...] -tag REF -out LAYOUT [-dir PATH] [-symlinks PATH=TARGET,...] [-files PATH=FILE,...]
  image push -layout LAYOUT REF
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "build":
		err = buildCmd(args[1:], stdout, stderr)
	case "push":
		err = pushCmd(ctx, args[1:], stdout, stderr)
	default:
		fmt.Fprint(stderr, usage)
		return 2
	}
	if err == errUsage {
		return 2
	}
	if err != nil {
		fmt.Fprintf(stderr, "image %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

var errUsage = errors.New("usage")

func parse(fl *flag.FlagSet, args []string, stderr io.Writer) error {
	fl.SetOutput(stderr)
	if err := fl.Parse(args); err != nil {
		return errUsage
	}
	return nil
}

func buildCmd(args []string, stdout, stderr io.Writer) error {
	fl := flag.NewFlagSet("image build", flag.ContinueOnError)
	binDir := fl.String("bin-dir", "", "`DIR` holding OS_ARCH/NAME for every platform and binary")
	bins := fl.String("bins", "rdma-netns", "comma-separated binaries to put at /NAME; the first is the entrypoint")
	platforms := fl.String("platforms", "linux/amd64,linux/arm64", "comma-separated OS/ARCH")
	tag := fl.String("tag", "rdma-netns:dev", "reference recorded in the layout's index.json")
	out := fl.String("out", "", "OCI image layout `DIR` to write (replaced)")
	dir := fl.String("dir", "/", "directory `PATH` in the image that holds the binaries")
	symlinks := fl.String("symlinks", "", "comma-separated `PATH=TARGET` symlinks to add to the image")
	files := fl.String("files", "", "comma-separated `PATH=FILE`: FILE copied to PATH in the image (mode 0644)")
	if err := parse(fl, args, stderr); err != nil {
		return err
	}
	l := Layout{Dir: *dir}
	var err error
	if l.Symlinks, err = pairs("-symlinks", *symlinks, "PATH=TARGET", stderr); err != nil {
		return err
	}
	if l.Files, err = pairs("-files", *files, "PATH=FILE", stderr); err != nil {
		return err
	}
	if *binDir == "" || *out == "" || fl.NArg() > 0 {
		fmt.Fprintln(stderr, "image build: -bin-dir and -out are required, and nothing else")
		fl.PrintDefaults()
		return errUsage
	}
	ps, err := parsePlatforms(*platforms)
	if err != nil {
		return err
	}
	idx, err := Build(*binDir, strings.Split(*bins, ","), ps, l)
	if err != nil {
		return err
	}
	if err := WriteLayout(*out, *tag, idx); err != nil {
		return fmt.Errorf("write OCI layout %s: %w", *out, err)
	}
	desc, err := describe(idx)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "OCI layout %s (%s):\n%s", *out, *tag, desc)
	return nil
}

// pairs reads "A=B,C=D" into a map; each side must be set.
func pairs(flagName, s, want string, stderr io.Writer) (map[string]string, error) {
	m := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || v == "" {
			fmt.Fprintf(stderr, "image build: %s %q: want %s\n", flagName, kv, want)
			return nil, errUsage
		}
		m[k] = v
	}
	return m, nil
}

func pushCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fl := flag.NewFlagSet("image push", flag.ContinueOnError)
	dir := fl.String("layout", "", "OCI image layout `DIR` written by image build")
	if err := parse(fl, args, stderr); err != nil {
		return err
	}
	if *dir == "" || fl.NArg() != 1 {
		fmt.Fprintln(stderr, "image push: want -layout DIR and one image reference (registry/repository:tag)")
		return errUsage
	}
	if err := checkRegistryNamed(fl.Arg(0)); err != nil {
		return err
	}
	idx, err := ReadLayout(*dir)
	if err != nil {
		return err
	}
	ref, err := Push(ctx, idx, fl.Arg(0))
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "pushed %s\n", ref)
	return nil
}

// checkRegistryNamed refuses a reference without a registry host: the
// default IMAGE, rdma-netns:VERSION, would otherwise be pushed to Docker
// Hub's library/ namespace.
func checkRegistryNamed(ref string) error {
	first, _, found := strings.Cut(ref, "/")
	if !found || !strings.ContainsAny(first, ".:") && first != "localhost" {
		return fmt.Errorf("%s names no registry: set IMAGE=registry.example/rdma-netns:TAG (docker.io/USER/rdma-netns:TAG for Docker Hub)", ref)
	}
	_, err := name.ParseReference(ref)
	return err
}
