package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
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
