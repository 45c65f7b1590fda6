package spec

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestSettingsValidate(t *testing.T) {
	v34, v35, v36 := Version{Major: 3, Minor: 4, Patch: 23}, Version{Major: 3, Minor: 5, Patch: 35}, Version{Major: 3, Minor: 6, Patch: 16}
	tests := []struct {
		name    string
		s       Settings
		v       Version
		wantErr string
	}{
		{"none", nil, v34, ""},
		{"the common ones", Settings{"quota-backend-bytes": "8589934592", "snapshot-count": "50000", "heartbeat-interval": "200",
			"election-timeout": "2000", "max-request-bytes": "3145728", "max-concurrent-streams": "1000", "grpc-keepalive-timeout": "30s"}, v34, ""},
		{"a flag not on the list", Settings{"data-dir": "/tmp"}, v36, `"data-dir" is not an etcd flag etcd-manager sets`},
		{"not a number", Settings{"quota-backend-bytes": "8GiB"}, v36, "--quota-backend-bytes=\"8GiB\": want a whole number"},
		{"a negative quota", Settings{"quota-backend-bytes": "-1"}, v36, "want 0 to"},
		{"a quota beyond etcd's limit", Settings{"quota-backend-bytes": "200000000000"}, v36, "want 0 to"},
		{"not a duration", Settings{"grpc-keepalive-interval": "often"}, v36, "want a duration"},
		{"an over-long value", Settings{"snapshot-count": strings.Repeat("1", 100)}, v36, "a value of 100 bytes"},
		{"a flag this version lacks", Settings{"warning-apply-duration": "200ms"}, v35, "--warning-apply-duration is unknown to etcd 3.5.35"},
		{"a flag this version has", Settings{"warning-apply-duration": "200ms"}, v36, ""},
		{"an election timeout under 5 heartbeats", Settings{"heartbeat-interval": "300"}, v36, "--election-timeout (1000ms) must be at least 5 times --heartbeat-interval (300ms)"},
		{"both set, far enough apart", Settings{"heartbeat-interval": "300", "election-timeout": "1500"}, v36, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.s.Validate(tt.v)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, ErrSetting) {
				t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestSettingsUsableAndArgs(t *testing.T) {
	s := Settings{"warning-apply-duration": "200ms", "snapshot-count": "5000", "quota-backend-bytes": "x"}
	got, dropped := s.Usable(Version{Major: 3, Minor: 5, Patch: 35})
	if want := (Settings{"snapshot-count": "5000"}); !reflect.DeepEqual(got, want) {
		t.Errorf("usable on 3.5: %v, want %v", got, want)
	}
	if want := []string{"quota-backend-bytes", "warning-apply-duration"}; !reflect.DeepEqual(dropped, want) {
		t.Errorf("dropped on 3.5: %v, want %v", dropped, want)
	}
	if got, dropped := (Settings{}).Usable(Version{Major: 3, Minor: 6}); got != nil || dropped != nil {
		t.Errorf("usable of none: %v, %v", got, dropped)
	}
	args := Settings{"snapshot-count": "5000", "election-timeout": "2000"}.Args()
	if want := []string{"--election-timeout=2000", "--snapshot-count=5000"}; !reflect.DeepEqual(args, want) {
		t.Errorf("args %v, want %v", args, want)
	}
	if !Settings(nil).Equal(Settings{}) || Settings(nil).Equal(Settings{"snapshot-count": "1"}) {
		t.Error("Equal: nil and empty are the same; nil and one setting are not")
	}
}
