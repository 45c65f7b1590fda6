package cli

import (
	"bytes"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func TestNormalizeArgs(t *testing.T) {
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	fs.Int("member-count", 0, "")
	fs.String("backup-store", "", "")
	fs.BoolP("verbose", "v", false, "")
	tests := []struct {
		name string
		in   []string
		want []string
	}{
		{name: "walkthrough spelling",
			in:   []string{"-member-count=1", "--backup-store=file:///tmp/x", "-etcd-version=3.6.16", "configure-cluster"},
			want: []string{"--member-count=1", "--backup-store=file:///tmp/x", "-etcd-version=3.6.16", "configure-cluster"}},
		{name: "single dash with separate value", in: []string{"-backup-store", "file:///x", "get"}, want: []string{"--backup-store", "file:///x", "get"}},
		{name: "shorthand untouched", in: []string{"-v"}, want: []string{"-v"}},
		{name: "after double dash untouched", in: []string{"--", "-member-count=1"}, want: []string{"--", "-member-count=1"}},
		{name: "positional untouched", in: []string{"restore-backup", "2019-01-14T15:29:48Z-000003"}, want: []string{"restore-backup", "2019-01-14T15:29:48Z-000003"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := NormalizeArgs(fs, tt.in)
			if strings.Join(got, " ") != strings.Join(tt.want, " ") {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

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
