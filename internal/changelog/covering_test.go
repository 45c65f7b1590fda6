package changelog

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"
)

// Covering names the segments Apply reads, from headers alone: none
// below the snapshot's revision, the merged one rather than those it
// holds, and it refuses a gap or a target not captured yet as Apply does.
func TestCovering(t *testing.T) {
	ctx := context.Background()
	s := fileStore(t)
	at := func(r int64) time.Duration { return time.Duration(r-10) * 5 * time.Second }
	_, prev := storeSegments(t, s, mustHex(RunStart("tl1", 9)), &Base{Backup: "b", Revision: 9}, 10, 69, 5, at)
	// Minutes 0 to 3 merged: 10-24, 25-34, 35-49, 50-59 at level 1.
	m := &Merger{Store: s, Dir: t.TempDir(), Windows: []time.Duration{time.Minute, time.Hour}, Log: slog.New(slog.DiscardHandler)}
	if _, err := m.Once(ctx, "tl1", time.Unix(0, int64(4*time.Minute+10*time.Second))); err != nil {
		t.Fatal(err)
	}
	// A gap: 70-79 never written, then 80-84.
	storeSegments(t, s, prev, nil, 80, 84, 5, at)

	span := func(hs []Header) [][2]int64 {
		var out [][2]int64
		for _, h := range hs {
			out = append(out, [2]int64{h.First, h.Last})
		}
		return out
	}
	tests := []struct {
		name     string
		from, to int64
		want     [][2]int64
		wantErr  error
	}{
		{name: "within one merged segment", from: 12, to: 20, want: [][2]int64{{10, 24}}},
		{name: "across merged and cut", from: 30, to: 62, want: [][2]int64{{25, 34}, {35, 49}, {50, 59}, {60, 64}}},
		{name: "from a segment's last revision", from: 24, to: 25, want: [][2]int64{{25, 34}}},
		{name: "nothing to bring forward", from: 40, to: 40},
		{name: "into the gap", from: 60, to: 75, wantErr: ErrGap},
		{name: "past the last captured", from: 60, to: 90, wantErr: ErrGap},
		{name: "past the last captured, no gap", from: 81, to: 90, wantErr: ErrRange},
		{name: "across the gap", from: 60, to: 82, wantErr: ErrGap},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hs, err := Covering(ctx, s, "tl1", tt.from, tt.to)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Covering(%d, %d) = %v, %v; want %v", tt.from, tt.to, span(hs), err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := span(hs); len(got) != len(tt.want) || (len(got) > 0 && !equalSpans(got, tt.want)) {
				t.Errorf("Covering(%d, %d) = %v, want %v", tt.from, tt.to, got, tt.want)
			}
		})
	}
}

func equalSpans(a, b [][2]int64) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
