package chaos

import (
	"math"
	"testing"

	"github.com/anishathalye/porcupine"
)

// The model itself must tell a linearizable history from one that is not,
// or the chaos suite could pass whatever happened.
func TestModel(t *testing.T) {
	op := func(client int, in kvInput, call, ret int64, out kvOutput) porcupine.Operation {
		return porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret}
	}
	put := func(v string) kvInput { return kvInput{Op: opPut, Key: "k", Value: v} }
	get := kvInput{Op: opGet, Key: "k"}
	never := int64(math.MaxInt64)
	tests := []struct {
		name    string
		history []porcupine.Operation
		want    bool
	}{
		{"a read after a write sees it", []porcupine.Operation{
			op(0, put("a"), 0, 10, kvOutput{}), op(1, get, 20, 30, kvOutput{Value: "a"})}, true},
		{"a stale read after an acknowledged write", []porcupine.Operation{
			op(0, put("a"), 0, 10, kvOutput{}), op(1, get, 20, 30, kvOutput{Value: "init"})}, false},
		{"a failed write may have happened", []porcupine.Operation{
			op(0, put("a"), 0, never, kvOutput{Unknown: true}), op(1, get, 20, 30, kvOutput{Value: "a"})}, true},
		{"a failed write may not have happened", []porcupine.Operation{
			op(0, put("a"), 0, never, kvOutput{Unknown: true}), op(1, get, 20, 30, kvOutput{Value: "init"})}, true},
		{"a value nobody wrote", []porcupine.Operation{op(1, get, 20, 30, kvOutput{Value: "b"})}, false},
		{"a compare-and-swap that held must be reported so", []porcupine.Operation{
			op(0, kvInput{Op: opCAS, Key: "k", Expect: "init", Value: "c"}, 0, 10, kvOutput{OK: false})}, false},
		{"a compare-and-swap that held", []porcupine.Operation{
			op(0, kvInput{Op: opCAS, Key: "k", Expect: "init", Value: "c"}, 0, 10, kvOutput{OK: true}),
			op(1, get, 20, 30, kvOutput{Value: "c"})}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := porcupine.CheckOperations(kvModel("init"), tt.history); got != tt.want {
				t.Fatalf("linearizable = %v, want %v", got, tt.want)
			}
		})
	}
}
