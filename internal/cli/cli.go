package cli

import (
	"fmt"
	"io"
	"log/slog"
)

// LogConfig selects the log format and level.
type LogConfig struct {
	Level  string
	Format string
}

// DefaultLogConfig logs text at info level.
func DefaultLogConfig() LogConfig { return LogConfig{Level: "info", Format: "text"} }

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
