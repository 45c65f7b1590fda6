package cli

import (
	"bytes"
	"strings"
	"testing"
)

func TestNewLogger(t *testing.T) {
	var buf bytes.Buffer
	log, err := LogConfig{Level: "warn", Format: "json"}.NewLogger(&buf)
	if err != nil {
		t.Fatal(err)
	}
	log.Info("hidden")
	log.Warn("shown", "k", "v")
	if out := buf.String(); strings.Contains(out, "hidden") || !strings.Contains(out, `"msg":"shown"`) {
		t.Errorf("output %q", out)
	}
	if _, err := (LogConfig{Level: "loud", Format: "text"}).NewLogger(&buf); err == nil {
		t.Error("bad level accepted")
	}
	if _, err := (LogConfig{Level: "info", Format: "xml"}).NewLogger(&buf); err == nil {
		t.Error("bad format accepted")
	}
}
