package controller

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/etcd-manager/etcd-manager/internal/lease"
	"github.com/etcd-manager/etcd-manager/internal/membership"
	"github.com/etcd-manager/etcd-manager/internal/procedure"
)

func TestFailures(t *testing.T) {
	t0 := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	boom := errors.New("boom")
	for _, tt := range []struct {
		name        string
		failed      map[string][]time.Duration // failures of each key, after t0
		succeeded   []string
		at          time.Duration
		backingOff  []string
		left        int // after prune
		retryOfAddA time.Duration
	}{
		{name: "one failure backs off 5s", failed: map[string][]time.Duration{"add a": {0}},
			at: time.Second, backingOff: []string{"add a"}, left: 1, retryOfAddA: 5 * time.Second},
		{name: "the backoff doubles", failed: map[string][]time.Duration{"add a": {0, 5 * time.Second, 15 * time.Second}},
			at: 30 * time.Second, backingOff: []string{"add a"}, left: 1, retryOfAddA: 35 * time.Second},
		{name: "the backoff ends", failed: map[string][]time.Duration{"add a": {0}},
			at: 6 * time.Second, left: 1, retryOfAddA: 5 * time.Second},
		{name: "a success forgets", failed: map[string][]time.Duration{"add a": {0}, "remove b": {0}}, succeeded: []string{"remove b"},
			at: time.Second, backingOff: []string{"add a"}, left: 1, retryOfAddA: 5 * time.Second},
		{name: "an action still failing is kept", failed: map[string][]time.Duration{"add a": {0, 5 * time.Minute, 10 * time.Minute}},
			at: 14 * time.Minute, left: 1, retryOfAddA: 10*time.Minute + 20*time.Second},
		{name: "an action not tried for 10 minutes is forgotten", failed: map[string][]time.Duration{"add a": {0}, "remove b": {9 * time.Minute}},
			at: 11 * time.Minute, left: 1},
		{name: "a deposed leader's failures go", failed: map[string][]time.Duration{"add a": {0}, "remove b": {time.Minute}},
			at: 12 * time.Minute, left: 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFailures()
			for key, ats := range tt.failed {
				for _, d := range ats {
					f.failed(key, boom, t0.Add(d))
				}
			}
			for _, key := range tt.succeeded {
				f.succeeded(key)
			}
			now := t0.Add(tt.at)
			off := f.backingOff(now)
			if len(off) != len(tt.backingOff) {
				t.Errorf("backing off %v, want %v", off, tt.backingOff)
			}
			for _, key := range tt.backingOff {
				if off[key] != "boom" {
					t.Errorf("backing off %v, want %s with its error", off, key)
				}
			}
			if tt.retryOfAddA != 0 {
				if got := f.m["add a"].retryAt(); !got.Equal(t0.Add(tt.retryOfAddA)) {
					t.Errorf("add a is retried at %s, want %s", got.Sub(t0), tt.retryOfAddA)
				}
			}
			if left := f.prune(now); left != tt.left || len(f.report()) != tt.left {
				t.Errorf("prune left %d (report %v), want %d", left, f.report(), tt.left)
			}
		})
	}
}

// An action that must wait, in the loop or in a procedure step, is
// counted as a wait, not an error.
func TestResult(t *testing.T) {
	tests := []struct {
		err  error
		want string
	}{
		{nil, "ok"},
		{errors.New("boom"), "error"},
		{fmt.Errorf("%w: learner catching up", procedure.ErrWait), "wait"},
		{fmt.Errorf("restore r1: %w: members starting", procedure.ErrWait), "wait"},
	}
	for _, tt := range tests {
		if got := result(tt.err); got != tt.want {
			t.Errorf("result(%v) = %q, want %q", tt.err, got, tt.want)
		}
	}
}

// The journal records no event for an action that must wait, nor for one
// refused because this agent no longer leads, by raft or the store lock.
func TestQuietError(t *testing.T) {
	tests := []struct {
		err  error
		want bool
	}{
		{errors.New("boom"), false},
		{fmt.Errorf("%w: learner catching up", procedure.ErrWait), true},
		{fmt.Errorf("x: %w", membership.ErrNotLeader), true},
		{fmt.Errorf("%w: %w: the lease ran out", procedure.ErrFenced, lease.ErrNotHeld), true},
	}
	for _, tt := range tests {
		if got := QuietError(tt.err); got != tt.want {
			t.Errorf("QuietError(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}
