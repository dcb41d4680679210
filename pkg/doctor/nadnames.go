package doctor

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// The name checks of `doctor nads` compare every NAD with every other, but
// report one finding per prefix, per NAD or per name, each naming a few of
// the NADs concerned and counting the rest: a cluster of thousands of
// NADs under one prefix gets a report of a few lines, not one per pair.

// nameUse is what one rdma-netns entry lets pods call their device.
type nameUse struct {
	ref     nadRef
	devName string
	prefix  string
}

func nameUses(nads []*parsedNAD) []nameUse {
	var uses []nameUse
	for _, n := range nads {
		for _, c := range n.confs {
			if c.RdmaDevName != "" || c.PodRdmaDevNamePrefix != "" {
				uses = append(uses, nameUse{n.ref, c.RdmaDevName, c.PodRdmaDevNamePrefix})
			}
		}
	}
	return uses
}

// prefixUse is one NAD's podRdmaDevNamePrefix; at is its place among
// them, in input order.
type prefixUse struct {
	ref    nadRef
	prefix string
	at     int
}

// prefixIndex holds the prefixes of the NADs, each NAD's once, and finds
// those that start with a prefix or that a prefix starts with.
type prefixIndex struct {
	uses []prefixUse
	// order is the distinct prefixes in the order of their first use.
	order []string
	// holders are, by prefix and by prefix and namespace, the places of
	// the uses with that prefix, ascending.
	holders   map[string][]int
	holdersNS map[prefixNS][]int
	// below are the places of the uses whose prefix starts with the
	// key and is longer, ascending; belowNS the same by namespace.
	below   map[string][]int
	belowNS map[prefixNS][]int
}

type prefixNS struct{ prefix, namespace string }

func newPrefixIndex(uses []nameUse) *prefixIndex {
	x := &prefixIndex{holders: map[string][]int{}, holdersNS: map[prefixNS][]int{}, below: map[string][]int{}, belowNS: map[prefixNS][]int{}}
	seen := map[prefixUse]bool{}
	for _, u := range uses {
		pu := prefixUse{ref: u.ref, prefix: u.prefix}
		if u.prefix == "" || seen[pu] {
			continue
		}
		seen[pu] = true
		pu.at = len(x.uses)
		x.uses = append(x.uses, pu)
		if x.holders[u.prefix] == nil {
			x.order = append(x.order, u.prefix)
		}
		x.holders[u.prefix] = append(x.holders[u.prefix], pu.at)
		k := prefixNS{u.prefix, u.ref.Namespace}
		x.holdersNS[k] = append(x.holdersNS[k], pu.at)
	}
	// A prefix is a valid RDMA device name, at most 63 bytes: each use
	// is below at most 62 shorter prefixes.
	for _, pu := range x.uses {
		for _, a := range x.above(pu.prefix) {
			x.below[a] = append(x.below[a], pu.at)
			k := prefixNS{a, pu.ref.Namespace}
			x.belowNS[k] = append(x.belowNS[k], pu.at)
		}
	}
	return x
}

// above are the prefixes in use that p starts with and is longer than.
func (x *prefixIndex) above(p string) []string {
	var out []string
	for k := 1; k < len(p); k++ {
		if x.holders[p[:k]] != nil {
			out = append(out, p[:k])
		}
	}
	return out
}

// placesAfter is how many of the places at (ascending) come after place i.
func placesAfter(at []int, i int) int {
	return len(at) - sort.SearchInts(at, i+1)
}

// nameSquats finds a prefix under which pods may take the rdmaDevName of
// another NAD: first come on each node until the plugin has reserved the
// name there for the network that used it. One finding per prefix.
func (fs *Findings) nameSquats(uses []nameUse, x *prefixIndex) {
	type named struct {
		name string
		ref  nadRef
	}
	var names []named
	byRef := map[nadRef][]string{}
	seen := map[named]bool{}
	for _, u := range uses {
		n := named{u.devName, u.ref}
		if u.devName == "" || seen[n] {
			continue
		}
		seen[n] = true
		names = append(names, n)
		byRef[u.ref] = append(byRef[u.ref], u.devName)
	}
	sort.SliceStable(names, func(i, j int) bool { return names[i].name < names[j].name })
	for _, p := range x.order {
		// The names that start with p and go on after it are together
		// in sorted order.
		lo := sort.Search(len(names), func(i int) bool { return names[i].name > p })
		hi := lo + sort.Search(len(names)-lo, func(i int) bool { return !strings.HasPrefix(names[lo+i].name, p) })
		holders := x.refs(x.holders[p])
		// A NAD's own name under its own prefix is no squat; with two
		// NADs holding p, any name is another's.
		var own nadRef
		total := hi - lo
		if len(holders) == 1 {
			own = holders[0]
			for _, n := range byRef[own] {
				if len(n) > len(p) && strings.HasPrefix(n, p) {
					total--
				}
			}
		}
		if total == 0 {
			continue
		}
		var taken []named
		for i := lo; i < hi && len(taken) < 3; i++ {
			if len(holders) > 1 || names[i].ref != own {
				taken = append(taken, names[i])
			}
		}
		if len(holders) == 1 && total == 1 {
			fs.squat(holders[0], p, taken[0].name, taken[0].ref)
			continue
		}
		var listed []string
		for _, n := range taken {
			listed = append(listed, fmt.Sprintf("%s (%s)", n.name, n.ref))
		}
		fs.add(Warn, "name-squat", holders[0].String(), fmt.Sprintf(
			"pods of %s (podRdmaDevNamePrefix %s) may name their device with %s rdmaDevName(s) other NADs give their pods: %s; on a node where no pod of such a NAD has run yet, a pod with the prefix can take its name first and that NAD's pods then fail there",
			refList(holders), p, thousands(total), someOf(listed, total)),
			fmt.Sprintf("keep podRdmaDevNamePrefix disjoint from every rdmaDevName: change the podRdmaDevNamePrefix %s, or the rdmaDevName of each NAD listed", p))
	}
}

// squat reports one NAD whose prefix covers one other NAD's name.
func (fs *Findings) squat(x nadRef, p, name string, y nadRef) {
	fs.add(Warn, "name-squat", x.String(), fmt.Sprintf(
		"pods of %s may name their device %s (podRdmaDevNamePrefix %s), the name %s gives its pods (rdmaDevName); on a node where no pod of %s has run yet, a pod of %s can take it first and %s's pods then fail there",
		x, name, p, y, y, x, y),
		fmt.Sprintf("keep podRdmaDevNamePrefix disjoint from every rdmaDevName: change %s's podRdmaDevNamePrefix or %s's rdmaDevName", x, y))
}

func (x *prefixIndex) refs(at []int) []nadRef {
	out := make([]nadRef, 0, len(at))
	for _, i := range at {
		out = append(out, x.uses[i].ref)
	}
	return out
}

// refList names a few of refs and counts the others.
func refList(refs []nadRef) string {
	var s []string
	for _, r := range refs[:min(len(refs), 3)] {
		s = append(s, r.String())
	}
	return someOf(s, len(refs))
}

const overlapRemedy = "give the namespaces prefixes neither of which starts with the other"

// prefixOverlaps finds prefixes of NADs in different namespaces under
// which pods of both may ask for the same names: one finding per prefix
// that NADs of several namespaces share, and one per NAD for the NADs
// after it, in other namespaces, whose prefix starts with its own or that
// its own starts with.
func (fs *Findings) prefixOverlaps(x *prefixIndex) {
	for _, u := range x.uses {
		if at := x.holders[u.prefix]; at[0] == u.at {
			fs.samePrefix(x, u.prefix, at)
		}
		fs.nestedPrefixes(x, u)
	}
}

// samePrefix reports the NADs at places at, all with prefix p, when they
// are of more than one namespace.
func (fs *Findings) samePrefix(x *prefixIndex, p string, at []int) {
	refs := x.refs(at)
	namespaces := map[string]bool{}
	for _, ref := range refs {
		namespaces[ref.Namespace] = true
	}
	if len(namespaces) < 2 {
		return
	}
	if len(refs) == 2 {
		fs.overlapPair(refs[0], p, refs[1], p)
		return
	}
	fs.add(OK, "name-prefix-overlap", refs[0].String(), fmt.Sprintf(
		"pods of %s NADs in %s namespaces, %s, all with podRdmaDevNamePrefix %s, may ask for the same device names: on a node the first pod to take a name has it, and the others' ADD fails",
		thousands(len(refs)), thousands(len(namespaces)), refList(refs), p), overlapRemedy)
}

// nestedPrefixes reports the uses after u, in other namespaces, whose
// prefix starts with u's and is longer, or is shorter and u's starts with
// it.
func (fs *Findings) nestedPrefixes(x *prefixIndex, u prefixUse) {
	ns := u.ref.Namespace
	lists := [][]int{x.below[u.prefix]}
	total := placesAfter(x.below[u.prefix], u.at) - placesAfter(x.belowNS[prefixNS{u.prefix, ns}], u.at)
	for _, a := range x.above(u.prefix) {
		lists = append(lists, x.holders[a])
		total += placesAfter(x.holders[a], u.at) - placesAfter(x.holdersNS[prefixNS{a, ns}], u.at)
	}
	if total == 0 {
		return
	}
	// The first few of them in input order: the first few of each list.
	var first []int
	for _, l := range lists {
		n := 0
		for _, i := range l[sort.SearchInts(l, u.at+1):] {
			if n == 3 {
				break
			}
			if x.uses[i].ref.Namespace != ns {
				first = append(first, i)
				n++
			}
		}
	}
	slices.Sort(first)
	first = first[:min(len(first), 3)]
	if total == 1 {
		y := x.uses[first[0]]
		fs.overlapPair(u.ref, u.prefix, y.ref, y.prefix)
		return
	}
	var listed []string
	for _, i := range first {
		listed = append(listed, fmt.Sprintf("%s (podRdmaDevNamePrefix %s)", x.uses[i].ref, x.uses[i].prefix))
	}
	fs.add(OK, "name-prefix-overlap", u.ref.String(), fmt.Sprintf(
		"pods of %s (podRdmaDevNamePrefix %s) and of %s NADs in other namespaces whose prefix starts with it or that it starts with, %s, may ask for the same device names: on a node the first pod to take a name has it, and the other's ADD fails",
		u.ref, u.prefix, thousands(total), someOf(listed, total)), overlapRemedy)
}

// overlapPair reports two NADs of different namespaces whose prefixes overlap.
func (fs *Findings) overlapPair(x nadRef, px string, y nadRef, py string) {
	fs.add(OK, "name-prefix-overlap", x.String(), fmt.Sprintf(
		"pods of %s (podRdmaDevNamePrefix %s) and of %s (podRdmaDevNamePrefix %s), in another namespace, may ask for the same device names: on a node the first pod to take a name has it, and the other's ADD fails",
		x, px, y, py), overlapRemedy)
}

// sharedDevNames finds an rdmaDevName set by several NADs: device names
// are node-wide, so one pod per node across them can have it.
func (fs *Findings) sharedDevNames(uses []nameUse) {
	byName := map[string][]nadRef{}
	seen := map[nameUse]bool{}
	var names []string
	for _, u := range uses {
		k := nameUse{ref: u.ref, devName: u.devName}
		if u.devName == "" || seen[k] {
			continue
		}
		seen[k] = true
		if byName[u.devName] == nil {
			names = append(names, u.devName)
		}
		byName[u.devName] = append(byName[u.devName], u.ref)
	}
	for _, name := range names {
		if refs := byName[name]; len(refs) > 1 {
			fs.add(OK, "shared-dev-name", name, fmt.Sprintf(
				"%s all set rdmaDevName %s: RDMA device names are unique on a node, so one pod per node across these NADs can hold it",
				refList(refs), name),
				"give each NAD its own rdmaDevName where their pods must share nodes")
		}
	}
}
