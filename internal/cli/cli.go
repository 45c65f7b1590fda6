// Package cli holds what both commands share: the walkthrough's
// single-dash long flags, and the logger.
package cli

import (
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/spf13/pflag"
)

// NormalizeArgs rewrites single-dash long flags that fs knows, such as
// -member-count=1 or -backup-store X, into their double-dash form, so the
// spellings of the original etcd-manager walkthrough keep working with
// pflag. Shorthand flags (-h) and everything after "--" are left alone.
func NormalizeArgs(fs *pflag.FlagSet, args []string) []string {
	out := make([]string, 0, len(args))
	for i, arg := range args {
		if arg == "--" {
			return append(out, args[i:]...)
		}
		if len(arg) > 2 && arg[0] == '-' && arg[1] != '-' {
			name, _, _ := strings.Cut(arg[1:], "=")
			if len(name) > 1 && fs.Lookup(name) != nil {
				arg = "-" + arg
			}
		}
		out = append(out, arg)
	}
	return out
}

// LogConfig selects the log format and level.
type LogConfig struct {
	Level  string
	Format string
}

// DefaultLogConfig logs text at info level.
func DefaultLogConfig() LogConfig { return LogConfig{Level: "info", Format: "text"} }

// AddFlags registers --log-level and --log-format.
func (c *LogConfig) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Level, "log-level", c.Level, "log level: debug, info, warn or error")
	fs.StringVar(&c.Format, "log-format", c.Format, "log format: text or json")
}

// NewLogger builds a logger writing to w.
func (c LogConfig) NewLogger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.Level)); err != nil {
		return nil, fmt.Errorf("cli: --log-level %q: use debug, info, warn or error", c.Level)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch c.Format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	default:
		return nil, fmt.Errorf("cli: --log-format %q: use text or json", c.Format)
	}
}
