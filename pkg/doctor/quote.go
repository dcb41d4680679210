package doctor

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// What the doctor prints comes partly from outside: a NAD's JSON, the
// names a pod gives its netdevs, /proc/PID/comm, files of the node. Two
// things keep that from acting on the person reading: the text report
// escapes every value for the terminal (termEscape, applied by the one
// writer, write.go), and every command
// printed for a person to paste quotes each name for the shell
// (shellWord), or is not printed when the name could not be pasted as
// shown (pasteable).

// termEscape is s with what a terminal would act on, rather than show,
// written out: C0 and C1 control characters (ESC, BEL, CR, newline, tab),
// DEL, other characters without a glyph (format characters such as
// bidirectional overrides) as \xNN or \uNNNN, and bytes that are not
// UTF-8 as \xNN. A backslash stays as it is: the shell quoting of a
// printed command (shellWord) must reach the terminal unchanged.
func termEscape(s string) string {
	if shownAsIs(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r < utf8.RuneSelf && !strconv.IsPrint(r):
			fmt.Fprintf(&b, `\x%02x`, r)
		case !strconv.IsPrint(r) && r > 0xffff:
			fmt.Fprintf(&b, `\U%08x`, r)
		case !strconv.IsPrint(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// shownAsIs says whether termEscape leaves s unchanged.
func shownAsIs(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f {
			return shownAsIsSlow(s[i:])
		}
	}
	return true
}

func shownAsIsSlow(s string) bool {
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if (r == utf8.RuneError && size <= 1) || !strconv.IsPrint(r) {
			return false
		}
		i += size
	}
	return true
}

// shellWord is s as one word of a POSIX shell, always in single quotes:
// inside them the shell gives no character a meaning, and a single quote
// of s closes them, is escaped with a backslash and reopens them. A name
// a pod chose (a netdev called `a;>X;`) thus stays one argument of the
// command a person pastes, and runs nothing.
func shellWord(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// pasteable says whether a command naming each of names can be printed for
// a person to paste: the text report shows each as it is (termEscape
// leaves it), so what is pasted names the same thing. A name with a
// control character or a byte that is not UTF-8 gets no command.
func pasteable(names ...string) bool {
	for _, n := range names {
		if !shownAsIs(n) {
			return false
		}
	}
	return true
}

// notPasteable replaces a command that pasteable refused.
const notPasteable = "no command is printed for it: a name in it holds a control character or a byte that is not UTF-8, which the report shows escaped (\\xNN), so a pasted command would not name it"

// someOf lists the first few of items and says how many others there are
// of total, as "a, b, c and 4,997 more": a report about one name that
// thousands of NADs share stays a line.
func someOf(items []string, total int) string {
	const few = 3
	if len(items) > few {
		items = items[:few]
	}
	s := strings.Join(items, ", ")
	if more := total - len(items); more > 0 {
		s += " and " + thousands(more) + " more"
	}
	return s
}

// thousands writes n with a comma every three digits.
func thousands(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0 && s[i-1] != '-'; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
