package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode/utf8"

	"github.com/spf13/pflag"
)

// printJSON writes v as one indented JSON document.
func (a *app) printJSON(v any) error {
	enc := json.NewEncoder(a.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printJSONLine writes v as one JSON object on one line, for streams.
func (a *app) printJSONLine(v any) error {
	return json.NewEncoder(a.stdout).Encode(v)
}

// total adds up what at reads from each of xs, for a command's summary
// line.
func total[T any, N int64 | uint64](xs []T, at func(T) N) N {
	var n N
	for _, x := range xs {
		n += at(x)
	}
	return n
}

// jsonError is how an error reads on stderr under --json.
type jsonError struct {
	Error string `json:"error"`
	Code  int    `json:"code"`
}

// printError reports the error a command ended with on stderr: as
// {"error": ..., "code": <exit code>} under --json (asked for even when
// the flags did not parse), as "gantry: ..." otherwise.
func (a *app) printError(err error, code int, asked bool) {
	if a.json || asked {
		_ = json.NewEncoder(a.stderr).Encode(jsonError{Error: err.Error(), Code: code})
		return
	}
	fmt.Fprintf(a.stderr, "gantry: %v\n", err)
}

// printTable writes a header and rows as aligned columns.
func (a *app) printTable(header []string, rows [][]string) error {
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}

// defaultPage is how many rows a list command prints unless --limit or
// --all say otherwise: a week of a busy system must not flood a terminal.
const defaultPage = 100

// pageFlags are the paging flags every list command shares: --limit N
// (default defaultPage) and --all.
type pageFlags struct {
	limit int
	all   bool
}

func (p *pageFlags) register(fs *pflag.FlagSet, what string) {
	fs.IntVar(&p.limit, "limit", defaultPage, "show at most N "+what+" (--all for every one)")
	fs.BoolVar(&p.all, "all", false, "show every one of the "+what)
}

// check refuses a --limit below 1.
func (p pageFlags) check() error {
	if !p.all && p.limit < 1 {
		return usageError("--limit %d: want 1 or more, or --all", p.limit)
	}
	return nil
}

// max is the most rows to print; 0 means all.
func (p pageFlags) max() int {
	if p.all {
		return 0
	}
	return p.limit
}

// page keeps the first page of rows (the last, with last) and says on
// stderr how many it left out and how to see them.
func page[T any](a *app, p pageFlags, rows []T, what string, last bool) []T {
	n := p.max()
	if n == 0 || len(rows) <= n {
		return rows
	}
	a.morePages(n, strconv.Itoa(len(rows)), what)
	if last {
		return rows[len(rows)-n:]
	}
	return rows[:n]
}

// morePages says on stderr that shown of total rows were printed.
func (a *app) morePages(shown int, total, what string) {
	fmt.Fprintf(a.stderr, "showing %d of %s %s: --limit N or --all for more\n", shown, total, what)
}

// streamTable prints rows as they come (a tail), each column padded to
// its width so that the columns line up; a value wider than its column
// widens it from then on.
type streamTable struct {
	w      io.Writer
	widths []int
}

// newStreamTable prints the header; widths are the starting widths of the
// columns (at least each header's).
func newStreamTable(w io.Writer, header []string, widths []int) (*streamTable, error) {
	t := &streamTable{w: w, widths: make([]int, len(header))}
	for i, h := range header {
		t.widths[i] = len(h)
		if i < len(widths) {
			t.widths[i] = max(t.widths[i], widths[i])
		}
	}
	return t, t.row(header)
}

// row prints one row.
func (t *streamTable) row(cols []string) error {
	var b strings.Builder
	for i, c := range cols {
		if i == len(cols)-1 || i >= len(t.widths) {
			b.WriteString(c)
			break
		}
		t.widths[i] = max(t.widths[i], utf8.RuneCountInString(c))
		b.WriteString(c)
		b.WriteString(strings.Repeat(" ", t.widths[i]-utf8.RuneCountInString(c)+2))
	}
	b.WriteByte('\n')
	_, err := io.WriteString(t.w, b.String())
	return err
}
