package agent

import (
	"testing"
	"time"
)

// transfers shows the newest download begun while it runs, with its
// bytes done, and none once it ends; an older one's end leaves the newer.
func TestTransfers(t *testing.T) {
	at := time.Date(2026, 12, 4, 1, 0, 0, 0, time.UTC)
	tr := &transfers{now: func() time.Time { return at }}
	if tr.Current() != nil {
		t.Fatal("a transfer before any began")
	}
	addA, endA := tr.Begin("fetch a", 100)
	addA(40)
	addB, endB := tr.Begin("fetch b", 0)
	addB(7)
	addA(10)
	if c := tr.Current(); c == nil || c.What != "fetch b" || c.Done != 7 || c.Total != 0 || c.Started != 1796346000000000000 {
		t.Errorf("current = %+v, want fetch b at 7 bytes", c)
	}
	endA()
	if c := tr.Current(); c == nil || c.What != "fetch b" {
		t.Errorf("after the older one ended: %+v", c)
	}
	endB()
	if c := tr.Current(); c != nil {
		t.Errorf("after both ended: %+v", c)
	}
	var none *transfers
	add, end := none.Begin("x", 1)
	add(1)
	end()
	if none.Current() != nil {
		t.Error("a nil follower shows a transfer")
	}
}
