package lease

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/store"
)

// lenientStore is a store that does not honour create-if-absent, as some
// S3-compatible stores do not.
type lenientStore struct{ objects map[string]bool }

func (s *lenientStore) Create(_ context.Context, key string, _ []byte) error {
	s.objects[key] = true
	return nil
}
func (s *lenientStore) Delete(_ context.Context, key string) error {
	delete(s.objects, key)
	return nil
}

// downStore cannot be reached.
type downStore struct{}

func (downStore) Create(context.Context, string, []byte) error {
	return fmt.Errorf("%w: connection refused", store.ErrUnreachable)
}
func (downStore) Delete(context.Context, string) error { return nil }

func TestCheckCreateOnce(t *testing.T) {
	real := openLockStore(t)
	if err := CheckCreateOnce(t.Context(), real, "n1"); err != nil {
		t.Errorf("a file store: %v", err)
	}
	if keys, _ := real.List(t.Context(), probePrefix, ""); len(keys) != 0 {
		t.Errorf("the probe left %v", keys)
	}
	lenient := &lenientStore{objects: map[string]bool{}}
	if err := CheckCreateOnce(t.Context(), lenient, "n1"); !errors.Is(err, ErrUntrustedStore) {
		t.Errorf("a store that does not honour create-if-absent: %v, want ErrUntrustedStore", err)
	}
	if len(lenient.objects) != 0 {
		t.Errorf("the probe left %v", lenient.objects)
	}
	if err := CheckCreateOnce(t.Context(), downStore{}, "n1"); err == nil || errors.Is(err, ErrUntrustedStore) {
		t.Errorf("an unreachable store: %v, want an error to retry, not a verdict", err)
	}
}

func TestClockOffset(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name            string
		peer, sent, got time.Time
		want            time.Duration
		wantOK          bool
	}{
		{"in step", t0.Add(50 * time.Millisecond), t0, t0.Add(100 * time.Millisecond), 0, true},
		{"peer ahead", t0.Add(3 * time.Second), t0, t0.Add(200 * time.Millisecond), 2900 * time.Millisecond, true},
		{"peer behind", t0.Add(-time.Second), t0, t0, -time.Second, true},
		// A slow call bounds the offset too loosely: no sample, whether
		// it would hide a skew or invent one.
		{"peer behind, slow call", t0.Add(-time.Second), t0, t0.Add(5 * time.Second), 0, false},
		{"paused peer", t0.Add(5 * time.Second), t0, t0.Add(5*time.Second + time.Millisecond), 0, false},
		{"no clock reported", time.Time{}, t0, t0.Add(time.Second), 0, true},
	}
	for _, tt := range tests {
		if got, ok := ClockOffset(tt.peer, tt.sent, tt.got, 400*time.Millisecond); got != tt.want || ok != tt.wantOK {
			t.Errorf("%s: offset %s (a sample: %t), want %s (%t)", tt.name, got, ok, tt.want, tt.wantOK)
		}
	}
}
