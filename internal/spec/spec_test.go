package spec

import (
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden file (run go test -update to create it): %v", err)
	}
	if string(got) != string(want) {
		t.Errorf("%s changed:\ngot:  %s\nwant: %s", name, got, want)
	}
}

func TestClusterSpecJSONGolden(t *testing.T) {
	data, err := json.Marshal(ClusterSpec{MemberCount: 3, EtcdVersion: "3.6.16"})
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "etcd-cluster-spec.json", data)

	back, err := DecodeClusterSpec(data)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, ClusterSpec{MemberCount: 3, EtcdVersion: "3.6.16"}) {
		t.Errorf("round trip: got %+v", back)
	}
}

func TestClusterCreatedJSONGolden(t *testing.T) {
	data, err := json.Marshal(ClusterCreated{Timestamp: 1547480961703914946, ClusterToken: "tok"})
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "etcd-cluster-created.json", data)
}

// The store format's writers disagree on int64 encoding (protobuf JSON
// writes strings, others numbers); both must read.
func TestDecodeStoreFormatVariants(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"spec-etcd-manager":   `{"memberCount":3,"etcdVersion":"3.4.13"}`,
		"spec-extra-fields":   `{"memberCount":1,"etcdVersion":"3.6.16","futureField":{"x":1}}`,
		"created-number":      `{"timestamp":1547480961703914946}`,
		"created-string":      `{"timestamp":"1547480961703914946"}`,
		"created-empty":       ``,
		"created-with-spaces": " {\n  \"timestamp\" : \"1547480961703914946\"\n}\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if s, err := DecodeClusterSpec(read("spec-etcd-manager")); err != nil || !reflect.DeepEqual(s, ClusterSpec{MemberCount: 3, EtcdVersion: "3.4.13"}) {
		t.Errorf("spec-etcd-manager: %+v, %v", s, err)
	}
	if s, err := DecodeClusterSpec(read("spec-extra-fields")); err != nil || !reflect.DeepEqual(s, ClusterSpec{MemberCount: 1, EtcdVersion: "3.6.16"}) {
		t.Errorf("spec-extra-fields: %+v, %v", s, err)
	}
	for _, name := range []string{"created-number", "created-string", "created-with-spaces"} {
		c, err := DecodeClusterCreated(read(name))
		if err != nil || c.Timestamp != 1547480961703914946 {
			t.Errorf("%s: %+v, %v", name, c, err)
		}
	}
	if c, err := DecodeClusterCreated(read("created-empty")); err != nil || c.Timestamp != 0 {
		t.Errorf("created-empty: %+v, %v", c, err)
	}
}

func TestInt64(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    Int64
		wantErr bool
	}{
		{name: "number", in: `42`, want: 42},
		{name: "string", in: `"42"`, want: 42},
		{name: "negative string", in: `"-7"`, want: -7},
		{name: "max", in: `"9223372036854775807"`, want: 9223372036854775807},
		{name: "null", in: `null`, want: 0},
		{name: "float", in: `4.2`, wantErr: true},
		{name: "junk string", in: `"abc"`, wantErr: true},
		{name: "overflow", in: `"9223372036854775808"`, wantErr: true},
		{name: "bool", in: `true`, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got Int64
			err := json.Unmarshal([]byte(tt.in), &got)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if !tt.wantErr && got != tt.want {
				t.Errorf("got %d, want %d", got, tt.want)
			}
		})
	}
	out, _ := json.Marshal(Int64(42))
	if string(out) != `"42"` {
		t.Errorf("marshal: %s", out)
	}
}

func TestDecodeClusterSpecErrors(t *testing.T) {
	for _, in := range []string{"", "   ", "{", "not json", `{"memberCount":"three"}`} {
		if _, err := DecodeClusterSpec([]byte(in)); err == nil {
			t.Errorf("DecodeClusterSpec(%q): no error", in)
		} else if !strings.HasPrefix(err.Error(), "spec: ") {
			t.Errorf("DecodeClusterSpec(%q): error %q lacks the package prefix", in, err)
		}
	}
}

func TestClusterSpecValidate(t *testing.T) {
	tests := []struct {
		name        string
		spec        ClusterSpec
		wantErr     error
		wantWarning string
	}{
		{name: "one member", spec: ClusterSpec{MemberCount: 1, EtcdVersion: "3.6.16"}},
		{name: "three members", spec: ClusterSpec{MemberCount: 3, EtcdVersion: "3.5.35"}},
		{name: "zero members", spec: ClusterSpec{MemberCount: 0, EtcdVersion: "3.6.16"}, wantErr: ErrInvalidMemberCount},
		{name: "negative members", spec: ClusterSpec{MemberCount: -1, EtcdVersion: "3.6.16"}, wantErr: ErrInvalidMemberCount},
		{name: "even members warn", spec: ClusterSpec{MemberCount: 4, EtcdVersion: "3.6.16"}, wantWarning: "even member count (4)"},
		{name: "two members warn", spec: ClusterSpec{MemberCount: 2, EtcdVersion: "3.6.16"}, wantWarning: "even member count (2)"},
		{name: "nine members", spec: ClusterSpec{MemberCount: MaxMemberCount, EtcdVersion: "3.6.16"}},
		{name: "more than nine members warn", spec: ClusterSpec{MemberCount: 11, EtcdVersion: "3.6.16"}, wantWarning: "a member count of 11 is above 9: every write waits for a majority of the members, so each one more slows writes; etcd advises 3 or 5 members, 7 at most"},
		{name: "no version", spec: ClusterSpec{MemberCount: 1, EtcdVersion: ""}, wantErr: ErrMissingVersion},
		{name: "v2", spec: ClusterSpec{MemberCount: 1, EtcdVersion: "2.2.1"}, wantErr: ErrV2Unsupported},
		{name: "unparsable", spec: ClusterSpec{MemberCount: 1, EtcdVersion: "three"}, wantErr: ErrInvalidVersion},
		{name: "too old", spec: ClusterSpec{MemberCount: 1, EtcdVersion: "3.3.10"}, wantErr: ErrVersionUnsupported},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			warnings, err := tt.spec.Validate()
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			joined := strings.Join(warnings, "\n")
			if tt.wantWarning == "" && joined != "" {
				t.Errorf("unexpected warnings: %s", joined)
			}
			if !strings.Contains(joined, tt.wantWarning) {
				t.Errorf("warnings %q lack %q", joined, tt.wantWarning)
			}
		})
	}
}

func TestOrdinal(t *testing.T) {
	tests := []struct {
		name string
		want int
		ok   bool
	}{
		{"etcd-0", 0, true},
		{"etcd-9", 9, true},
		{"etcd-10", 10, true},
		{"my-etcd-cluster-123", 123, true},
		{"etcd", 0, false},
		{"etcd-", 0, false},
		{"etcd-01", 0, false},
		{"etcd--1", 1, true},
		{"etcd-1a", 0, false},
		{"etcd-99999999", 0, false},
		{"Zk3mQ9vL2xP0aB7c", 0, false},
	}
	for _, tc := range tests {
		got, ok := Ordinal(tc.name)
		if got != tc.want || ok != tc.ok {
			t.Errorf("Ordinal(%q) = %d, %v; want %d, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}
