package chaos

import (
	"fmt"

	"github.com/anishathalye/porcupine"
)

// The workload's operations on the contended keys, and the sequential
// model porcupine checks their history against: a register per key.

type opKind string

const (
	opGet opKind = "get"
	opPut opKind = "put"
	opCAS opKind = "cas" // a transaction: if value == Expect then put Value
)

type kvInput struct {
	Op     opKind
	Key    string
	Value  string // put, cas
	Expect string // cas
}

type kvOutput struct {
	Value string // get
	OK    bool   // cas: whether the compare held
	// Unknown marks a request that failed or timed out: it may or may not
	// have been applied, so its return time is the end of time.
	Unknown bool
}

// kvModel checks one round, whose keys all start at initial. The history
// is partitioned by key, so the state is one key's value.
func kvModel(initial string) porcupine.Model {
	return porcupine.Model{
		Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
			byKey := map[string][]porcupine.Operation{}
			var keys []string
			for _, op := range history {
				k := op.Input.(kvInput).Key
				if _, ok := byKey[k]; !ok {
					keys = append(keys, k)
				}
				byKey[k] = append(byKey[k], op)
			}
			out := make([][]porcupine.Operation, 0, len(keys))
			for _, k := range keys {
				out = append(out, byKey[k])
			}
			return out
		},
		Init: func() any { return initial },
		Step: func(state, input, output any) (bool, any) {
			s, in, out := state.(string), input.(kvInput), output.(kvOutput)
			switch in.Op {
			case opGet:
				return out.Value == s, s
			case opPut:
				return true, in.Value
			case opCAS:
				held := s == in.Expect
				if out.Unknown {
					if held {
						return true, in.Value
					}
					return true, s
				}
				if held != out.OK {
					return false, s
				}
				if held {
					return true, in.Value
				}
				return true, s
			}
			return false, s
		},
		DescribeOperation: func(input, output any) string {
			in, out := input.(kvInput), output.(kvOutput)
			res := ""
			switch {
			case out.Unknown:
				res = "?"
			case in.Op == opGet:
				res = out.Value
			case in.Op == opCAS:
				res = fmt.Sprint(out.OK)
			default:
				res = "ok"
			}
			switch in.Op {
			case opCAS:
				return fmt.Sprintf("cas(%s, %s -> %s) -> %s", in.Key, in.Expect, in.Value, res)
			case opPut:
				return fmt.Sprintf("put(%s, %s) -> %s", in.Key, in.Value, res)
			default:
				return fmt.Sprintf("get(%s) -> %s", in.Key, res)
			}
		},
	}
}
