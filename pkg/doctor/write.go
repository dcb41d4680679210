package doctor

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// The report writer knows findings and sections of text, not the checks
// that made them. A view (what a run saw of the node, a pod or the NADs)
// gives its sections; the writer aligns their tables and, as the one
// place where what came from outside reaches a terminal, escapes every
// value in them (termEscape).

// section is one part of a view in the text report: a heading line and
// under it an aligned table, each row indented and its cells separated
// by tabs. Headings, header and cells are raw: the writer escapes them.
type section struct {
	heading string
	// header names the table's columns; nil for a table without one.
	header []string
	rows   [][]string
	// none is printed, indented, in place of a table without rows; ""
	// prints nothing.
	none string
}

// writeText writes the sections of a view, each followed by an empty
// line, then the findings, worst first within their original order, and
// the count of each severity.
func writeText(w io.Writer, sections []section, fs []Finding, summary map[Severity]int, exitCode int) error {
	b := &strings.Builder{}
	for _, s := range sections {
		b.WriteString(termEscape(s.heading) + "\n")
		switch {
		case len(s.rows) > 0:
			writeTable(b, s.header, s.rows)
		case s.none != "":
			b.WriteString("  " + s.none + "\n")
		}
		b.WriteString("\n")
	}
	b.WriteString("Findings\n")
	var rows [][]string
	for _, sev := range []Severity{Fail, Warn, OK} {
		for _, f := range fs {
			if f.Severity != sev {
				continue
			}
			rows = append(rows, []string{strings.ToUpper(string(f.Severity)), f.Check, dash(f.Subject), f.Reason})
			if f.Remedy != "" {
				rows = append(rows, []string{"", "", "", "fix: " + f.Remedy})
			}
		}
	}
	writeTable(b, nil, rows)
	fmt.Fprintf(b, "\n%d ok, %d warning(s), %d failure(s); exit status %d\n",
		summary[OK], summary[Warn], summary[Fail], exitCode)
	_, err := io.WriteString(w, b.String())
	return err
}

// writeTable aligns header and rows in columns two spaces apart, every
// cell escaped for the terminal.
func writeTable(w io.Writer, header []string, rows [][]string) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if header != nil {
		writeRow(tw, header)
	}
	for _, r := range rows {
		writeRow(tw, r)
	}
	tw.Flush()
}

func writeRow(w io.Writer, cells []string) {
	esc := make([]string, len(cells))
	for i, c := range cells {
		esc[i] = termEscape(c)
	}
	io.WriteString(w, "  "+strings.Join(esc, "\t")+"\n")
}

// writeJSON writes v as one indented JSON document.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
