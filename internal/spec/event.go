package spec

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"
)

// Event is one entry of the cluster's event history: an action that
// changed the cluster or failed, as the agent that took it recorded it.
// Failures of one action that repeat are collapsed into one event with a
// count.
type Event struct {
	Time time.Time `json:"time"`
	// Node is the ID of the agent that took the action.
	Node string `json:"node"`
	// Action is the action's kind and subject, as the agent logs it
	// ("add-member b", "backup periodic").
	Action string `json:"action"`
	// Outcome is EventOK or EventFailed.
	Outcome string `json:"outcome"`
	Message string `json:"message,omitempty"`
	// Count is how many times the action failed alike, from Since to
	// Time, when more than once.
	Count int       `json:"count,omitempty"`
	Since time.Time `json:"since,omitzero"`
}

// Outcomes of an event.
const (
	EventOK     = "ok"
	EventFailed = "failed"
)

// Bounds of an event, checked where it is written and where it is read.
const (
	MaxEventAction  = 256
	MaxEventMessage = 1024
	// MaxEventSize bounds the read of an event object.
	MaxEventSize = 4 << 10
)

// ErrBadEvent means an event object cannot be used.
var ErrBadEvent = errors.New("spec: invalid event")

// Clip shortens a text to at most n bytes, on a rune boundary, marking
// the cut.
func Clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// Validate checks an event's fields and bounds.
func (e Event) Validate() error {
	switch {
	case e.Time.IsZero():
		return fmt.Errorf("%w: no time", ErrBadEvent)
	case e.Node == "" || len(e.Node) > MaxEventAction:
		return fmt.Errorf("%w: node %s", ErrBadEvent, QuoteShort(e.Node))
	case e.Action == "" || len(e.Action) > MaxEventAction:
		return fmt.Errorf("%w: action %s", ErrBadEvent, QuoteShort(e.Action))
	case e.Outcome != EventOK && e.Outcome != EventFailed:
		return fmt.Errorf("%w: outcome %s", ErrBadEvent, QuoteShort(e.Outcome))
	case len(e.Message) > MaxEventMessage:
		return fmt.Errorf("%w: a message of %d bytes, over %d", ErrBadEvent, len(e.Message), MaxEventMessage)
	case e.Count < 0:
		return fmt.Errorf("%w: count %d", ErrBadEvent, e.Count)
	}
	return nil
}

// DecodeEvent reads and checks an event object.
func DecodeEvent(data []byte) (Event, error) {
	var e Event
	if len(data) > MaxEventSize {
		return e, fmt.Errorf("%w: %d bytes, over %d", ErrBadEvent, len(data), MaxEventSize)
	}
	if err := json.NewDecoder(bytes.NewReader(data)).Decode(&e); err != nil {
		return e, fmt.Errorf("%w: %w", ErrBadEvent, err)
	}
	return e, e.Validate()
}
