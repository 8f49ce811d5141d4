// Package logging builds gantry's one slog handler: tint on a terminal, JSON
// otherwise. Durations read as Go duration strings in both ("30s"), rounded
// for people in text.
package logging

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/lmittmann/tint"

	"github.com/gantry-dev/gantry/internal/clock"
)

// Format is a log output format.
type Format string

// The log formats. FormatAuto picks text on a terminal and JSON otherwise.
const (
	FormatAuto Format = "auto"
	FormatText Format = "text"
	FormatJSON Format = "json"
)

// New returns a logger writing to w in format at level ("debug", "info",
// "warn", "error").
func New(w io.Writer, format Format, level string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(strings.ToLower(level))); err != nil {
		return nil, fmt.Errorf("log level %q: want debug, info, warn or error", level)
	}
	switch format {
	case FormatAuto, "":
		if IsTerminal(w) {
			format = FormatText
		} else {
			format = FormatJSON
		}
	case FormatText, FormatJSON:
	default:
		return nil, fmt.Errorf("log format %q: want text or json", format)
	}
	if format == FormatText {
		return slog.New(tint.NewTextHandler(w, &tint.Options{
			Level:       lvl,
			TimeFormat:  time.TimeOnly,
			NoColor:     !IsTerminal(w),
			ReplaceAttr: durations(clock.Round),
		})), nil
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{
		Level:       lvl,
		ReplaceAttr: durations(func(d time.Duration) time.Duration { return d }),
	})), nil
}

// durations writes time.Duration values as Go duration strings ("30s",
// not 30000000000), after round: text logs round them for people
// (clock.Round), JSON logs keep them exact, in a form time.ParseDuration
// reads back.
func durations(round func(time.Duration) time.Duration) func([]string, slog.Attr) slog.Attr {
	return func(_ []string, a slog.Attr) slog.Attr {
		if a.Value.Kind() == slog.KindDuration {
			a.Value = slog.StringValue(round(a.Value.Duration()).String())
		}
		return a
	}
}

// IsTerminal reports whether w is a terminal (a character device), where
// people read: colours, progress lines.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
