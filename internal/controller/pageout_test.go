package controller

import "testing"

func TestSpell(t *testing.T) {
	tests := []struct {
		name   string
		cycles []bool // busy or not, in turn
		want   []int  // the cycles (0-based) that end a spell
	}{
		{name: "start-up is a spell", cycles: []bool{false, false, false, false, false}, want: []int{2}},
		{name: "busy start, then quiet", cycles: []bool{true, true, false, false, false, false}, want: []int{4}},
		{name: "a busy cycle starts the count again", cycles: []bool{false, false, true, false, false, false}, want: []int{5}},
		{name: "each spell ends once", cycles: []bool{false, false, false, true, false, false, false, false}, want: []int{2, 6}},
		{name: "never quiet long enough", cycles: []bool{true, false, false, true, false, false, true}, want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s spell
			var got []int
			for i, busy := range tt.cycles {
				if s.cycle(busy) {
					got = append(got, i)
				}
			}
			if len(got) != len(tt.want) {
				t.Fatalf("spells ended at cycles %v, want %v", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Fatalf("spells ended at cycles %v, want %v", got, tt.want)
				}
			}
		})
	}
}
