package store

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

func TestWriteback(t *testing.T) {
	tests := []struct {
		name       string
		writes     []int
		wantBegun  int64
		wantLength int64
	}{
		{name: "small: nothing begun", writes: []int{1 << 20, 1 << 20}, wantBegun: 0, wantLength: 2 << 20},
		{name: "one chunk exactly", writes: []int{writebackChunk}, wantBegun: writebackChunk, wantLength: writebackChunk},
		{name: "chunks and a tail", writes: []int{3 << 20, 3 << 20, 3 << 20, 3 << 20, 3 << 20, 3 << 20, 1}, wantBegun: 18 << 20, wantLength: 18<<20 + 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "obj")
			f, err := os.Create(p)
			if err != nil {
				t.Fatal(err)
			}
			w := writeback(f)
			var want bytes.Buffer
			for i, n := range tt.writes {
				b := bytes.Repeat([]byte{byte('a' + i)}, n)
				want.Write(b)
				if m, err := w.Write(b); err != nil || m != n {
					t.Fatalf("write %d: %d, %v", i, m, err)
				}
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			if w.failed {
				t.Error("sync_file_range failed on this disk")
			}
			if w.begun != tt.wantBegun || w.written != tt.wantLength {
				t.Errorf("writeback begun for %d of %d bytes, want %d of %d", w.begun, w.written, tt.wantBegun, tt.wantLength)
			}
			got, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want.Bytes()) {
				t.Errorf("the file holds %d bytes, not the %d written", len(got), want.Len())
			}
		})
	}
}
