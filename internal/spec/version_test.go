package spec

import (
	"errors"
	"testing"
)

func TestParseSupportedVersion(t *testing.T) {
	tests := []struct {
		in      string
		want    Version
		wantErr error
	}{
		{in: "3.6.16", want: Version{3, 6, 16, ""}},
		{in: "v3.5.35", want: Version{3, 5, 35, ""}},
		{in: "3.4.23", want: Version{3, 4, 23, ""}},
		{in: "3.7.0-rc.1", want: Version{3, 7, 0, "rc.1"}},
		{in: "2.2.1", wantErr: ErrV2Unsupported},
		{in: "2.3.8", wantErr: ErrV2Unsupported},
		{in: "3.3.27", wantErr: ErrVersionUnsupported},
		{in: "4.0.0", wantErr: ErrVersionUnsupported},
		{in: "3.6", wantErr: ErrInvalidVersion},
		{in: "latest", wantErr: ErrInvalidVersion},
		{in: "", wantErr: ErrInvalidVersion},
		{in: "3.6.16 ", wantErr: ErrInvalidVersion},
		{in: "3.6.x", wantErr: ErrInvalidVersion},
		{in: "3..6", wantErr: ErrInvalidVersion},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseSupportedVersion(tt.in)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if tt.wantErr == nil && got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestVersionCompareAndString(t *testing.T) {
	tests := []struct {
		a, b string
		want int
	}{
		{"3.6.16", "3.6.16", 0},
		{"3.5.35", "3.6.0", -1},
		{"3.6.2", "3.6.10", -1},
		{"3.7.0", "3.6.99", 1},
		{"3.6.0-rc.1", "3.6.0", -1},
		{"3.6.0-rc.2", "3.6.0-rc.1", 1},
	}
	for _, tt := range tests {
		a, _ := ParseVersion(tt.a)
		b, _ := ParseVersion(tt.b)
		if got := a.Compare(b); got != tt.want {
			t.Errorf("%s vs %s: got %d, want %d", tt.a, tt.b, got, tt.want)
		}
		if got := b.Compare(a); got != -tt.want {
			t.Errorf("%s vs %s: got %d, want %d", tt.b, tt.a, got, -tt.want)
		}
		if a.String() != tt.a {
			t.Errorf("String() = %q, want %q", a.String(), tt.a)
		}
	}
}
