package spec

import (
	"errors"
	"strings"
	"testing"
)

// A token read from the store names folders on every node: the decoders
// refuse any token that could leave data/ or trash/.
func TestDecodersRefuseHostileTokens(t *testing.T) {
	for _, tc := range []struct {
		name, json string
		decode     func([]byte) error
		wantErr    string
	}{
		{"status restore token", `{"state":"running","restore":{"phase":"restoring","token":"../../../victim"}}`, decodeStatus, `the status's restore's token "../../../victim"`},
		{"status old token", `{"state":"running","restore":{"phase":"stopping","token":"ok","oldToken":"a/b"}}`, decodeStatus, "old token"},
		{"status parent token", `{"state":"running","restore":{"phase":"stopping","token":"ok","parentToken":".."}}`, decodeStatus, "parent token"},
		{"status node token", `{"state":"running","node":"n1","nodeToken":"x\u0000y"}`, decodeStatus, `node token "x\x00y"`},
		{"status with a control character", `{"state":"running","restore":{"token":"\u001b[2J"}}`, decodeStatus, `"\x1b[2J"`},
		{"status with a long token", `{"state":"running","restore":{"token":"` + strings.Repeat("a", 100) + `"}}`, decodeStatus, "(100 bytes)"},
		{"choice restore token", `{"term":1,"restore":{"token":"/etc"}}`, decodeChoice, `restore token "/etc"`},
		{"choice without a restore token", `{"term":1,"restore":{"members":["a"]}}`, decodeChoice, `restore token ""`},
		{"choice survivor token", `{"term":1,"survivor":"n1","survivorToken":"../x"}`, decodeChoice, "survivor token"},
		{"choice old token", `{"term":1,"restore":{"token":"ok","oldToken":"."}}`, decodeChoice, "old token"},
		{"good status", `{"state":"running","restore":{"phase":"restoring","token":"Ab-9_z","oldToken":"etcd-cluster-token-main"}}`, decodeStatus, ""},
		{"good status without a restore", `{"state":"running"}`, decodeStatus, ""},
		{"good choice", `{"term":1,"restore":{"token":"Ab-9_z"}}`, decodeChoice, ""},
		{"good survivor choice", `{"term":1,"survivor":"n1","survivorToken":"Ab-9_z"}`, decodeChoice, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.decode([]byte(tc.json))
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidToken) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("got %v, want ErrInvalidToken naming %s", err, tc.wantErr)
			}
		})
	}
}

func decodeStatus(b []byte) error { _, err := DecodeCommandStatus(b); return err }
func decodeChoice(b []byte) error { _, err := DecodeChoice(b); return err }

func TestQuoteShort(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"abc", `"abc"`},
		{"\x1b[2J\r", `"\x1b[2J\r"`},
		{strings.Repeat("x", 81), `"` + strings.Repeat("x", 80) + `"... (81 bytes)`},
	} {
		if got := QuoteShort(tc.in); got != tc.want {
			t.Errorf("QuoteShort(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
}
